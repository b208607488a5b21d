import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { stringify } from 'yaml';
import { defineCommand, runMain } from 'citty';
import { pino } from 'pino';
import { assertBindAllowed } from '../server/bind-policy.ts';
import { exitOnSignals, launchFromNemoGym, startResourcesServer, type LaunchedServer } from '../gym/launch.ts';
import { RolloutError } from '../errors.ts';
import { LlmBackendPool } from '../llm/index.ts';
import { PoolModelProvider } from '../runner/model-provider.ts';
import { removeStaleSandboxDirs, sweepOrphanedSandboxDirs } from '../sandbox/staging.ts';
import { startRolloutServer, type RolloutServer } from '../api/server.ts';
import { startRolloutNode, type RolloutNode } from '../node/agent.ts';
import { RolloutService } from '../service/service.ts';
import { checkArgv, type CheckedCommand } from './argv-check.ts';
import { DEMO_MODEL, prepareDemo, resultLine, summaryTable } from './demo.ts';
import { collectRollouts, sidecarPaths, type CollectSummary } from './collect.ts';
import { httpRunner, inProcessRunner } from './rollout-runner.ts';
import { nemoGymConfig } from './gym-config.ts';
import { scaffoldEnvironment } from './scaffold.ts';
import { listInstalledEnvironments, loadEnvironment, resolveEnvironments, type InstalledEnvironment } from './discover.ts';

const { version } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };

/**
 * Sandbox directories left by a service or node that was killed (its processes died with it): at
 * start, then those whose maker is gone every 30 s (another node of this host killed meanwhile).
 */
async function sweepStaleSandboxes(): Promise<void> {
  const removed = await removeStaleSandboxDirs();
  if (removed.length > 0) console.error(`removed ${removed.length} sandbox directories left by a stopped service`);
  orphanSweep ??= sweepOrphanedSandboxDirs();
}
let orphanSweep: (() => void) | undefined;

interface ServeAccess {
  host: string;
  token: string | undefined;
  allowNoToken: boolean;
  /** The largest request body a server reads (`--max-body-mib`). */
  maxBodyBytes?: number;
}

