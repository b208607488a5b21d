import { pino } from 'pino';
import type { Environment } from '../spec/environment.ts';
import { assertBindAllowed, isLoopbackHost } from '../server/bind-policy.ts';
import { readNemoGymInstance } from './nemo-gym-config.ts';
import { createResourcesServer } from './resources-server.ts';
import { serveFetch, type RunningServer } from '../server/serve.ts';

export interface LaunchedServer {
  readonly name: string;
  readonly running: RunningServer;
  close(): Promise<void>;
}

export interface StartResourcesServerOptions {
  /** @default '127.0.0.1' */
  host?: string;
  /** @default 0 (any free port) */
  port?: number;
  instanceName?: string;
  config?: Record<string, unknown>;
  /** Required as `Authorization: Bearer <token>` on every route but `GET /` when set. */
  token?: string;
  /** Serve a non-loopback host without a token anyway; refused otherwise. */
  allowNoToken?: boolean;
  /** The largest request body read, in bytes (a larger one is a 413). @default 64 MiB */
  maxBodyBytes?: number;
}

/** Starts one environment's resources server and returns a handle that stops it. */
export async function startResourcesServer(env: Environment, options: StartResourcesServerOptions = {}): Promise<LaunchedServer> {
  const name = options.instanceName ?? env.name;
  const host = options.host ?? '127.0.0.1';
  assertBindAllowed({ host, token: options.token, allowNoToken: options.allowNoToken });
  const logger = pino({ name, level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
  const app = createResourcesServer(env, {
    instanceName: name,
    logger,
    ...(options.config ? { config: options.config } : {}),
    ...(options.token !== undefined ? { token: options.token } : {}),
    ...(options.maxBodyBytes !== undefined ? { maxBodyBytes: options.maxBodyBytes } : {}),
  });
  const running = await serveFetch(app, { host, port: options.port ?? 0 });
  return {
    name,
    running,
    close: async () => {
      await running.close();
      await app.close();
    },
  };
}

/**
 * Ends the process promptly on SIGINT or SIGTERM: NeMo Gym's CLI waits 1 s, then kills
 * (CONTRACT.md §1.10). Closing gets 800 ms; after that the process exits regardless.
 */
export function exitOnSignals(close: () => Promise<void>): void {
  let closing = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (closing) return;
    closing = true;
    const deadline = setTimeout(() => process.exit(0), 800);
    deadline.unref();
    close().then(
      () => process.exit(0),
      (error: unknown) => {
        console.error(`error while stopping on ${signal}:`, error);
        process.exit(1);
      },
    );
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
}

/**
 * What a NeMo Gym launcher runs (through the package's `nemo-gym/app.py`): read the instance from
 * NEMO_GYM_CONFIG_DICT / NEMO_GYM_CONFIG_PATH, exit 0 on `dry_run`, otherwise bind its host:port
 * and serve until SIGINT or SIGTERM.
 *
 * No token here: NeMo Gym's clients send none, and its configs bind 0.0.0.0 or a cluster address
 * routinely, as its Python servers do. A non-loopback address is served with a warning.
 */
export async function launchFromNemoGym(
  env: Environment,
  processEnv: NodeJS.ProcessEnv = process.env,
  options: { maxBodyBytes?: number } = {},
): Promise<LaunchedServer | undefined> {
  const instance = readNemoGymInstance(processEnv);
  if (instance.dryRun) return undefined;
  if (!isLoopbackHost(instance.host)) {
    console.error(
      `(${instance.name}) warning: serving ${instance.host} without a token, as NeMo Gym's servers do; ` +
        'anyone who can reach the port can call its tools',
    );
  }
  const server = await startResourcesServer(env, {
    host: instance.host,
    port: instance.port,
    instanceName: instance.name,
    config: instance.config,
    allowNoToken: true,
    ...(options.maxBodyBytes !== undefined ? { maxBodyBytes: options.maxBodyBytes } : {}),
  });
  exitOnSignals(() => server.close());
  console.log(`(${instance.name}) serving ${env.name} on ${server.running.url}`);
  return server;
}
