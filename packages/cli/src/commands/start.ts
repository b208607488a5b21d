import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { defineCommand } from 'citty';
import { RolloutError } from '@rollserve/core';
import { loadEnvironment } from '@rollserve/core/gym';
import { startRolloutServer } from '@rollserve/core/service';
import { listInstalledEnvironments, type InstalledEnvironment } from '../discover.ts';
import { applyImageFlags, bodyArgs, hostArg, imageArgs, listFlag, numberFlag, serveAccess, tokenArgs } from '../flags.ts';
import { serveAll } from './serve.ts';

function runLocallyFlag(value: string): 'auto' | 'always' | 'never' {
  if (value === 'auto' || value === 'always' || value === 'never') return value;
  throw new RolloutError({ code: 'BAD_REQUEST', message: `--run-locally is auto, always or never, not "${value}"` });
}

function retentionOf(args: { 'keep-results'?: string | undefined; 'keep-hours'?: string | undefined }): { retention?: { keepLast?: number; maxAgeMs?: number } } {
  const keepLast = numberFlag('keep-results', args['keep-results'], { integer: true, min: 1 });
  const hours = numberFlag('keep-hours', args['keep-hours'], { min: 0 });
  if (keepLast === undefined && hours === undefined) return {};
  return { retention: { ...(keepLast !== undefined ? { keepLast } : {}), ...(hours !== undefined ? { maxAgeMs: hours * 3_600_000 } : {}) } };
}

/**
 * Rollouts of the start-up warm-up when neither `--warm-up` nor ROLLSERVE_WARM_UP says otherwise.
 * 2,000: on a nearly idle host (`pnpm bench cold-start`, two runs of five fresh services each way,
 * back to back) the first 1,000 ran at 0.91-0.92x the same service's warm rate (1,000: 0.76-0.83),
 * for about 1.5 s more before listening (5.1-7.1 s against 3.7-6.2).
 */
const DEFAULT_WARM_UP = 2_000;

/**
 * The warm-up's rows: the `data/warm-up.jsonl` of each environment that ships one (rows cheap to
 * verify, as the environment's author chose them); when none does, each environment's
 * `data/example.jsonl`. Environments that declare a sandbox are left out (a warm-up that starts
 * sandboxes would cost more than it pre-pays).
 */
function warmUpRows(installed: InstalledEnvironment[], environments: ReadonlyArray<{ name: string; sandbox?: unknown }>): Record<string, Array<Record<string, unknown>>> {
  const read = (name: string) => {
    const rows: Record<string, Array<Record<string, unknown>>> = {};
    for (const [i, env] of environments.entries()) {
      const file = join(installed[i]!.dir, 'data', name);
      if (env.sandbox !== undefined || !existsSync(file)) continue;
      rows[env.name] = readFileSync(file, 'utf8').split('\n').filter((line) => line.trim()).map((line) => JSON.parse(line) as Record<string, unknown>);
    }
    return rows;
  };
  const chosen = read('warm-up.jsonl');
  return Object.keys(chosen).length > 0 ? chosen : read('example.jsonl');
}

