import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import type { Environment } from '@rollserve/core';
import { serveFetch } from '@rollserve/core/gym';
import { createRolloutApi, LlmBackendPool, PoolModelProvider, RolloutService } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { shellEnvironment, startFakePolicy, workspaceRoot } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { getJson, Resources, sandboxDir, until } from './helpers.ts';

// `rollserve node` as users and the Slurm templates run it (the built CLI: `npx tsc -b` first).

const resources = new Resources();
afterEach(() => resources.cleanup());
const TOKEN = 'cli-node-token';

async function startService(environments: Array<Environment<any, any, any>>): Promise<string> {
  return (await startStoppableService(environments)).url;
}

/** The service, with a `stop` that ends it while the node runs on (its address then refuses connections). */
async function startStoppableService(environments: Array<Environment<any, any, any>>): Promise<{ url: string; stop: () => Promise<void> }> {
  const fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
  resources.add(() => fake.close());
  const backends = new LlmBackendPool();
  backends.add({ baseUrl: fake.url });
  const models = new PoolModelProvider(backends);
  const service = await RolloutService.create({ environments, models, runLocally: 'never', heartbeatMs: 250, nodeTimeoutMs: 3_000 });
  const running = await serveFetch(createRolloutApi(service, { backends, token: TOKEN }));
  let stopped: Promise<void> | undefined;
  const stop = () =>
    (stopped ??= (async () => {
      await running.close();
      await service.close();
      await models.close();
    })());
  resources.add(stop);
  return { url: running.url, stop };
}

