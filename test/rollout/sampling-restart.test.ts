import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defineEnvironment } from '@rollserve/core';
import { openStore, RolloutTask } from '@rollserve/core/service';
import { call, startFakePolicy, startTestPostgres, startTestRolloutService, type FakePolicy } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { startChildService } from './fixtures/child-service.ts';
import { z } from 'zod';

// A dynamic sampling outlives its service: killed (SIGKILL) or stopped (SIGTERM) in the middle of a
// sampling, the service started again on the same store goes on with it and delivers exactly the
// informative groups asked for, each task of the pool started at most once, the counts right; the
// surplus samples an ended sampling had not cancelled yet are cancelled on start.

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

/** The service of fixtures/sampling-server.ts in a child process; resolves with its URL. */
function startChild(options: { store: string; llm: string; killAfter?: { task: string; samples: number } }) {
  return startChildService('sampling-server.ts', options, cleanups);
}

/**
 * The scripted policy: sample k of a rollout answers "sample k" (so a 'mixed' group is informative,
 * a 'same' one all-equal); while `held` is set, a prompt starting with "hold" is never answered.
 */
async function policy(): Promise<FakePolicy & { held: { on: boolean } }> {
  const held = { on: true };
  const fake = await startFakePolicy({
    script: (req, ctx) => {
      const first = (req.messages.find((m) => (m as { role: string }).role === 'user') as { content: string }).content;
      if (held.on && first.startsWith('hold')) return { content: 'never', hang: true };
      return `sample ${(ctx.headers['x-rollout-id'] ?? '').split(':').at(-1)}`;
    },
  });
  cleanups.push(() => fake.close());
  return Object.assign(fake, { held });
}

const task = (id: string, kind: 'mixed' | 'same', hold = false) => ({
  id,
  env: 'coin',
  n: 2,
  row: { responses_create_params: { input: `${hold ? 'hold ' : ''}${kind} ${id}` }, kind },
  policy: { model: 'fake-policy' },
});

/** The NDJSON lines of a stream, read to its end. */
async function lines(url: string, path: string): Promise<any[]> {
  const answer = await call(url, 'GET', path);
  expect(answer.status, answer.text).toBe(200);
  return answer.text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line));
}

/** Policy calls per rollout id (a generation cut by the kill included). */
function asked(fake: FakePolicy): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const c of fake.calls) {
    const id = c.headers['x-rollout-id'];
    if (id) counts[id] = (counts[id] ?? 0) + 1;
  }
  return counts;
}

/** What the store holds, read by a connection of its own: tasks, one entry per stored result, the sampling. */
async function stored(url: string, samplingId: string) {
  const store = await openStore(url);
  try {
    const rollouts = (await store.listRollouts({ limit: 10_000 })).items;
    const results = (await store.listResults({ limit: 10_000 })).items;
    return { taskIds: [...new Set(rollouts.map((r) => r.taskId))], resultIds: results.map((r) => r.id), counts: await store.counts(), sampling: await store.getSampling(samplingId) };
  } finally {
    await store.close();
  }
}

// s1 all-equal, m1 informative, h1 all-equal (held while the first service runs), m2 informative
// (the first service is killed the moment its last sample is stored), then the rest of the pool
const pool = [task('s1', 'same'), task('m1', 'mixed'), task('h1', 'same', true), task('m2', 'mixed'), task('s2', 'same'), task('m3', 'mixed'), task('m4', 'mixed'), task('m5', 'mixed')];
const outcomes = [
  { task_id: 's1', outcome: 'all_equal' },
  { task_id: 'm1', outcome: 'kept' },
  { task_id: 'h1', outcome: 'all_equal' },
  { task_id: 'm2', outcome: 'kept' },
  { task_id: 's2', outcome: 'all_equal' },
  { task_id: 'm3', outcome: 'kept' },
];
const tried = outcomes.map((o) => o.task_id);
const samplesOf = (ids: readonly string[]) => ids.flatMap((id) => [`${id}:0`, `${id}:1`]);
const end = { id: 'step-1', state: 'done', groups: 3, max_groups: 8, max_in_flight: 2, pool: 8, tried: 6, kept: 3, dropped_all_equal: 3, filtered: 0, cancelled: 0, running: 0, kept_task_ids: ['m1', 'm2', 'm3'], tasks: outcomes, error: null };

