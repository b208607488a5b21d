import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { heading, latencyLine, percentile } from './stats.ts';

// The cost of the sandbox's isolation (all namespaces entered, tmpfs mounts, cgroup) on the two
// paths it touches: a sandbox's create + first command + close, and a bash round trip over HTTP.
// With ROLLSERVE_BASELINE=<another checkout, built> the same is measured there, interleaved in this
// run, and the ratio printed:
//   git worktree add /tmp/rs-base 892c5cf && (cd /tmp/rs-base && pnpm install --offline && pnpm build)
//   ROLLSERVE_BASELINE=/tmp/rs-base pnpm bench isolation

const here = resolve(import.meta.dirname, '../..');

/** A checkout's `@rollserve/core/<door>` source: its package's exports door, or a room's index in checkouts from before the doors. */
async function importDoor(root: string, door: string): Promise<unknown> {
  const exported = join(root, `packages/core/src/exports/${door}.ts`);
  return import(existsSync(exported) ? exported : join(root, `packages/core/src/${door}/index.ts`));
}

async function lifecycle(root: string, n: number): Promise<number[]> {
  const { createBwrapProvider } = (await importDoor(root, 'sandbox')) as any;
  const provider = createBwrapProvider();
  const times: number[] = [];
  for (let i = 0; i < n + 20; i++) {
    const started = performance.now();
    const sandbox = await provider.create();
    const result = await sandbox.exec('echo hi');
    if (result.stdout !== 'hi\n') throw new Error(`exec: ${JSON.stringify(result)}`);
    await sandbox.close();
    if (i >= 20) times.push(performance.now() - started);
  }
  return times;
}

async function bashOverHttp(root: string, n: number): Promise<number[]> {
  const core = (await import(join(root, 'packages/core/src/index.ts'))) as any;
  const gym = (await importDoor(root, 'gym')) as any;
  const { measureToolOverHttp } = (await import(join(root, 'test/bench/tools.ts'))) as any;
  const { z } = (await import(join(root, 'packages/core/node_modules/zod/index.js'))) as any;
  const env = core.defineEnvironment({ name: 'bench_isolation', domain: 'other', row: z.object({}), tools: { bash: core.bashTool }, verify: () => ({ reward: 0 }) });
  const app = gym.createResourcesServer(env, {});
  const server = await gym.serveFetch(app, { port: 0 });
  try {
    return await measureToolOverHttp(server.url, 'bash', { command: 'echo hi' }, n);
  } finally {
    await server.close();
    await app.close();
  }
}

export default async function bench(): Promise<void> {
  heading('isolation: sandbox lifecycle and bash round trip, against a baseline checkout when given');
  const baseline = process.env.ROLLSERVE_BASELINE;
  const roots = baseline === undefined ? [here] : [baseline, here];
  const results = new Map<string, { lifecycle: number[]; http: number[] }>(roots.map((root) => [root, { lifecycle: [], http: [] }]));
  // interleaved rounds, so that a change in the machine's load falls on both alike
  for (let round = 0; round < 3; round++) {
    for (const root of roots) {
      const entry = results.get(root)!;
      entry.lifecycle.push(...(await lifecycle(root, 60)));
      entry.http.push(...(await bashOverHttp(root, 500)));
    }
  }
  for (const root of roots) {
    const { lifecycle: l, http } = results.get(root)!;
    console.log(`${root === here ? 'this tree' : `baseline ${root}`}`);
    console.log(`  bwrap create + first command + close  ${latencyLine(l)}`);
    console.log(`  bash tool over HTTP                   ${latencyLine(http)}`);
  }
  if (baseline !== undefined) {
    const ratio = (key: 'lifecycle' | 'http') => percentile(results.get(here)![key], 50) / percentile(results.get(baseline)![key], 50);
    console.log(`ratio this/baseline (p50): lifecycle ${ratio('lifecycle').toFixed(3)}, bash over HTTP ${ratio('http').toFixed(3)}  (target ≤ 1.20 each)`);
  } else {
    console.log('no ROLLSERVE_BASELINE: set it to a built checkout of 892c5cf to print the ratio (target ≤ 1.20)');
  }
}