/** `rollserve node …`, run through `prefix` (a command that execs it, e.g. `taskset -c 0`) if given. */
function startCli(args: string[], env: Record<string, string>, prefix: string[] = []) {
  const argv = [...prefix, process.execPath, join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js'), 'node', ...args];
  const child = spawn(argv[0]!, argv.slice(1), {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent', ...env },
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  resources.add(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  });
  const out = { stdout: '', stderr: '' };
  child.stdout!.on('data', (chunk: Buffer) => (out.stdout += chunk));
  child.stderr!.on('data', (chunk: Buffer) => (out.stderr += chunk));
  return { child, exited, out };
}

describe('rollserve node', () => {
  it('registers with its Slurm ids, runs the rollouts it claims, and leaves on SIGTERM with exit 0', async () => {
    const url = await startService([math]);
    const sandboxes = await sandboxDir(resources);
    const slurm = { SLURM_JOB_ID: '42', SLURM_ARRAY_JOB_ID: '40', SLURM_ARRAY_TASK_ID: '2', SLURM_STEP_ID: '0', SLURMD_NODENAME: 'n3', SLURM_PROCID: '0' };
    const cli = startCli(['--id', 'cli-node', '--init', '1', '--run', '2', '--eval', '1', '--max-rollouts', '2', '--host-label', 'n3.cluster'], {
      ROLLSERVE_SERVICE: url,
      ROLLSERVE_TOKEN: TOKEN,
      TMPDIR: sandboxes,
      ...slurm,
    });
    await until(() => cli.out.stdout.includes('\n') || cli.child.exitCode !== null);
    expect(cli.out.stdout).toMatch(new RegExp(`^node cli-node registered with ${url} \\(init 1, run 2, eval 1; up to 2 rollouts; .*math.*\\)\\n$`));

    const auth = { authorization: `Bearer ${TOKEN}` };
    const { json } = await getJson(url, '/v1/nodes', { headers: auth });
    expect(json.nodes).toMatchObject([
      {
        node_id: 'cli-node',
        host: 'n3.cluster',
        pid: cli.child.pid,
        capacity: { init: 1, run: 2, eval: 1 },
        max_rollouts: 2,
        slurm: { job_id: '42', array_job_id: '40', array_task_id: '2', step_id: '0', node_name: 'n3', proc_id: '0' },
        state: 'up',
      },
    ]);
    expect(json.nodes[0].environments).toContain('math');

    const task = { id: 'via-node', env: 'math', row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' }, policy: { model: 'fake-policy' } };
    expect((await getJson(url, '/v1/rollouts', { body: task, headers: auth })).status).toBe(202);
    const stream = await getJson(url, '/v1/rollouts/stream?ids=via-node', { headers: auth });
    expect(stream.json).toMatchObject({ id: 'via-node', state: 'done', reward: 1 });

    cli.child.kill('SIGTERM');
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    const after = await getJson(url, '/v1/nodes', { headers: auth });
    expect(after.json.nodes).toMatchObject([{ node_id: 'cli-node', state: 'left' }]);
  }, 120_000);

  it('is refused by a service with an environment it lacks: one line naming it, exit 1', async () => {
    const url = await startService([math, shellEnvironment]);
    const cli = startCli(['--service', url, '--token', TOKEN, '--run', '1'], {});
    expect(await cli.exited).toEqual({ code: 1, signal: null });
    expect(cli.out.stderr).toMatch(/^rollserve node: .*shell/m);
    expect(cli.out.stdout).toBe('');
  }, 120_000);

  it('whose service is gone: exits with status 3 and a line that says so once --service-lost-s has passed', async () => {
    const service = await startStoppableService([math]);
    const sandboxes = await sandboxDir(resources);
    const cli = startCli(['--id', 'orphan-to-be', '--run', '1', '--service-lost-s', '2'], { ROLLSERVE_SERVICE: service.url, ROLLSERVE_TOKEN: TOKEN, TMPDIR: sandboxes });
    await until(() => cli.out.stdout.includes('registered') || cli.child.exitCode !== null);
    // pools not given are sized to this host's cores (README, "HPC": size a node's pools to its cores)
    const cores = availableParallelism();
    expect(cli.out.stdout).toMatch(new RegExp(`^node orphan-to-be registered with .* \\(init ${Math.min(64, 4 * cores)}, run 1, eval ${Math.min(32, 2 * cores)};`));
    await service.stop();
    expect(await cli.exited).toEqual({ code: 3, signal: null });
    expect(cli.out.stderr).toMatch(/^rollserve node: the service at .* has not answered for \d+ s .*; exiting$/m);
  }, 120_000);

  it.skipIf(availableParallelism() < 2 || !existsSync('/usr/bin/taskset'))(
    'sizes the pools it is not given to the CPUs it may run on (its affinity, as Slurm binds a task), not to the whole host',
    async () => {
      // (README, "One node process carries a host only so far": several node processes a host, each on its share)
      const url = await startService([math]);
      const sandboxes = await sandboxDir(resources);
      // one of the CPUs this process may run on (a container's cpuset need not hold CPU 0)
      const cpu = /^Cpus_allowed_list:\s*(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))![1]!;
      const cli = startCli(['--id', 'pinned'], { ROLLSERVE_SERVICE: url, ROLLSERVE_TOKEN: TOKEN, TMPDIR: sandboxes }, ['/usr/bin/taskset', '-c', cpu]);
      await until(() => cli.out.stdout.includes('registered') || cli.child.exitCode !== null);
      // one CPU: 4, 64 and 2 a core, where the whole host would give at least 8, 128 and 4
      expect(cli.out.stdout).toMatch(/^node pinned registered with .* \(init 4, run 64, eval 2;/);
      const { json } = await getJson(url, '/v1/nodes', { headers: { authorization: `Bearer ${TOKEN}` } });
      expect(json.nodes).toMatchObject([{ node_id: 'pinned', capacity: { init: 4, run: 64, eval: 2 }, state: 'up' }]);
      cli.child.kill('SIGTERM');
      expect(await cli.exited).toEqual({ code: 0, signal: null });
    },
    120_000,
  );

  describe('--processes', () => {
    const auth = { authorization: `Bearer ${TOKEN}` };
    const nodesOf = async (url: string) => (await getJson(url, '/v1/nodes', { headers: auth })).json.nodes as Array<{ node_id: string; pid: number; state: string; capacity: object }>;
    const alive = (pid: number) => existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
    /** `rollserve node --processes 2 …args` for the service at `url`, once both its nodes have registered. */
    const startTwo = async (url: string, args: string[]) => {
      const sandboxes = await sandboxDir(resources);
      const cli = startCli(['--processes', '2', ...args], { ROLLSERVE_SERVICE: url, ROLLSERVE_TOKEN: TOKEN, TMPDIR: sandboxes });
      await until(() => (cli.out.stdout.match(/registered/g) ?? []).length === 2 || cli.child.exitCode !== null);
      return cli;
    };

    it.skipIf(availableParallelism() < 2)(
      'runs that many nodes, each registered with pools of its share of the CPUs, which run rollouts and leave on the supervisor\'s SIGTERM (exit 0)',
      async () => {
        const url = await startService([math]);
        const cli = await startTwo(url, ['--id', 'multi', '--max-rollouts', '4']);
        // each its share: the first half (rounded up) of the CPUs this process may run on, then the rest; 4, 64 and 2 a core
        const share = [Math.ceil(availableParallelism() / 2), Math.floor(availableParallelism() / 2)];
        const pools = (cores: number) => ({ init: Math.min(64, 4 * cores), run: Math.min(512, 64 * cores), eval: Math.min(32, 2 * cores) });
        const nodes = (await nodesOf(url)).sort((a, b) => a.node_id.localeCompare(b.node_id));
        expect(nodes).toMatchObject([
          { node_id: 'multi-0', capacity: pools(share[0]!), max_rollouts: 4, state: 'up' },
          { node_id: 'multi-1', capacity: pools(share[1]!), max_rollouts: 4, state: 'up' },
        ]);
        // node processes of their own, not the supervisor
        expect(new Set([cli.child.pid, ...nodes.map((n) => n.pid)]).size).toBe(3);

        const tasks = Array.from({ length: 4 }, (_, i) => ({
          id: `multi-${i}`,
          env: 'math',
          row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' },
          policy: { model: 'fake-policy' },
        }));
        expect((await getJson(url, '/v1/rollouts', { body: { tasks }, headers: auth })).status).toBe(202);
        const stream = await getJson(url, `/v1/rollouts/stream?ids=${tasks.map((t) => t.id).join(',')}`, { headers: auth });
        const results = String(stream.json).trim().split('\n').map((line) => JSON.parse(line) as { state: string; reward: number });
        expect(results.map((r) => [r.state, r.reward])).toEqual(tasks.map(() => ['done', 1]));

        cli.child.kill('SIGTERM');
        expect(await cli.exited).toEqual({ code: 0, signal: null });
        expect((await nodesOf(url)).map((n) => n.state)).toEqual(['left', 'left']);
        for (const node of nodes) expect(alive(node.pid)).toBe(false);
      },
      120_000,
    );

    it.skipIf(availableParallelism() < 2)(
      'ends with a node that dies (its status: 128 + the signal) and takes the other with it; a killed supervisor leaves no node running',
      async () => {
        const url = await startService([math]);
        const first = await startTwo(url, ['--id', 'dies', '--run', '1']);
        const [victim, other] = (await nodesOf(url)).sort((a, b) => a.node_id.localeCompare(b.node_id));
        process.kill(victim!.pid, 'SIGKILL');
        expect(await first.exited).toEqual({ code: 137, signal: null });
        expect((await nodesOf(url)).find((n) => n.node_id === other!.node_id)).toMatchObject({ state: 'left' });
        expect(alive(other!.pid)).toBe(false);

        const second = await startTwo(url, ['--id', 'orphans', '--run', '1']);
        const orphans = (await nodesOf(url)).filter((n) => n.node_id.startsWith('orphans-'));
        expect(orphans).toHaveLength(2);
        second.child.kill('SIGKILL');
        // each reads its supervisor's end on its stdin and leaves as on SIGTERM
        await until(async () => (await nodesOf(url)).filter((n) => n.node_id.startsWith('orphans-')).every((n) => n.state === 'left'));
        await until(() => orphans.every((n) => !alive(n.pid)));
      },
      120_000,
    );

    it.skipIf(availableParallelism() < 2)(
      'leaves cleanly, exit 0, when SIGTERM reaches the supervisor and every node at once (as scancel signals every process of a step)',
      async () => {
        const url = await startService([math]);
        const cli = await startTwo(url, ['--run', '1']);
        const nodes = await nodesOf(url);
        expect(nodes).toHaveLength(2);
        for (const pid of [cli.child.pid!, ...nodes.map((n) => n.pid)]) process.kill(pid, 'SIGTERM');
        expect(await cli.exited).toEqual({ code: 0, signal: null });
        expect((await nodesOf(url)).map((n) => n.state)).toEqual(['left', 'left']);
      },
      120_000,
    );

    it('refuses more processes than CPUs, before any starts: one line, exit 1', async () => {
      const url = await startService([math]);
      const cli = startCli(['--processes', String(availableParallelism() + 1)], { ROLLSERVE_SERVICE: url, ROLLSERVE_TOKEN: TOKEN });
      expect(await cli.exited).toEqual({ code: 1, signal: null });
      expect(cli.out.stderr).toMatch(/^rollserve node: .*--processes \d+: this process may run on \d+ CPUs?; at most one node process a CPU/m);
      expect(cli.out.stdout).toBe('');
      expect(await nodesOf(url)).toEqual([]);
    }, 60_000);
  });

  it('whose service never answers: gives up registering after --service-lost-s, status 3', async () => {
    const service = await startStoppableService([math]);
    await service.stop(); // an address where nothing listens
    const cli = startCli(['--service', service.url, '--token', TOKEN, '--run', '1', '--service-lost-s', '1'], {});
    expect(await cli.exited).toEqual({ code: 3, signal: null });
    expect(cli.out.stderr).toMatch(/has not answered/);
    expect(cli.out.stdout).toBe('');
  }, 120_000);

  it('without --service or ROLLSERVE_SERVICE: one line that says so, exit 1', async () => {
    const cli = startCli([], { ROLLSERVE_SERVICE: '' });
    expect(await cli.exited).toEqual({ code: 1, signal: null });
    expect(cli.out.stderr).toMatch(/--service is required/);
  });
});