describe('a dynamic sampling across a restart of its service', () => {
  it('goes on after a SIGKILL: the group stored before the kill is judged, the one cut short runs again, the pool goes on to exactly the target', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-sampling-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const store = `sqlite://${join(dir, 'store.db')}`;
    const fake = await policy();

    const first = await startChild({ store, llm: fake.url, killAfter: { task: 'm2', samples: 2 } });
    const answer = await call(first.url, 'POST', '/v1/rollouts', { tasks: pool, dynamic_sampling: { id: 'step-1', groups: 3, max_in_flight: 2 } });
    expect(answer.status, answer.text).toBe(202);
    expect((answer.json as any).tasks.map((t: any) => t.task_id)).toEqual(['s1', 'm1']);
    // it kills itself once m2 is stored, h1 hanging in its pools
    await once(first.child, 'exit');
    expect(first.child.signalCode).toBe('SIGKILL');
    const killed = await stored(store, 'step-1');
    expect(killed.taskIds).toEqual(['s1', 'm1', 'h1', 'm2']);
    expect(killed.resultIds.sort()).toEqual(samplesOf(['s1', 'm1', 'm2']).sort());
    // m2's results are stored, its judgment is not
    expect(killed.sampling).toMatchObject({ state: 'running', next: 4 });
    expect(killed.sampling!.groups.map((g) => [g.taskId, g.outcome])).toEqual([['s1', 'all_equal'], ['m1', 'kept'], ['h1', 'running'], ['m2', 'running']]);
    const before = asked(fake);

    fake.held.on = false;
    const second = await startChild({ store, llm: fake.url });
    // the stream of the sampling, opened after the restart: every kept group, then the counts
    const items = await lines(second.url, '/v1/rollouts/sampling/step-1/stream');
    expect(items.slice(0, -1).map((group) => group.task_id)).toEqual(['m1', 'm2', 'm3']);
    for (const group of items.slice(0, -1)) {
      expect(group.results.map((r: any) => [r.id, r.reward])).toEqual([[`${group.task_id}:0`, 1], [`${group.task_id}:1`, 0]]);
      expect(group.results.every((r: any) => typeof r.advantage === 'number')).toBe(true);
    }
    expect(items.at(-1)).toEqual({ sampling: { ...end, metric: 'reward' } });
    expect((await call(second.url, 'GET', '/v1/rollouts/sampling/step-1')).json).toEqual(items.at(-1).sampling);
    // the pool past the target was never started
    for (const id of ['m4', 'm5']) expect((await call(second.url, 'GET', `/v1/rollouts/${id}`)).status).toBe(404);
    // a retried submit answers the sampling and starts nothing
    const again = await call(second.url, 'POST', '/v1/rollouts', { tasks: pool, dynamic_sampling: { id: 'step-1', groups: 3, max_in_flight: 2 } });
    expect(again.json).toMatchObject({ tasks: [], sampling: items.at(-1).sampling });

    // nothing ran twice: what finished before the kill was not asked again; h1, cut short by the
    // kill, ran once more from its start; s2 and m3 started after the restart, once
    const calls = asked(fake);
    expect(Object.keys(calls).sort()).toEqual(samplesOf(tried).sort());
    for (const id of samplesOf(['s1', 'm1', 'm2'])) expect([id, before[id], calls[id]]).toEqual([id, 1, 1]);
    for (const id of samplesOf(['h1'])) expect([id, before[id], calls[id]]).toEqual([id, 1, 2]);
    for (const id of samplesOf(['s2', 'm3'])) expect([id, before[id], calls[id]]).toEqual([id, undefined, 1]);

    second.child.kill('SIGTERM');
    await once(second.child, 'exit');
    const after = await stored(store, 'step-1');
    expect(after.taskIds).toEqual(tried);
    expect(after.resultIds.sort()).toEqual(samplesOf(tried).sort()); // one result per rollout
    expect(after.counts).toMatchObject({ queued: 0, leased: 0, done: 12, failed: 0, cancelled: 0 });
    expect(after.sampling).toMatchObject({ state: 'done', pool: [], poolSize: 8 });
  }, 120_000);

  it('cancels on start the surplus samples of a sampling that ended just before its service stopped', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-sampling-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const url = `sqlite://${join(dir, 'store.db')}`;
    // what a service killed between storing a sampling's end and cancelling its surplus group leaves
    const surplus = RolloutTask.parse(task('x1', 'mixed'));
    const before = await openStore(url);
    await before.putSampling({ id: 'ended', settings: { groups: 1, maxGroups: 2, maxInFlight: 2, metric: 'reward' }, pool: [RolloutTask.parse(task('x0', 'mixed')), surplus] });
    await before.updateSampling('ended', { started: [{ taskId: 'x0', position: 0 }, { taskId: 'x1', position: 1 }], next: 2 });
    await before.putTasks([surplus]);
    await before.updateSampling('ended', { outcomes: [{ taskId: 'x0', outcome: 'kept', kept: 0 }, { taskId: 'x1', outcome: 'cancelled' }], end: { state: 'done', error: null } });
    await before.close();

    const fake = await startFakePolicy({ script: () => ({ content: 'never', hang: true }) });
    cleanups.push(() => fake.close());
    const coin = defineEnvironment({ name: 'coin', domain: 'other', row: z.object({ kind: z.string() }), verify: () => ({ reward: 1 }) });
    const { service, close } = await startTestRolloutService({ environments: [coin], backends: [fake.url], store: url });
    cleanups.push(close);
    for (const id of ['x1:0', 'x1:1']) expect(await service.wait(id)).toMatchObject({ state: 'cancelled', critical_error: 'cancelled' });
    expect((await service.sampling('ended'))?.status()).toMatchObject({ state: 'done', tried: 2, kept: 1, cancelled: 1, kept_task_ids: ['x0'] });
  });

  it('goes on after a SIGTERM on PostgreSQL, and an ended sampling stays readable, its stream whole, after another restart', async () => {
    const postgres = await startTestPostgres();
    cleanups.push(() => postgres.close());
    const store = await postgres.createDatabase();
    const fake = await policy();

    const first = await startChild({ store, llm: fake.url });
    const answer = await call(first.url, 'POST', '/v1/rollouts', { tasks: pool, dynamic_sampling: { id: 'step-1', groups: 3, max_in_flight: 2 } });
    expect(answer.status, answer.text).toBe(202);
    // stopped while h1 hangs: a stopped service is not a stopped sampling
    while (!fake.calls.some((c) => c.headers['x-rollout-id']?.startsWith('h1:'))) await new Promise((resolve) => setTimeout(resolve, 20));
    first.child.kill('SIGTERM');
    await once(first.child, 'exit');
    const stopped = await stored(store, 'step-1');
    expect(stopped.sampling).toMatchObject({ state: 'running', error: null });
    expect(stopped.sampling!.groups.find((g) => g.taskId === 'h1')?.outcome).toBe('running');

    fake.held.on = false;
    const second = await startChild({ store, llm: fake.url });
    const items = await lines(second.url, '/v1/rollouts/sampling/step-1/stream?view=training');
    // the informative groups, in the order they were kept (`kept_task_ids`): unlike the SIGKILL
    // case above, where m2's samples were stored before the kill, the stop may cut m2 short, and
    // run again it may be judged after m3
    const kept = items.slice(0, -1).map((group) => group.task_id);
    expect([...kept].sort()).toEqual(['m1', 'm2', 'm3']);
    expect(items.at(-1).sampling).toMatchObject({ state: 'done', tried: 6, kept: 3, dropped_all_equal: 3, cancelled: 0, running: 0, tasks: outcomes, kept_task_ids: kept });
    second.child.kill('SIGTERM');
    await once(second.child, 'exit');

    // ended: read from the store by the next service, its stream the same
    const third = await startChild({ store, llm: fake.url });
    expect((await call(third.url, 'GET', '/v1/rollouts/sampling/step-1')).json).toEqual(items.at(-1).sampling);
    expect(await lines(third.url, '/v1/rollouts/sampling/step-1/stream?view=training')).toEqual(items);
    expect((await call(third.url, 'GET', '/v1/rollouts/sampling/never')).status).toBe(404);
    const calls = asked(fake);
    expect(Object.keys(calls).sort()).toEqual(samplesOf(tried).sort());
    third.child.kill('SIGTERM');
    await once(third.child, 'exit');
    const after = await stored(store, 'step-1');
    expect(after.resultIds.sort()).toEqual(samplesOf(tried).sort());
    expect(after.counts).toMatchObject({ queued: 0, leased: 0, done: 12 });
  }, 180_000);
});
