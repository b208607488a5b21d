import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { serveFetch } from '@rollserve/core/gym';
import {
  createRolloutApi,
  goneSlurmJobs,
  LlmBackendPool,
  PoolModelProvider,
  RolloutService,
  slurmJobOf,
  SlurmUnanswered,
  type NodeRegistration,
} from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { counterEnvironment, slurmMissing, startFakePolicy, startTestRolloutService, startTestSlurm, workspaceRoot, type TestSlurm } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// How the service learns from Slurm that a node's job is gone (squeue against a real controller).
const missing = slurmMissing();
if (missing !== undefined && process.env.CI) throw new Error(`the Slurm suite must run in CI: ${missing}`);

describe.skipIf(missing !== undefined)('asking Slurm whether node jobs are gone', () => {
  let slurm: TestSlurm;
  beforeAll(async () => {
    slurm = await startTestSlurm({ nodes: 1 });
  }, 120_000);
  afterAll(async () => {
    await slurm?.close();
  }, 120_000);

  it('tells running jobs from cancelled and unknown ones, and concludes nothing without squeue', async () => {
    const env = { ...process.env, ...slurm.env };
    const running = await slurm.sbatch(['--wrap', 'sleep 300']);
    const array = await slurm.sbatch(['--array=0-1', '--wrap', 'sleep 300']);
    const waitFor = async (check: () => Promise<boolean>) => {
      while (!(await check())) await new Promise((r) => setTimeout(r, 200));
    };
    await waitFor(async () => (await slurm.jobs(running))[0]?.state === 'RUNNING');
    const first = slurmJobOf({ slurm: { array_job_id: array, array_task_id: '0', job_id: 'ignored' } })!;
    expect(first).toBe(`${array}_0`);
    const node = (await slurm.jobs(running))[0]!.nodeList;
    const refs = [{ id: running, node }, { id: first }];
    const ids = async (jobs: typeof refs) => (await goneSlurmJobs(jobs, { env })).map((job) => job.id);
    await waitFor(async () => (await ids(refs)).length === 0);
    // the same job id running on another Slurm node than the one a node registered from: a new run
    expect(await ids([{ id: running, node: 'elsewhere' }])).toEqual([running]);
    // two runs of one job (a requeued task started again elsewhere): only the old run's ref is gone
    const stale = { id: running, node: 'elsewhere' };
    expect(await goneSlurmJobs([{ id: running, node }, stale], { env })).toEqual([stale]);

    await slurm.cancel(running);
    await waitFor(async () => (await ids(refs)).includes(running));
    expect(await ids(refs)).toEqual([running]);
    // a job id the controller never knew (or purged): gone, and it does not hide the others' state
    expect(await ids([{ id: '999999' }, { id: first }])).toEqual(['999999']);
    // a controller that does not answer: nothing concluded, squeue's reason given; no squeue at all: ENOENT
    const unanswered = goneSlurmJobs([{ id: first }], { env: { ...env, SLURM_CONF: '/nonexistent/slurm.conf' } });
    await expect(unanswered).rejects.toBeInstanceOf(SlurmUnanswered);
    await expect(unanswered).rejects.toThrow(/slurm\.conf/);
    await expect(goneSlurmJobs([{ id: first }], { env, squeue: '/nonexistent/squeue' })).rejects.toMatchObject({ code: 'ENOENT' });
    await slurm.cancel(array);
  }, 120_000);

  it('loses the node of a run Slurm reports gone, and not the new run of the same job', async () => {
    const env = { ...process.env, ...slurm.env };
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-watch-'));
    const fake = await startFakePolicy({ script: () => 'done' });
    // squeue itself, each call written down: the service is seen asking again after the loss
    const calls = join(dir, 'calls');
    const squeue = join(dir, 'squeue');
    await writeFile(squeue, `#!/bin/sh\necho >> '${calls}'\nexec squeue "$@"\n`);
    await chmod(squeue, 0o755);
    const asked = () => readFileSync(calls, 'utf8').length;
    const { service, close } = await startTestRolloutService({ environments: [counterEnvironment], backends: [fake.url], runLocally: 'never', slurmWatch: { everyMs: 100, squeue, env } });
    try {
      const array = await slurm.sbatch(['--array=1', '--wrap', 'sleep 300']);
      const task = `${array}_1`;
      const { nodeList: host } = await slurm.waitFor('the array task to run', async () => (await slurm.jobs(array)).find((t) => t.arrayTaskId === '1' && t.state === 'RUNNING'));
      const node = (nodeId: string, nodeName: string, restartCount: string): NodeRegistration => ({
        node_id: nodeId,
        host: 'localhost',
        pid: process.pid,
        capacity: { init: 1, run: 1, eval: 1 },
        max_rollouts: 1,
        environments: ['counter'],
        slurm: { job_id: '1', array_job_id: array, array_task_id: '1', node_name: nodeName, restart_count: restartCount },
      });
      // the task's first run, on a node it no longer runs on, and its requeued run, where it runs
      const oldRun = await service.registerNode(node('old-run', 'elsewhere', '0'));
      const newRun = await service.registerNode(node('new-run', host, '1'));
      const state = (id: string) => service.nodes().find((n) => n.node_id === id);
      await slurm.waitFor('the old run to be lost', () => state('old-run')?.state === 'lost', { timeoutMs: 30_000, intervalMs: 50 });
      expect(state('old-run')?.lost_reason).toBe(`Slurm job ${task} is gone`);
      // still up after the service asked Slurm twice more
      const seen = asked();
      const deadline = Date.now() + 30_000;
      while (asked() < seen + 2) {
        expect(state('new-run')?.state).toBe('up');
        if (Date.now() > deadline) throw new Error('the service did not ask Slurm again within 30 s');
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(state('new-run')?.state).toBe('up');
      // the old run cannot come back, and when it leaves (as a refused node does) it stays listed
      // as lost, with why; the new run can register again
      await expect(service.registerNode(node('old-run', 'elsewhere', '0'), oldRun.credential)).rejects.toMatchObject({ code: 'CONFLICT' });
      expect(await service.deregisterNode(oldRun)).toEqual({ released: 0 });
      expect(state('old-run')).toMatchObject({ state: 'lost', lost_reason: `Slurm job ${task} is gone` });
      await service.registerNode(node('new-run', host, '1'), newRun.credential);

      await slurm.cancel(array);
      await slurm.waitFor('the new run to be lost once its job is cancelled', () => state('new-run')?.state === 'lost', { timeoutMs: 30_000, intervalMs: 50 });
    } finally {
      await close();
      await fake.close();
      await rm(dir, { recursive: true, force: true });
    }
  }, 120_000);
  it('a rollserve node whose own Slurm job is gone ends itself (status 3), though its service still answers', async () => {
    const job = await slurm.sbatch(['--wrap', 'sleep 300']);
    const host = (await slurm.waitFor('the job to run', async () => (await slurm.jobs(job)).find((j) => j.state === 'RUNNING')))!.nodeList;
    const fake = await startFakePolicy({ script: () => 'done' });
    const backends = new LlmBackendPool();
    backends.add({ baseUrl: fake.url });
    const models = new PoolModelProvider(backends);
    // the service does not watch Slurm here: the node has to find out by itself
    const service = await RolloutService.create({ environments: [math], models, runLocally: 'never', slurmWatch: false });
    const running = await serveFetch(createRolloutApi(service, { backends }));
    // a node process outside its job's cgroup (as one that escaped it), told the job is its own
    const child = spawn(process.execPath, [join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js'), 'node', '--service', running.url, '--run', '1', '--slurm-check-s', '0.3'], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...slurm.env, SLURM_JOB_ID: job, SLURMD_NODENAME: host, ROLLSERVE_LOG_LEVEL: 'silent' },
    });
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    const out = { stdout: '', stderr: '' };
    child.stdout!.on('data', (chunk: Buffer) => (out.stdout += chunk));
    child.stderr!.on('data', (chunk: Buffer) => (out.stderr += chunk));
    try {
      await slurm.waitFor('the node to register', () => out.stdout.includes('registered') || child.exitCode !== null, { intervalMs: 50 });
      expect(out.stdout).toMatch(/registered/);
      expect(service.nodes()).toMatchObject([{ state: 'up', slurm: { job_id: job, node_name: host } }]);
      await slurm.cancel(job);
      expect(await exited).toEqual([3, null]);
      expect(out.stderr).toMatch(new RegExp(`^rollserve node: Slurm job ${job} of this node is gone .*; exiting$`, 'm'));
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
      await running.close();
      await service.close();
      await models.close();
      await fake.close();
    }
  }, 120_000);
});
