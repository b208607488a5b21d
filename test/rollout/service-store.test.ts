import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  openStore,
  RolloutRunner,
  RolloutTask,
  type NodeRegistration,
  type RolloutResult,
  type RolloutService,
  type RolloutTaskInput,
} from '@rollserve/core/service';
import { counterEnvironment, type FakePolicy, startFakePolicy, startTestPostgres, startTestRolloutService } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';

// The service on its store: what it keeps, what it forgets, how work leaves it for nodes and comes
// back when a node is lost. Nodes are driven here through the service's side of the protocol
// (NodeCoordinator); test/node drives real `rollserve node` processes over HTTP.

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

async function policy(script: Parameters<typeof startFakePolicy>[0]): Promise<FakePolicy> {
  const fake = await startFakePolicy(script);
  cleanups.push(() => fake.close());
  return fake;
}

async function service(options: Partial<Parameters<typeof RolloutService.create>[0]> & { backends: string[] }): Promise<RolloutService> {
  const { service: created, close } = await startTestRolloutService({ environments: [counterEnvironment], ...options });
  cleanups.push(close);
  return created;
}

const task = (id: string, count = 0): RolloutTaskInput => ({
  id,
  env: 'counter',
  row: { responses_create_params: { input: id }, initial_count: count, expected_count: count },
  policy: { model: 'fake-policy' },
});

const node = (nodeId: string): NodeRegistration => ({
  node_id: nodeId,
  host: 'localhost',
  pid: process.pid,
  capacity: { init: 4, run: 4, eval: 4 },
  max_rollouts: 4,
  environments: ['counter'],
});

const until = async (check: () => boolean | Promise<boolean>) => {
  while (!(await check())) await new Promise((r) => setTimeout(r, 10));
};