export default defineCommand({
  meta: { name: 'start', description: 'The main job: the rollout service, and every installed environment as a NeMo Gym resources server' },
  args: {
    host: hostArg,
    port: { type: 'string', description: 'Port of the rollout service; the environments take the next ones', default: '8100' },
    llm: { type: 'string', description: 'Policy inference servers (OpenAI base URLs, comma-separated; also ROLLSERVE_LLM_BACKENDS)' },
    model: { type: 'string', description: 'Model name for requests that name none (ProRL-style /process)' },
    store: { type: 'string', description: 'Where tasks and results are kept: sqlite:///path.db or postgres://… (also ROLLSERVE_STORE; default sqlite://.rollserve/store.db)' },
    journal: { type: 'string', description: 'A JSONL journal of rollserve before the store, imported once if the file exists', default: '.rollserve/journal.jsonl' },
    'keep-results': { type: 'string', description: 'Keep only the newest N results in the store' },
    'keep-hours': { type: 'string', description: 'Forget results stored more than this many hours ago' },
    'run-locally': { type: 'string', description: 'Run rollouts in this process: auto (while no rollout node takes work: claims it, or is full), always or never', default: 'auto' },
    'lease-s': { type: 'string', description: 'Lease of a rollout node on its work, renewed by heartbeats', default: '30' },
    'node-timeout-s': { type: 'string', description: 'A node silent this long is lost and its work re-issued', default: '10' },
    'node-retention-s': { type: 'string', description: 'A node that left or was lost is listed this long after it was last heard from', default: '3600' },
    'proxy-node-turns': { type: 'boolean', description: 'Rollout nodes send their policy turns through this service, not to the backends themselves (for compute hosts that cannot reach the policy servers)', default: false },
    'node-token': { type: 'string', description: 'Bearer token of the rollout-node routes instead of --token, which they then refuse (as every other route refuses this one; also ROLLSERVE_NODE_TOKEN)' },
    'warm-up': {
      type: 'string',
      description: `Rollouts run before the service listens, on a throwaway store with a stand-in policy, so that it serves warm from its first rollout; 0: off (also ROLLSERVE_WARM_UP; default ${DEFAULT_WARM_UP})`,
    },
    ...tokenArgs,
    ...bodyArgs,
    ...imageArgs,
  },
  async run({ args }) {
    applyImageFlags(args);
    const access = serveAccess(args);
    const installed = listInstalledEnvironments();
    if (installed.length === 0) throw new Error('no environments installed');
    const environments = await Promise.all(installed.map((env) => loadEnvironment(env.dir)));
    const port = Number(args.port);
    const nodeToken = (args['node-token'] ?? process.env.ROLLSERVE_NODE_TOKEN) || undefined;
    const warmUp = numberFlag('warm-up', args['warm-up'] ?? process.env.ROLLSERVE_WARM_UP, { integer: true, min: 0 }) ?? DEFAULT_WARM_UP;
    const server = await startRolloutServer({
      environments,
      host: access.host,
      port,
      llmBackends: listFlag(args.llm ?? process.env.ROLLSERVE_LLM_BACKENDS),
      store: args.store ?? process.env.ROLLSERVE_STORE ?? 'sqlite://.rollserve/store.db',
      importJournal: args.journal,
      ...retentionOf(args),
      runLocally: runLocallyFlag(args['run-locally']),
      leaseMs: numberFlag('lease-s', args['lease-s'], { min: 1 })! * 1000,
      nodeTimeoutMs: numberFlag('node-timeout-s', args['node-timeout-s'], { min: 1 })! * 1000,
      nodeRetentionMs: numberFlag('node-retention-s', args['node-retention-s'], { min: 0 })! * 1000,
      allowNoToken: access.allowNoToken,
      ...(access.token ? { token: access.token } : {}),
      ...(nodeToken ? { nodeToken } : {}),
      ...(args['proxy-node-turns'] ? { directBackends: false } : {}),
      ...(args.model ? { defaultModel: args.model } : {}),
      ...(access.maxBodyBytes !== undefined ? { maxBodyBytes: access.maxBodyBytes } : {}),
      ...(warmUp > 0 ? { warmUp: { rollouts: warmUp, rows: warmUpRows(installed, environments) } } : {}),
    });
    if (server.warmUp) console.log(`${'warm-up'.padEnd(12)} ${server.warmUp.rollouts} rollouts in ${(server.warmUp.ms / 1000).toFixed(1)} s before listening (--warm-up 0: off)`);
    console.log(`${'rollouts'.padEnd(12)} ${server.url}   (rollout service: POST /v1/rollouts, GET /v1/status, /metrics)`);
    await serveAll(installed, access, port === 0 ? 0 : port + 1, [server]);
  },
});
