import { pino, type Logger } from 'pino';
import { assertBindAllowed } from '../server/bind-policy.ts';
import { serveFetch, type RunningServer } from '../server/serve.ts';
import type { Environment } from '../spec/environment.ts';
import { createRolloutApi } from './index.ts';
import { LlmBackendPool } from '../llm/index.ts';
import { PoolModelProvider } from '../runner/model-provider.ts';
import { RunnerEnvironments } from '../runner/environments.ts';
import type { EnvironmentSetups } from '../runner/runner.ts';
import { RolloutService, type RolloutServiceOptions, type StageName } from '../service/service.ts';
import { warmUp, type WarmUpOptions, type WarmUpReport } from './warm-up.ts';

export type { WarmUpOptions, WarmUpReport } from './warm-up.ts';

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
  /**
   * Rollouts run before the service listens, through two twins of it, one after the other (its
   * HTTP API on loopback, throwaway SQLite stores, the environments' `setup`s then kept by the
   * service, its logger silenced, a stand-in policy on loopback): the JIT work and the worker pools' start that a fresh service otherwise
   * pays during its first thousands of rollouts. Touches neither the store nor the LLM backends.
   * @default none
   */
  warmUp?: WarmUpOptions;
  /** What the environments' `setup`s returned, when another runner of this process shares them (see RolloutRunnerOptions). */
  environmentSetups?: EnvironmentSetups;
  /** Whether closing the service closes the environments. @default true */
  closeEnvironments?: boolean;
}

export interface RolloutServer {
  readonly url: string;
  readonly service: RolloutService;
  readonly backends: LlmBackendPool;
  readonly running: RunningServer;
  /** What the start-up warm-up did (when `warmUp` was given). */
  readonly warmUp?: WarmUpReport;
  close(): Promise<void>;
}

/** The rollout service on HTTP: the engine, its API and its LLM backend pool. */
export async function startRolloutServer(options: RolloutServerOptions): Promise<RolloutServer> {
  const host = options.host ?? '127.0.0.1';
  assertBindAllowed({ host, token: options.token || undefined, allowNoToken: options.allowNoToken });
  const environmentSetups = options.environmentSetups ?? new Map<string, Promise<unknown>>();
  let warmed: WarmUpReport | undefined;
  let warmUpFailed: unknown;
  // With a warm-up, the service's own logger (when it is not given one) is made here and lent,
  // silenced, to the twins: a rollout's logger is a child of it (Object.create of the logger, a
  // hidden class per parent), and children of another logger deoptimized the code the warm-up
  // compiled. A level set twice before the warm-up: V8 then holds the logger's methods as fields
  // that change (setting the level back after it invalidates nothing).
  let logger = options.logger;
  if (options.warmUp && options.warmUp.rollouts > 0) {
    const level = process.env.ROLLSERVE_LOG_LEVEL ?? 'info';
    const lent = logger === undefined ? (logger = pino({ name: 'rollserve', level })) : pino({ name: 'rollserve', level: 'silent' });
    lent.level = 'silent';
    try {
      // The twins take the service's own options, but for what must not reach the user's store,
      // backends, journal or network (each is given one of its own instead): the objects the
      // service builds from them then have the hidden classes the twins' had (a twin given fewer
      // options built leaner ones, and the code compiled on them was deoptimized by the service's:
      // 'wrong map'), and the same branches run (runsLocally's 'auto' path, retention).
      const { host: _host, port: _port, token: _token, nodeToken: _nodeToken, allowNoToken: _allow, warmUp: _warmUp, importJournal: _journal, ...same } = options;
      warmed = await warmUp(options.warmUp, ({ store, llm, journal }) =>
        startRolloutServer({
          ...same,
          store,
          ...(options.importJournal !== undefined ? { importJournal: journal } : {}),
          llmBackends: [llm],
          runLocally: options.runLocally === 'never' ? 'always' : options.runLocally,
          logger: lent,
          environmentSetups,
          closeEnvironments: false,
        }),
      );
    } catch (error) {
      // A warm-up is worth its start time only: the service starts without it (and owns, and
      // closes, whatever setups it started).
      warmUpFailed = error;
    }
    if (lent === logger) lent.level = level;
  }
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
    ...(logger ? { logger } : {}),
    environmentSetups,
    ...(options.closeEnvironments !== undefined ? { closeEnvironments: options.closeEnvironments } : {}),
  }).catch(async (error: unknown) => {
    // the setups the warm-up started (worker pools) are closed here, as the service would have
    if (options.closeEnvironments !== false) await new RunnerEnvironments(options.environments, options.environmentConfigs, undefined, { setups: environmentSetups }).close();
    throw error;
  });
  if (warmUpFailed !== undefined) service.logger.warn({ err: warmUpFailed }, 'the start-up warm-up failed: serving without it');
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
    ...(warmed ? { warmUp: warmed } : {}),
    close: async () => {
      await running.close();
      await service.close();
      await models.close();
    },
  };
}