describe('rollout service on its store', () => {
  it('fails a rollout handed out more than maxAttempts times instead of running it again', async () => {
    const store = await openStore('sqlite::memory:');
    cleanups.push(() => store.close());
    await store.putTasks([RolloutTask.parse({ ...task('cursed'), id: 'cursed' })]);
    // a worker that took it and vanished, twice
    for (const ghost of ['ghost-1', 'ghost-2']) {
      await store.claim({ workerId: ghost, limit: 1, leaseMs: 1 });
      await new Promise((r) => setTimeout(r, 5));
    }
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url], store, maxAttempts: 2 });
    const result = await svc.wait('cursed');
    expect(result).toMatchObject({ state: 'failed', critical_error: 'init', filter: true, error: { code: 'UNAVAILABLE' } });
    expect(result.error!.message).toMatch(/lost its worker 2 times/);
    expect(fake.requests).toHaveLength(0);
  });

  it('forgets old results by its retention policy, at start and on its timer', async () => {
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url], retention: { keepLast: 2 }, pruneEveryMs: 20 });
    await svc.submit([task('r1'), task('r2'), task('r3')]);
    for (const id of ['r1', 'r2', 'r3']) await svc.wait(id);
    await svc.submit([task('r4'), task('r5')]);
    for (const id of ['r4', 'r5']) await svc.wait(id);
    await until(async () => (await svc.store.counts()).done === 2);
    const kept = (await svc.store.listResults()).items.map((r) => r.id);
    expect(kept).toHaveLength(2);
    expect(kept.every((id) => ['r3', 'r4', 'r5'].includes(id))).toBe(true);
    expect(await svc.get('r1')).toBeUndefined(); // forgotten: its id may be submitted again
    await until(() => svc.status().rollouts.total === 2);
  });

  it('leaves work in the store for nodes when it does not run it itself; a lost node\'s late commit is stale', async () => {
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url], runLocally: 'never', heartbeatMs: 20, nodeTimeoutMs: 150 });
    await svc.submit([task('a', 1), task('b', 2)]);
    expect(await svc.store.counts()).toMatchObject({ queued: 2 });
    expect(svc.status().stages.init.queued).toBe(2);

    // a node that claims both, runs one and goes silent
    const registered = await svc.registerNode(node('n-lost'));
    expect(registered).toEqual({ node_id: 'n-lost', credential: expect.stringMatching(/^[\w-]{43}$/), lease_ms: 30_000, heartbeat_ms: 20, node_timeout_ms: 150 });
    const nLost = registered;
    // it heartbeats until then, as a node does: a loaded machine can take longer than the 150 ms
    // timeout to run and commit the first (it was then lost already, and that commit stale)
    const beating = setInterval(() => void svc.heartbeat(nLost, []).catch(() => {}), 20);
    cleanups.push(async () => clearInterval(beating));
    const claims = await svc.claimForNode(nLost, 2, 0);
    expect(claims.map((c) => [c.rollout_id, c.attempt])).toEqual([['a', 1], ['b', 1]]);
    expect((await svc.get('a'))!.state).toBe('queued'); // leased, not started on the node yet
    const runner = new RolloutRunner({ environments: [counterEnvironment], models: { forRollout: (id, p) => (request, signal) => svc.modelTurn(nLost, { rollout_id: id, attempt: 1, ...request }, signal), release: () => undefined } });
    cleanups.push(() => runner.close());
    const early = await runner.run({ id: 'a', taskId: 'a', sampleIndex: 0, attempt: 1, task: claims[0]!.task });
    expect(early).toMatchObject({ state: 'done', reward: 1 });
    expect(await svc.commitFromNode(nLost, [{ rollout_id: 'a', attempt: 1, result: early }])).toEqual(['committed']);
    clearInterval(beating);
    const late = await runner.run({ id: 'b', taskId: 'b', sampleIndex: 0, attempt: 1, task: claims[1]!.task });

    // silent past its timeout: lost, its other rollout re-issued
    await until(() => svc.nodes().find((n) => n.node_id === 'n-lost')?.state === 'lost');
    expect((await svc.heartbeat(nLost, [{ rollout_id: 'b', attempt: 1, stage: 'eval' }])).lost).toEqual(['b']);
    const n2 = await svc.registerNode(node('n-2'));
    const again = await svc.claimForNode(n2, 4, 0);
    expect(again.map((c) => [c.rollout_id, c.attempt])).toEqual([['b', 2]]);
    // the lost node's result comes in late: refused, and its policy calls are refused too
    expect(await svc.commitFromNode(nLost, [{ rollout_id: 'b', attempt: 1, result: late }])).toEqual(['stale']);
    await expect(svc.modelTurn(nLost, { rollout_id: 'b', attempt: 1, messages: [], tools: [] }, new AbortController().signal)).rejects.toMatchObject({ code: 'CONFLICT' });
    const waited = svc.wait('b');
    const current: RolloutResult = { ...late, reward: 1, finished_at: new Date().toISOString() };
    expect(await svc.commitFromNode(n2, [{ rollout_id: 'b', attempt: 2, result: current }, { rollout_id: 'b', attempt: 2, result: current }])).toEqual(['committed', 'duplicate']);
    expect((await waited).finished_at).toBe(current.finished_at);
    expect(await svc.store.counts()).toEqual({ queued: 0, leased: 0, done: 2, failed: 0, cancelled: 0 });
    expect((await svc.store.listResults()).items.map((r) => r.id).sort()).toEqual(['a', 'b']);
  });

  it('refuses a node that lacks one of its environments, and unknown nodes', async () => {
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url] });
    await expect(svc.registerNode({ ...node('n'), environments: ['math'] })).rejects.toMatchObject({ code: 'UNPROCESSABLE', message: expect.stringMatching(/does not serve environment counter/) });
    await expect(svc.heartbeat({ node_id: 'nobody' }, [])).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(svc.claimForNode({ node_id: 'nobody' }, 1, 0)).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('delivers a cancel to the node holding the rollout with its next heartbeat', async () => {
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url], runLocally: 'never' });
    await svc.submit([task('c')]);
    const n = await svc.registerNode(node('n'));
    const [claim] = await svc.claimForNode(n, 1, 0);
    await svc.cancel('c');
    expect((await svc.heartbeat(n, [{ rollout_id: 'c', attempt: claim!.attempt, stage: 'run' }])).cancel).toEqual(['c']);
    expect((await svc.get('c'))!.state).toBe('run'); // as the node reported it
  });

  it('ends cancelled a rollout cancelled while a node held it, when that node is lost before it heard', async () => {
    const fake = await policy({ script: () => 'done' });
    // a node timeout that registering and claiming fit in on a loaded host (the node must not be lost before its claim)
    const svc = await service({ backends: [fake.url], runLocally: 'never', heartbeatMs: 20, nodeTimeoutMs: 1_000 });
    await svc.submit([task('c')]);
    const gone = await svc.registerNode(node('n-gone'));
    expect(await svc.claimForNode(gone, 1, 0)).toHaveLength(1);
    const view = await svc.cancel('c');
    expect(view.state).toBe('queued'); // leased; the node would hear at its next heartbeat, but it never comes
    await until(() => svc.nodes().find((n) => n.node_id === 'n-gone')?.state === 'lost');
    const next = await svc.registerNode(node('n-next'));
    expect(await svc.claimForNode(next, 1, 0)).toEqual([]); // not handed out again
    expect(await svc.wait('c')).toMatchObject({ state: 'cancelled', critical_error: 'cancelled', filter: true });
    expect(fake.requests).toHaveLength(0);
  });

  it('forgets a node that left or was lost once its retention has passed; one that comes back registers again', async () => {
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url], runLocally: 'never', heartbeatMs: 20, nodeTimeoutMs: 1_000, nodeRetentionMs: 4_000 });
    const leaving = await svc.registerNode(node('leaving'));
    const silent = await svc.registerNode(node('silent'));
    const alive = await svc.registerNode(node('alive'));
    await svc.deregisterNode(leaving);
    // a node that keeps its heartbeats stays, however long
    let beating = true;
    const beats = (async () => {
      while (beating) {
        await svc.heartbeat(alive, []);
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    const listed = () => svc.nodes().map((n) => `${n.node_id} ${n.state}`).sort();
    // the silent one is lost, and both departed nodes are still listed for a while
    await until(() => listed().includes('silent lost'));
    expect(listed()).toEqual(['alive up', 'leaving left', 'silent lost']);
    await until(() => listed().length === 1);
    expect(listed()).toEqual(['alive up']);
    beating = false;
    await beats;
    // a forgotten node that heartbeats is not known (the agent registers again on that answer)
    await expect(svc.heartbeat(silent, [])).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await svc.registerNode(node('silent'));
    expect(svc.nodes().find((n) => n.node_id === 'silent')?.state).toBe('up');
  });

  it('runs on PostgreSQL: a database restart mid-batch loses and duplicates nothing, and a new service finds the results', async () => {
    const pg = await startTestPostgres();
    cleanups.push(() => pg.close());
    const url = await pg.createDatabase('rollouts');
    const fake = await policy({ script: () => ({ content: 'done', latencyMs: 30 }) });
    const { service: first, close } = await startTestRolloutService({ environments: [counterEnvironment], backends: [fake.url], store: url, pools: { run: 4 } });
    const tasks = Array.from({ length: 40 }, (_, i) => task(`p${i}`, i));
    await first.submit(tasks);
    await until(() => first.status().rollouts.done >= 5);
    await pg.restart();
    const results = await Promise.all(tasks.map((t) => first.wait(t.id!)));
    expect(results.every((r) => r.state === 'done' && r.reward === 1)).toBe(true);
    expect(await first.store.counts()).toEqual({ queued: 0, leased: 0, done: 40, failed: 0, cancelled: 0 });
    expect(fake.requests).toHaveLength(40); // each ran once
    await close();

    const second = await service({ backends: [fake.url], store: url });
    expect(second.status().rollouts).toMatchObject({ total: 40, done: 40, in_flight: 0 });
    expect((await second.get('p7'))?.result?.reward).toBe(1);
    expect((await second.submit([tasks[7]!]))[0]!.existing).toBe(true);
  });
});

describe('rollout service: store URLs', () => {
  it('keeps results in a SQLite file across services, and says what is wrong with a bad URL', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-store-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const fake = await policy({ script: () => 'done' });
    const url = `sqlite://${join(dir, 'nested', 'store.db')}`;
    const first = await service({ backends: [fake.url], store: url });
    await first.submit([task('s1')]);
    await first.wait('s1');
    const second = await service({ backends: [fake.url], store: url });
    expect((await second.result('s1'))?.reward).toBe(1);
    await expect(service({ backends: [fake.url], store: 'mysql://x' })).rejects.toMatchObject({ code: 'BAD_REQUEST', message: expect.stringMatching(/unknown store URL/) });
  });
});
