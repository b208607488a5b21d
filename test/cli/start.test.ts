import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NodeClient } from '@rollserve/core/node';
import { RolloutTask } from '@rollserve/core/service';
import { call, startFakePolicy, workspaceRoot } from '@rollserve/testing';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';

const ROLLSERVE = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');

/** `rollserve start` on free ports with `args`, its output kept. */
function startCli(args: string[], env: NodeJS.ProcessEnv = {}) {
  const child = spawn(process.execPath, [ROLLSERVE, 'start', '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent', ...env },
  });
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c));
  child.stderr!.on('data', (c: Buffer) => (output += c));
  return { child, output: () => output };
}

/** The URLs it printed, once every server is up. */
async function started({ child, output }: ReturnType<typeof startCli>): Promise<Record<string, string>> {
  const deadline = Date.now() + 20_000;
  while (!/^swe\s+http/m.test(output())) {
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`not started: ${output()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return Object.fromEntries([...output().matchAll(/^(\S+)\s+(http:\/\/127\.0\.0\.1:\d+)/gm)].map((m) => [m[1]!, m[2]!]));
}

async function stop(child: ChildProcess): Promise<number | null> {
  child.kill('SIGINT');
  const [code] = (await once(child, 'exit')) as [number | null];
  return code;
}

// The main job the README's quickstart starts: the rollout service and every installed
// environment as a NeMo Gym resources server.
describe('rollserve start', () => {
  it('serves the rollout service and every environment, runs a rollout, and stops on SIGINT; an old journal is imported once', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-start-'));
    const fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
    // a journal of rollserve before the store: one task accepted, never finished
    const journal = join(dir, 'journal.jsonl');
    const old = RolloutTask.parse({ id: 'old', env: 'math', row: { responses_create_params: { input: 'What is 4+4?' }, question: 'What is 4+4?', expected_answer: '8' }, policy: { model: 'fake-policy' } });
    await writeFile(journal, `${JSON.stringify({ type: 'task', taskId: 'old', task: old, rolloutIds: ['old'], at: new Date().toISOString() })}\n`);
    const store = `sqlite://${join(dir, 'store.db')}`;
    const start = () => startCli(['--llm', fake.url, '--store', store, '--journal', journal]);
    const first = start();
    try {
      const urls = await started(first);
      expect(Object.keys(urls).sort()).toEqual(['code', 'math', 'rollouts', 'stem', 'swe']);
      for (const env of ['code', 'math', 'stem', 'swe']) expect((await call(urls[env]!, 'GET', '/')).json).toEqual({ status: 'ok' });

      const submitted = await call(urls.rollouts!, 'POST', '/v1/rollouts', {
        id: 'quick',
        env: 'math',
        row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' },
        policy: { model: 'fake-policy' },
      });
      expect(submitted.status).toBe(202);
      const stream = await request(`${urls.rollouts}/v1/rollouts/stream?ids=quick,old`);
      const results = (await stream.body.text()).split('\n').filter((l) => l.trim() !== '').map((line) => JSON.parse(line) as { reward: number; id: string });
      expect(results.map((r) => [r.id, r.reward]).sort()).toEqual([['old', 1], ['quick', 1]]);
      expect(await stop(first.child)).toBe(0);
    } finally {
      if (first.child.exitCode === null) first.child.kill('SIGKILL');
    }
    // started again on the same store: the results are there, the journal is not imported twice
    const calls = fake.requests.length;
    const second = start();
    try {
      const urls = await started(second);
      const view = await call(urls.rollouts!, 'GET', '/v1/rollouts/old');
      expect(view.json).toMatchObject({ id: 'old', state: 'done', result: { reward: 1 } });
      expect((await call(urls.rollouts!, 'GET', '/v1/status')).json).toMatchObject({ rollouts: { total: 2, done: 2, in_flight: 0 } });
      expect(fake.requests.length).toBe(calls);
      expect(await stop(second.child)).toBe(0);
    } finally {
      if (second.child.exitCode === null) second.child.kill('SIGKILL');
      await fake.close();
      await rm(dir, { recursive: true, force: true });
    }
  }, 90_000);

  it('warms up before it listens (--warm-up, ROLLSERVE_WARM_UP) on a store and a policy of its own', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-start-'));
    const fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
    const store = `sqlite://${join(dir, 'store.db')}`;
    const service = startCli(['--llm', fake.url, '--store', store, '--journal', join(dir, 'journal.jsonl'), '--warm-up', '40'], { ROLLSERVE_WARM_UP: '0' });
    try {
      const urls = await started(service);
      expect(service.output()).toMatch(/^warm-up\s+40 rollouts in [\d.]+ s before listening/m);
      expect(service.output().indexOf('warm-up')).toBeLessThan(service.output().indexOf('rollouts '));
      expect(fake.requests).toHaveLength(0);
      expect((await call(urls.rollouts!, 'GET', '/v1/status')).json).toMatchObject({ rollouts: { total: 0 } });
      const submitted = await call(urls.rollouts!, 'POST', '/v1/rollouts', {
        id: 'after',
        env: 'math',
        row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' },
        policy: { model: 'fake-policy' },
      });
      expect(submitted.status).toBe(202);
      const stream = await request(`${urls.rollouts}/v1/rollouts/stream?ids=after`);
      expect((await stream.body.text()).trim().split('\n').map((line) => (JSON.parse(line) as { reward: number }).reward)).toEqual([1]);
      expect(fake.requests).toHaveLength(1);
      expect(await stop(service.child)).toBe(0);
    } finally {
      if (service.child.exitCode === null) service.child.kill('SIGKILL');
      await fake.close();
      await rm(dir, { recursive: true, force: true });
    }
  }, 90_000);

  it('leaves nothing of a warm-up stopped by SIGINT, and exits by the signal', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-start-'));
    const temp = join(dir, 'tmp');
    await mkdir(temp);
    const service = startCli(['--store', `sqlite://${join(dir, 'store.db')}`, '--journal', join(dir, 'journal.jsonl'), '--warm-up', '1000000'], { TMPDIR: temp });
    try {
      // the warm-up's store is there: it runs
      const deadline = Date.now() + 30_000;
      while (!(await readdir(temp)).some((name) => name.startsWith('rollserve-warm-up-'))) {
        if (Date.now() > deadline || service.child.exitCode !== null) throw new Error(`no warm-up: ${service.output()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      service.child.kill('SIGINT');
      const [code, signal] = (await once(service.child, 'exit')) as [number | null, NodeJS.Signals | null];
      expect({ code, signal }).toEqual({ code: null, signal: 'SIGINT' });
      expect(service.output()).not.toMatch(/^rollouts\s/m);
      expect(await readdir(temp)).toEqual([]);
    } finally {
      if (service.child.exitCode === null && service.child.signalCode === null) service.child.kill('SIGKILL');
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it('forgets a node that left once --node-retention-s has passed; with --proxy-node-turns a node that can call backends itself is not handed routes', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-start-'));
    const service = startCli(['--store', `sqlite://${join(dir, 'store.db')}`, '--journal', join(dir, 'journal.jsonl'), '--run-locally', 'never', '--node-retention-s', '0', '--proxy-node-turns']);
    try {
      const urls = await started(service);
      const node = new NodeClient({ serviceUrl: urls.rollouts!, features: ['weights', 'prefetch', 'direct-backends'] });
      const listed = async () => ((await call(urls.rollouts!, 'GET', '/v1/nodes')).json as { nodes: Array<{ node_id: string; state: string; direct_backends: boolean }> }).nodes.map((n) => [n.node_id, n.state, n.direct_backends]);
      try {
        const registered = await node.register({ node_id: 'passing', host: 'localhost', pid: process.pid, capacity: { init: 1, run: 1, eval: 1 }, max_rollouts: 1, environments: ['code', 'math', 'stem', 'swe'] });
        expect(registered.features).toBeUndefined();
        expect(node.serviceFeatures).toEqual([]);
        expect(await listed()).toEqual([['passing', 'up', false]]);
        await node.deregister('passing');
        // gone at the service's next sweep (every 2 s); a deadline, so a failure still stops the service
        const deadline = Date.now() + 30_000;
        while ((await listed()).length > 0) {
          if (Date.now() > deadline) throw new Error(`still listed after 30 s: ${JSON.stringify(await listed())}`);
          await new Promise((r) => setTimeout(r, 100));
        }
      } finally {
        await node.close();
      }
      expect(await stop(service.child)).toBe(0);
    } finally {
      if (service.child.exitCode === null) service.child.kill('SIGKILL');
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
