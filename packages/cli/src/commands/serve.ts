import { defineCommand } from 'citty';
import { exitOnSignals, loadEnvironment, startResourcesServer, type LaunchedServer } from '@rollserve/core/gym';
import { resolveEnvironments, type InstalledEnvironment } from '../discover.ts';
import { applyImageFlags, bodyArgs, hostArg, imageArgs, serveAccess, tokenArgs, type ServeAccess } from '../flags.ts';
import { sweepStaleSandboxes } from '../sweep.ts';

/** Anything `serveAll` stops on a signal: its resources servers, and the rollout service of `start`. */
interface Closable {
  close(): Promise<void>;
}

export async function serveAll(envs: InstalledEnvironment[], access: ServeAccess, basePort: number, servers: Array<LaunchedServer | Closable> = []): Promise<void> {
  exitOnSignals(async () => {
    await Promise.all(servers.map((server) => server.close()));
  });
  await sweepStaleSandboxes();
  for (const [index, installed] of envs.entries()) {
    const env = await loadEnvironment(installed.dir);
    const server = await startResourcesServer(env, {
      host: access.host,
      port: basePort === 0 ? 0 : basePort + index,
      allowNoToken: access.allowNoToken,
      ...(access.token ? { token: access.token } : {}),
      ...(access.maxBodyBytes !== undefined ? { maxBodyBytes: access.maxBodyBytes } : {}),
    });
    servers.push(server);
    console.log(`${env.name.padEnd(12)} ${server.running.url}   (NeMo Gym resources server)`);
  }
}

export default defineCommand({
  meta: { name: 'serve', description: 'Run environments standalone, one NeMo Gym resources server each' },
  args: {
    env: { type: 'positional', description: 'Environment names (see `rollserve list`)', required: true },
    host: hostArg,
    port: { type: 'string', description: 'Port of the first server; the next ones count up. 0: any free port', default: '0' },
    ...tokenArgs,
    ...bodyArgs,
    ...imageArgs,
  },
  async run({ args }) {
    applyImageFlags(args);
    const access = serveAccess(args);
    const names = args._.length > 0 ? args._ : [args.env];
    await serveAll(resolveEnvironments(names), access, Number(args.port));
  },
});