async function serveAll(envs: InstalledEnvironment[], access: ServeAccess, basePort: number, servers: Array<LaunchedServer | RolloutServer> = []): Promise<void> {
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

const hostArg = { type: 'string', description: 'Address to bind', default: '127.0.0.1' } as const;
const tokenArgs = {
  token: { type: 'string', description: 'Bearer token every server requires (also ROLLSERVE_TOKEN)' },
  'allow-no-token': {
    type: 'boolean',
    description: 'Serve a non-loopback --host without a token (also ROLLSERVE_ALLOW_NO_TOKEN=1)',
    default: false,
  },
} as const;
const bodyArgs = {
  'max-body-mib': {
    type: 'string',
    description: 'Largest request body read, MiB: a larger one is a 413 before it is read (a node\'s results: 4 times as much; also ROLLSERVE_MAX_BODY_MIB)',
    default: '64',
  },
} as const;

/** The token and bind policy from the flags and the environment, checked before anything starts. */
function serveAccess(args: { host: string; token?: string | undefined; 'allow-no-token'?: boolean; 'max-body-mib'?: string | undefined }): ServeAccess {
  const access = {
    host: args.host,
    token: (args.token ?? process.env.ROLLSERVE_TOKEN) || undefined,
    allowNoToken: args['allow-no-token'] === true || process.env.ROLLSERVE_ALLOW_NO_TOKEN === '1',
    ...maxBodyOf(args['max-body-mib']),
  };
  assertBindAllowed(access);
  return access;
}

/** `--max-body-mib` (its default yields to ROLLSERVE_MAX_BODY_MIB), in bytes. */
function maxBodyOf(flag: string | undefined): { maxBodyBytes?: number } {
  const given = process.argv.some((arg) => arg === '--max-body-mib' || arg.startsWith('--max-body-mib='));
  const value = given ? flag : (process.env.ROLLSERVE_MAX_BODY_MIB ?? flag);
  const mib = numberFlag('max-body-mib', value, { min: 1 / 1024 });
  return mib === undefined ? {} : { maxBodyBytes: Math.floor(mib * 1024 * 1024) };
}

const serve = defineCommand({
  meta: { name: 'serve', description: 'Run environments standalone, one NeMo Gym resources server each' },
  args: {
    env: { type: 'positional', description: 'Environment names (see `rollserve list`)', required: true },
    host: hostArg,
    port: { type: 'string', description: 'Port of the first server; the next ones count up. 0: any free port', default: '0' },
    ...tokenArgs,
    ...bodyArgs,
  },
  async run({ args }) {
    const access = serveAccess(args);
    const names = args._.length > 0 ? args._ : [args.env];
    await serveAll(resolveEnvironments(names), access, Number(args.port));
  },
});

const list = defineCommand({
  meta: { name: 'list', description: 'Show the installed environments' },
  run() {
    const installed = listInstalledEnvironments();
    if (installed.length === 0) console.log('no environments installed');
    for (const env of installed) console.log(`${env.name.padEnd(12)} ${env.packageName.padEnd(24)} ${env.description ?? ''}`);
  },
});

const list_ = (value: string | undefined) => (value ?? '').split(',').map((s) => s.trim()).filter(Boolean);

const start = defineCommand({
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
    'node-token': { type: 'string', description: 'Bearer token of the rollout-node routes instead of --token, which they then refuse (as every other route refuses this one; also ROLLSERVE_NODE_TOKEN)' },
    ...tokenArgs,
    ...bodyArgs,
  },
  async run({ args }) {
    const access = serveAccess(args);
    const installed = listInstalledEnvironments();
    if (installed.length === 0) throw new Error('no environments installed');
    const environments = await Promise.all(installed.map((env) => loadEnvironment(env.dir)));
    const port = Number(args.port);
    const nodeToken = (args['node-token'] ?? process.env.ROLLSERVE_NODE_TOKEN) || undefined;
    const server = await startRolloutServer({
      environments,
      host: access.host,
      port,
      llmBackends: list_(args.llm ?? process.env.ROLLSERVE_LLM_BACKENDS),
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
      ...(args.model ? { defaultModel: args.model } : {}),
      ...(access.maxBodyBytes !== undefined ? { maxBodyBytes: access.maxBodyBytes } : {}),
    });
    console.log(`${'rollouts'.padEnd(12)} ${server.url}   (rollout service: POST /v1/rollouts, GET /v1/status, /metrics)`);
    await serveAll(installed, access, port === 0 ? 0 : port + 1, [server]);
  },
});

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

/** A numeric flag, checked: a typo is an error that names the flag, not NaN sent on. */
function numberFlag(name: string, value: string | undefined, { integer = false, min = 0 }: { integer?: boolean; min?: number } = {}): number | undefined {
  if (value === undefined || value === '') return undefined;
  const number = Number(value);
  if (!Number.isFinite(number) || (integer && !Number.isInteger(number)) || number < min) {
    throw new RolloutError({ code: 'BAD_REQUEST', message: `--${name} takes ${integer ? 'an integer' : 'a number'} >= ${min}, not "${value}"` });
  }
  return number;
}

function generationFlag(value: string): 'chat' | 'tokens' {
  if (value === 'chat' || value === 'tokens') return value;
  throw new RolloutError({ code: 'BAD_REQUEST', message: `--generation is 'chat' or 'tokens', not "${value}"` });
}

