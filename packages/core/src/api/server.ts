import type { Logger } from 'pino';
import { assertBindAllowed } from '../server/bind-policy.ts';
import { serveFetch, type RunningServer } from '../server/serve.ts';
import type { Environment } from '../spec/environment.ts';
import { createRolloutApi } from './index.ts';
import { LlmBackendPool } from '../llm/index.ts';
import { PoolModelProvider } from '../runner/model-provider.ts';
import { RolloutService, type RolloutServiceOptions, type StageName } from '../service/service.ts';

export interface RolloutServerOptions {
  environments: ReadonlyArray<Environment<any, any, any>>;
  environmentConfigs?: Record<string, Record<string, unknown>>;
  /** @default '127.0.0.1' */
  host?: string;
  /** @default 0 (any free port) */
  port?: number;
  /** Bearer token required on the API. */
  token?: string;
  /** Bearer token of the rollout-node routes, kept apart from `token` (see RolloutApiOptions.nodeToken). */
  nodeToken?: string;
  /** Serve a non-loopback host without a token anyway; refused otherwise. */
  allowNoToken?: boolean;
  /** OpenAI-compatible base URLs of the policy's inference servers (more can be added at run time). */
  llmBackends?: readonly string[];
  /** The model name `/process` uses when a request names none. */
  defaultModel?: string;
  /** The store (object or URL) and its options: see RolloutServiceOptions. */
  store?: RolloutServiceOptions['store'];
  importJournal?: string;
  retention?: RolloutServiceOptions['retention'];
  runLocally?: RolloutServiceOptions['runLocally'];
  leaseMs?: number;
  heartbeatMs?: number;
  nodeTimeoutMs?: number;
  nodeRetentionMs?: number;
  pools?: Partial<Record<StageName, number>>;
  /** Hand rollout nodes routes to the backends (nodes that can then send their policy turns there themselves). @default true */
  directBackends?: boolean;
  logger?: Logger;
  /**
   * The largest request body the API reads, in bytes (4 times as much for a node's results): a
   * larger one is a 413, refused before it is read whole. @default 64 MiB
   */
  maxBodyBytes?: number;
  /** Silence after which a result stream sends a keep-alive. @default 15 s */
  streamKeepAliveMs?: number;
}

export interface RolloutServer {
  readonly url: string;
  readonly service: RolloutService;
  readonly backends: LlmBackendPool;
  readonly running: RunningServer;
  close(): Promise<void>;
}

/** The rollout service on HTTP: the engine, its API and its LLM backend pool. */
export async function startRolloutServer(options: RolloutServerOptions): Promise<RolloutServer> {
  const host = options.host ?? '127.0.0.1';
  assertBindAllowed({ host, token: options.token || undefined, allowNoToken: options.allowNoToken });
  const backends = new LlmBackendPool();
  for (const url of options.llmBackends ?? []) backends.add({ baseUrl: url });
  const models = new PoolModelProvider(backends);
  const service = await RolloutService.create({
    environments: options.environments,
    models,
    ...(options.environmentConfigs ? { environmentConfigs: options.environmentConfigs } : {}),
    ...(options.store !== undefined ? { store: options.store } : {}),
    ...(options.importJournal !== undefined ? { importJournal: options.importJournal } : {}),
    ...(options.retention !== undefined ? { retention: options.retention } : {}),
    ...(options.runLocally !== undefined ? { runLocally: options.runLocally } : {}),
    ...(options.leaseMs !== undefined ? { leaseMs: options.leaseMs } : {}),
    ...(options.heartbeatMs !== undefined ? { heartbeatMs: options.heartbeatMs } : {}),
    ...(options.nodeTimeoutMs !== undefined ? { nodeTimeoutMs: options.nodeTimeoutMs } : {}),
    ...(options.nodeRetentionMs !== undefined ? { nodeRetentionMs: options.nodeRetentionMs } : {}),
    ...(options.pools ? { pools: options.pools } : {}),
    ...(options.directBackends !== undefined ? { directBackends: options.directBackends } : {}),
    ...(options.logger ? { logger: options.logger } : {}),
  });
  const app = createRolloutApi(service, {
    backends,
    ...(options.token ? { token: options.token } : {}),
    ...(options.nodeToken ? { nodeToken: options.nodeToken } : {}),
    ...(options.defaultModel ? { defaultModel: options.defaultModel } : {}),
    ...(options.maxBodyBytes !== undefined ? { maxBodyBytes: options.maxBodyBytes } : {}),
    ...(options.streamKeepAliveMs !== undefined ? { streamKeepAliveMs: options.streamKeepAliveMs } : {}),
  });
  const running = await serveFetch(app, { host, port: options.port ?? 0 });
  return {
    url: running.url,
    service,
    backends,
    running,
    close: async () => {
      await running.close();
      await service.close();
      await models.close();
    },
  };
}