const rollout = defineCommand({
  meta: { name: 'rollout', description: 'Collect rollouts for a JSONL of rows (like ng_collect_rollouts): results as they finish, failures, aggregate metrics' },
  args: {
    env: { type: 'string', description: 'Environment name', required: true },
    input: { type: 'string', description: 'Rows (JSONL)', required: true },
    output: { type: 'string', description: 'Results (JSONL, appended as they finish); <stem>_failures.jsonl and <stem>_aggregate_metrics.json go beside it', required: true },
    model: { type: 'string', description: 'Served model name, as the inference servers name it', required: true },
    policy: { type: 'string', description: 'Policy inference servers (OpenAI base URLs, comma-separated); with --service, one base URL for every task (default: the service\'s backends)' },
    service: { type: 'string', description: 'A running rollout service (http://host:8100) to submit to, instead of one in this process' },
    token: { type: 'string', description: 'Bearer token of --service (also ROLLSERVE_TOKEN)' },
    limit: { type: 'string', description: 'Only the first N rows' },
    concurrency: { type: 'string', description: 'Rollouts in flight at once (default: all)' },
    n: { type: 'string', description: 'Samples per row', default: '1' },
    temperature: { type: 'string', description: 'Sampling temperature' },
    'top-p': { type: 'string', description: 'Nucleus sampling top_p' },
    'max-tokens': { type: 'string', description: 'Generation limit per turn' },
    generation: { type: 'string', description: "How the policy is called: 'chat' (/v1/chat/completions) or 'tokens' (token-id prompts on /v1/completions, vLLM: no re-tokenisation drift)", default: 'chat' },
    'max-turns': { type: 'string', description: 'Model calls per rollout', default: '16' },
    'time-limit': { type: 'string', description: 'Stage seconds per rollout', default: '600' },
  },
  async run({ args }) {
    const policies = list_(args.policy);
    if (args.service === undefined && policies.length === 0) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: '--policy is required without --service: the policy inference servers (OpenAI base URLs, comma-separated)' });
    }
    if (args.service !== undefined && policies.length > 1) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: 'with --service, --policy takes one base URL (add more backends to the service: POST /v1/llm-backends)' });
    }
    const options = {
      env: args.env,
      input: args.input,
      output: args.output,
      model: args.model,
      generation: generationFlag(args.generation),
      n: numberFlag('n', args.n, { integer: true, min: 1 })!,
      sampling: {
        ...(args.temperature ? { temperature: numberFlag('temperature', args.temperature) } : {}),
        ...(args['top-p'] ? { top_p: numberFlag('top-p', args['top-p']) } : {}),
        ...(args['max-tokens'] ? { max_tokens: numberFlag('max-tokens', args['max-tokens'], { integer: true, min: 1 }) } : {}),
      },
      limits: { max_turns: numberFlag('max-turns', args['max-turns'], { integer: true, min: 1 })!, time_limit_s: numberFlag('time-limit', args['time-limit'])! },
      tty: process.stderr.isTTY === true,
    };
    const limit = numberFlag('limit', args.limit, { integer: true, min: 1 });
    const concurrency = numberFlag('concurrency', args.concurrency, { integer: true, min: 1 });
    const extra = { ...(limit ? { limit } : {}), ...(concurrency ? { concurrency } : {}) };
    let summary: CollectSummary;
    if (args.service !== undefined) {
      // the environment's metric hooks when it is installed here too; NeMo Gym's defaults otherwise
      const installed = listInstalledEnvironments().find((env) => env.name === args.env);
      const hooks = installed ? await loadEnvironment(installed.dir) : undefined;
      const token = (args.token ?? process.env.ROLLSERVE_TOKEN) || undefined;
      summary = await collectRollouts(httpRunner(args.service, token), { ...options, ...extra, ...(hooks ? { metricsHooks: hooks } : {}), ...(policies[0] ? { baseUrl: policies[0] } : {}) });
    } else {
      const [installed] = resolveEnvironments([args.env]);
      const env = await loadEnvironment(installed!.dir);
      await sweepStaleSandboxes();
      const pool = new LlmBackendPool();
      for (const url of policies) pool.add({ baseUrl: url });
      const models = new PoolModelProvider(pool);
      // failures are summed up at the end; the service's own log goes to stderr, errors only
      const logger = pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'error' }, pino.destination(2));
      const sidecars = sidecarPaths(args.output);
      const service = await RolloutService.create({ environments: [env], models, logger, store: `sqlite://${resolve(sidecars.store)}`, importJournal: sidecars.journal });
      try {
        summary = await collectRollouts(inProcessRunner(service), { ...options, ...extra, metricsHooks: env });
      } finally {
        await service.close();
        await models.close();
      }
    }
    const paths = sidecarPaths(args.output);
    const mean = summary.meanReward === null ? 'no reward' : `mean reward ${summary.meanReward.toFixed(3)}`;
    console.log(`${summary.total} rollouts: ${summary.done} written to ${args.output} (${mean}), ${summary.failed} failed (${paths.failures}); ${summary.rate.toFixed(1)} rollouts/s`);
    if (summary.failed > 0) {
      for (const { message, count } of summary.errors.slice(0, 3)) console.error(`  ${count} × ${message}`);
      throw new RolloutError({ code: 'UNAVAILABLE', message: `${summary.failed} of ${summary.total} rollouts failed (infrastructure failures, filter: true; see ${paths.failures})` });
    }
  },
});

const demo = defineCommand({
  meta: { name: 'demo', description: 'A first run without a GPU: the rollout service with a scripted policy that answers every environment\'s example rows' },
  args: {
    host: hostArg,
    port: { type: 'string', description: 'Port of the rollout service (0: any free port)', default: '8100' },
    serve: { type: 'boolean', description: 'Keep serving after the demo rollouts (try the README\'s curl examples), until Ctrl-C', default: false },
    ...tokenArgs,
  },
  async run({ args }) {
    const access = serveAccess(args);
    const installed = listInstalledEnvironments();
    if (installed.length === 0) throw new Error('no environments installed');
    await sweepStaleSandboxes();
    const prepared = await prepareDemo(installed, '127.0.0.1');
    let server: RolloutServer | undefined;
    const close = async () => {
      await server?.close();
      await prepared.close();
    };
    try {
      const logger = pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'error' }, pino.destination(2));
      server = await startRolloutServer({
        environments: prepared.environments,
        environmentConfigs: prepared.environmentConfigs,
        host: access.host,
        port: numberFlag('port', args.port, { integer: true })!,
        llmBackends: [prepared.policyUrl],
        defaultModel: DEMO_MODEL,
        allowNoToken: access.allowNoToken,
        logger,
        ...(access.token ? { token: access.token } : {}),
      });
      console.log(`${'policy'.padEnd(8)} ${prepared.policyUrl}   (scripted: answers the example rows; model "${DEMO_MODEL}")`);
      console.log(`${'service'.padEnd(8)} ${server.url}   (rollout service: POST /v1/rollouts, GET /v1/status)`);
      if (prepared.skipped.length > 0) console.log(`no scripted answers for ${prepared.skipped.join(', ')}: skipped`);
      const service = server.service;
      await service.submit(prepared.cases.map((c) => c.task));
      const results = await Promise.all(
        prepared.cases.map(async ({ task }) => {
          const result = await service.wait(task.id);
          console.log(resultLine(result));
          return result;
        }),
      );
      const { lines, failed } = summaryTable(results);
      console.log('');
      for (const line of lines) console.log(line);
      const envs = new Set(results.map((r) => r.env)).size;
      console.log(`${results.length} rollouts of ${envs} environments: ${failed === 0 ? 'all done' : `${failed} failed`}`);
      if (failed > 0) throw new RolloutError({ code: 'UNAVAILABLE', message: `${failed} of ${results.length} demo rollouts failed (see above)` });
      if (args.serve) {
        console.log(`serving ${server.url} until Ctrl-C; try the README's curl examples (model "${DEMO_MODEL}")`);
        exitOnSignals(close);
        return;
      }
    } catch (error) {
      await close();
      throw error;
    }
    await close();
  },
});

const gymConfig = defineCommand({
  meta: { name: 'gym-config', description: 'Write the NeMo Gym YAML that registers environments (with NEMO_GYM_EXTRA_ROOTS=<repo>/nemo-gym)' },
  args: {
    env: { type: 'positional', description: 'Environment names (default: all installed)', required: false },
    output: { type: 'string', description: 'File to write (default: standard output)' },
    host: { type: 'string', description: 'Fixed host for every server' },
    port: { type: 'string', description: 'Fixed port of the first server; the next ones count up' },
    'model-server': { type: 'string', description: 'The model server instance the agents use', default: 'policy_model' },
  },
  async run({ args }) {
    const installed = args._.length > 0 ? resolveEnvironments(args._) : listInstalledEnvironments();
    const envs = await Promise.all(installed.map(async (found) => ({ env: await loadEnvironment(found.dir), dir: found.dir })));
    const config = nemoGymConfig(envs, {
      ...(args.host ? { host: args.host } : {}),
      ...(args.port ? { port: Number(args.port) } : {}),
      modelServer: args['model-server'],
    });
    const text = `# NeMo Gym config for rollserve environments (rollserve gym-config).\n${stringify(config)}`;
    if (args.output) {
      await writeFile(args.output, text);
      console.error(`wrote ${args.output}: ${envs.map((e) => e.env.name).join(', ')}`);
    } else process.stdout.write(text);
  },
});

const create = defineCommand({
  meta: { name: 'new', description: 'Create an environment package that builds, passes its tests and serves at once' },
  args: {
    name: { type: 'positional', description: 'Environment name (lower-case letters, digits, dashes)', required: true },
    dir: { type: 'string', description: 'Where to create it (default: environments/<name> of this workspace)' },
  },
  async run({ args }) {
    const result = await scaffoldEnvironment({ name: args.name, ...(args.dir ? { dir: args.dir } : {}) });
    console.log(`created ${result.dir}`);
    console.log(result.inWorkspace ? `next: pnpm install && pnpm build && pnpm exec vitest run environments/${args.name}` : `next: cd ${result.dir} && pnpm install && pnpm build && pnpm test`);
  },
});

const nemoGym = defineCommand({
  meta: { name: 'nemo-gym', description: 'Serve one environment package as NeMo Gym launches it (NEMO_GYM_CONFIG_DICT / NEMO_GYM_CONFIG_PATH)' },
  args: {
    dir: { type: 'positional', description: 'The environment package directory', required: true },
    ...bodyArgs,
  },
  async run({ args }) {
    await launchFromNemoGym(await loadEnvironment(args.dir), process.env, maxBodyOf(args['max-body-mib']));
  },
});

const node = defineCommand({
  meta: { name: 'node', description: 'A rollout node: runs the INIT/RUN/EVAL pools and sandboxes of this machine for a central service (one per Slurm node)' },
  args: {
    service: { type: 'string', description: 'The central rollout service, http://host:8100 (also ROLLSERVE_SERVICE)' },
    token: { type: 'string', description: 'Its bearer token: its --node-token when it has one, else its --token (also ROLLSERVE_TOKEN)' },
    id: { type: 'string', description: 'Node id, kept across re-registrations (default: <host>-<SLURM_JOB_ID or pid>-<random>)' },
    init: { type: 'string', description: 'INIT worker slots (sandbox start-up)', default: '64' },
    run: { type: 'string', description: 'RUN worker slots (agent loops)', default: '512' },
    eval: { type: 'string', description: 'EVAL worker slots (verification)', default: '32' },
    'max-rollouts': { type: 'string', description: 'Rollouts held at once (default: --init + --run)' },
    'host-label': { type: 'string', description: 'Host name to register with (default: this host\'s name)' },
    'service-lost-s': { type: 'string', description: 'Exit (status 3, sandboxes killed) when the service has not answered for this long', default: '300' },
    'slurm-check-s': { type: 'string', description: 'Under Slurm, ask squeue this often whether this node\'s job is gone, and exit (status 3) if so; 0: never', default: '30' },
  },
  async run({ args }) {
    const service = (args.service ?? process.env.ROLLSERVE_SERVICE) || undefined;
    if (service === undefined) throw new RolloutError({ code: 'BAD_REQUEST', message: '--service is required (or ROLLSERVE_SERVICE): the central rollout service, http://host:8100' });
    const installed = listInstalledEnvironments();
    if (installed.length === 0) throw new Error('no environments installed');
    const environments = await Promise.all(installed.map((env) => loadEnvironment(env.dir)));
    const pools = {
      init: numberFlag('init', args.init, { integer: true, min: 1 })!,
      run: numberFlag('run', args.run, { integer: true, min: 1 })!,
      eval: numberFlag('eval', args.eval, { integer: true, min: 1 })!,
    };
    const maxRollouts = numberFlag('max-rollouts', args['max-rollouts'], { integer: true, min: 1 });
    const serviceLostMs = numberFlag('service-lost-s', args['service-lost-s'], { min: 0.1 })! * 1000;
    const slurmCheckS = numberFlag('slurm-check-s', args['slurm-check-s'], { min: 0 })!;
    const token = (args.token ?? process.env.ROLLSERVE_TOKEN) || undefined;
    await sweepStaleSandboxes();
    // stdout has the one line of registration; the log goes to stderr
    const logger = pino({ name: 'rollserve-node', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'warn' }, pino.destination(2));
    // SIGTERM (Slurm's scancel, preemption) or SIGINT: leave cleanly, what the node held re-queued at once
    let rolloutNode: RolloutNode | undefined;
    const leave = (signal: NodeJS.Signals) => {
      process.off('SIGINT', leave);
      process.off('SIGTERM', leave);
      if (rolloutNode === undefined) process.exit(0); // not registered yet: nothing held
      rolloutNode.close().then(
        () => process.exit(0),
        (error: unknown) => {
          console.error(`rollserve node: error while leaving on ${signal}:`, error);
          process.exit(1);
        },
      );
    };
    process.on('SIGINT', leave);
    process.on('SIGTERM', leave);
    rolloutNode = await startRolloutNode({
      serviceUrl: service,
      logger,
      environments,
      pools,
      version,
      ...(token ? { token } : {}),
      ...(args.id ? { nodeId: args.id } : {}),
      ...(maxRollouts ? { maxRollouts } : {}),
      ...(args['host-label'] ? { host: args['host-label'] } : {}),
      serviceLostMs,
      slurmCheck: slurmCheckS > 0 ? { everyMs: slurmCheckS * 1000 } : false,
      onEvent: (event) => {
        if (event.type === 'registered' && event.again) console.error(`node ${event.nodeId} registered again with ${service}`);
      },
    }).catch((error: unknown) => {
      // its service never answered: an orphan from the start
      if (RolloutError.isInstance(error) && error.code === 'UNAVAILABLE') {
        console.error(`rollserve node: ${error.message}; exiting`);
        process.exit(3);
      }
      throw error;
    });
    const { capacity, maxRollouts: held, environments: envs } = rolloutNode.registration;
    console.log(`node ${rolloutNode.nodeId} registered with ${service} (init ${capacity.init}, run ${capacity.run}, eval ${capacity.eval}; up to ${held} rollouts; ${envs.join(', ')})`);
    // the service refusing to take the node back ends it: exit 1 with the reason
    void rolloutNode.ended().then(({ refused, orphaned }) => {
      if (orphaned !== undefined) {
        // its service or its Slurm job is gone: its sandboxes are killed by now
        console.error(`rollserve node: ${orphaned}; exiting`);
        process.exit(3);
      }
      if (!refused) return;
      console.error(`rollserve node: the service refused this node: ${refused.message}`);
      process.exit(1);
    });
  },
});

const subCommands = { serve, list, start, rollout, demo, node, new: create, 'gym-config': gymConfig, 'nemo-gym': nemoGym };

// A mistake on the command line, or a failure of the command, is one line that says what went
// wrong (exit 2 and 1), never a stack trace; ROLLSERVE_DEBUG=1 shows the trace.
const problem = checkArgv(process.argv.slice(2), subCommands as Record<string, CheckedCommand>);
if (problem !== undefined) {
  console.error(`rollserve: ${problem}`);
  process.exit(2);
}
for (const [name, command] of Object.entries(subCommands) as Array<[string, { run?: (context: unknown) => unknown }]>) {
  const run = command.run;
  if (run === undefined) continue;
  command.run = async (context: unknown) => {
    try {
      return await run(context);
    } catch (error) {
      if (process.env.ROLLSERVE_DEBUG === '1') console.error(error);
      const cause = (error as Error).cause instanceof Error ? ` (${((error as Error).cause as Error).message})` : '';
      console.error(`rollserve ${name}: ${error instanceof Error ? error.message : String(error)}${cause}`);
      process.exit(1);
    }
  };
}

await runMain(
  defineCommand({
    meta: { name: 'rollserve', version, description: 'Rollout infrastructure for RL of LLM agents' },
    subCommands,
  }),
);
