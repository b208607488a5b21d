import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore, startRolloutServer, type RolloutResult, type RolloutServer } from '@rollserve/core/service';
import { call, counterEnvironment, startFakePolicy, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startChildService } from './fixtures/child-service.ts';

// Asynchronous RL over the real service (HTTP, store, pools) and a scripted policy: weight
// versions per turn, pauses for a weight update in both modes, an update that fails, staleness
// bounds, a SIGKILL of the service during a pause, and who may call these routes.

const TOKEN = 'trainer-token';
const NODE_TOKEN = 'node-token';
const trainer = { authorization: `Bearer ${TOKEN}` };

/** The logprob the fake policy gives every token it generates on weights of `version`. */
const logprobOf = (version: number) => -(version + 1) / 8;

/**
 * The scripted policy: each rollout adds 1 to its counter twice, reads it, then answers; every
 * token's logprob says which weights (`weights.served`) generated it. Generations of the turn
 * `weights.hold` wait until `release()`: they are the ones in flight when a pause comes.
 */
const weights = { served: 0, hold: null as number | null, held: 0, waiting: [] as Array<() => void> };
const release = () => {
  for (const wake of weights.waiting.splice(0)) wake();
};

async function reply(turn: number): Promise<FakeReply> {
  if (weights.hold === turn) {
    weights.held++;
    await new Promise<void>((resolve) => weights.waiting.push(resolve));
    weights.held--;
  }
  const logprobs = Array.from({ length: 256 }, () => logprobOf(weights.served));
  if (turn === 0 || turn === 1) return { toolCalls: [{ name: 'increment_counter', arguments: { count: 1 } }], logprobs };
  if (turn === 2) return { toolCalls: [{ name: 'get_counter_value', arguments: {} }], logprobs };
  return { content: 'done', logprobs };
}

const task = (id: string, extra: Record<string, unknown> = {}) => ({
  id,
  env: 'counter',
  row: { responses_create_params: { input: [{ role: 'user', content: `count for ${id}` }] }, initial_count: 0, expected_count: 2 },
  policy: { model: 'fake-policy' },
  n: 2,
  ...extra,
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await check())) await sleep(20);
}

/** The results of `ids` (task ids) once all have finished, through the stream (with `query` added). */
async function resultsOf(url: string, ids: readonly string[], query = ''): Promise<RolloutResult[]> {
  const answer = await call(url, 'GET', `/v1/rollouts/stream?ids=${ids.join(',')}${query}`, undefined, trainer);
  expect(answer.status).toBe(200);
  return answer.text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as RolloutResult);
}

/** What the fake policy was asked, per rollout and turn (aborted generations included). */
function asked(fake: FakePolicy, rolloutId: string): number[] {
  return fake.calls
    .filter((c) => c.headers['x-rollout-id'] === rolloutId)
    .map((c) => (c.body.messages as Array<{ role: string }>).filter((m) => m.role === 'assistant').length);
}

/** Every turn's logprobs are those of the weights its `weight_version` names. */
function expectLogprobsOfVersions(result: RolloutResult): void {
  for (const turn of result.turns) {
    expect(turn.weight_version).not.toBeNull();
    expect(new Set(turn.generation_logprobs)).toEqual(new Set([logprobOf(turn.weight_version!)]));
  }
}

describe('weight versions and pauses for weight updates', () => {
  let fake: FakePolicy;
  let server: RolloutServer;

  beforeAll(async () => {
    fake = await startFakePolicy({ script: (_request, ctx) => reply(ctx.turn) });
    server = await startRolloutServer({ environments: [counterEnvironment], llmBackends: [fake.url], token: TOKEN, nodeToken: NODE_TOKEN, defaultModel: 'fake-policy' });
  }, 60_000);

  afterEach(async () => {
    // whatever a test left: generation goes on, nothing held
    weights.hold = null;
    release();
    await call(server.url, 'POST', '/v1/weights/resume', {}, trainer);
  });

  afterAll(async () => {
    release();
    await server?.close();
    await fake?.close();
  });

  const post = (path: string, body: unknown, headers: Record<string, string> = trainer) => call(server.url, 'POST', path, body, headers);

  it('are the trainer\'s routes: no token or the node token is refused, bad input is a 4xx', async () => {
    for (const headers of [{}, { authorization: `Bearer ${NODE_TOKEN}` }]) {
      expect((await post('/v1/weights', { version: 1 }, headers)).status).toBe(401);
      expect((await post('/v1/weights/pause', {}, headers)).status).toBe(401);
      expect((await post('/v1/weights/resume', { version: 1 }, headers)).status).toBe(401);
      expect((await call(server.url, 'GET', '/v1/weights', undefined, headers)).status).toBe(401);
    }
    expect((await call(server.url, 'GET', '/v1/weights', undefined, trainer)).json).toMatchObject({ newest: null, pause: null });
    expect((await post('/v1/weights', { version: 1.5 })).status).toBe(422);
    expect((await post('/v1/weights', { version: 1, backends: [] })).status).toBe(422);
    expect((await post('/v1/weights', { version: 1, colour: 'red' })).status).toBe(422);
    expect((await post('/v1/weights', { version: 1, backends: ['elsewhere'] })).status).toBe(404);
    expect((await post('/v1/weights/pause', { mode: 'later' })).status).toBe(422);
    expect((await post('/v1/weights/resume', { version: -2 })).status).toBe(422);
    expect((await post('/v1/rollouts', { tasks: [task('bad-bound')], staleness: { max_versions: -1 } })).status).toBe(422);
    expect((await call(server.url, 'GET', '/v1/rollouts/stream?ids=x&stale=filter', undefined, trainer)).status).toBe(422);
    // nothing changed by what was refused
    expect((await call(server.url, 'GET', '/v1/weights', undefined, trainer)).json).toMatchObject({ newest: null, pause: null });
  });

  it('an update mid-batch (abort): paused turns are redone once on the new weights, each turn keeps its version and logprobs, staleness honoured', async () => {
    weights.served = 0;
    expect((await post('/v1/weights', { version: 0 })).json).toMatchObject({ newest: 0, default: 0 });
    const backend = ((await call(server.url, 'GET', '/v1/llm-backends', undefined, trainer)).json as any).backends[0];
    expect(backend.weight_version).toBe(0);
    weights.hold = 1;
    const ids = ['mid-a', 'mid-b', 'mid-c'];
    const flagged = ['mid-flag'];
    const filtered = ['mid-filter'];
    expect(
      (
        await post('/v1/rollouts', {
          tasks: [...ids.map((id) => task(id)), task(flagged[0]!, { staleness: { max_versions: 0 } })],
          // the batch's bound for its tasks that name none (here: none of these but the next batch)
        })
      ).status,
    ).toBe(202);
    expect((await post('/v1/rollouts', { tasks: [task(filtered[0]!)], staleness: { max_versions: 0, action: 'filter' } })).status).toBe(202);
    // every rollout's second turn is being generated
    await until(() => weights.held === 10);

    const paused = await post('/v1/weights/pause', { mode: 'abort' });
    expect(paused.status).toBe(200);
    expect(paused.json).toMatchObject({ mode: 'abort', in_flight: 10, aborted: 10, state: { pause: { mode: 'abort' } } });
    expect(((await call(server.url, 'GET', '/v1/status', undefined, trainer)).json as any).weights).toMatchObject({ paused: true, in_flight: 0 });
    const metrics = (await call(server.url, 'GET', '/metrics', undefined, trainer)).text;
    expect(metrics).toMatch(/^rollserve_generation_paused 1$/m);
    expect(metrics).toMatch(/^rollserve_weight_version_newest 0$/m);
    // the trainer syncs its weights; meanwhile no policy call starts
    weights.hold = null;
    release();
    weights.served = 1;
    const asks = fake.calls.length;
    await sleep(300);
    expect(fake.calls.length).toBe(asks);

    const resumed = await post('/v1/weights/resume', { version: 1 });
    expect(resumed.json).toMatchObject({ newest: 1, default: 1, pause: null });
    expect((resumed.json as any).paused_ms).toBeGreaterThan(0);

    const results = await resultsOf(server.url, [...ids, ...flagged, ...filtered]);
    expect(results).toHaveLength(10);
    for (const result of results) {
      // the counter (tool state) survived the pause: 0 + 1 + 1
      expect(result).toMatchObject({ state: 'done', reward: 1, critical_error: null, weight_version_min: 0, weight_version_max: 1 });
      expect(result.turns.map((turn) => turn.weight_version)).toEqual([0, 1, 1, 1]);
      expectLogprobsOfVersions(result);
      // the aborted second turn was asked twice, recorded once
      expect(asked(fake, result.id)).toEqual([0, 1, 1, 2, 3]);
    }
    const byTask = (taskId: string) => results.filter((r) => r.task_id === taskId);
    for (const id of ids) for (const r of byTask(id)) expect(r).toMatchObject({ stale: false, filter: false });
    // a task's bound: flagged (kept, stale) or filtered (stale and filter: true, not an infrastructure failure)
    for (const r of byTask('mid-flag')) expect(r).toMatchObject({ stale: true, filter: false, critical_error: null });
    for (const r of byTask('mid-filter')) expect(r).toMatchObject({ stale: true, filter: true, critical_error: null, error: null });

    // a stream's bound: flag marks, filter leaves out; groups alike
    const marked = await resultsOf(server.url, ids, '&max_staleness=0');
    expect(marked.map((r) => r.stale)).toEqual(marked.map(() => true));
    expect(await resultsOf(server.url, ids, '&max_staleness=0&stale=filter')).toEqual([]);
    expect((await resultsOf(server.url, ids, '&max_staleness=1&stale=filter')).map((r) => r.stale)).toEqual(ids.flatMap(() => [false, false]));
    const groups = await call(server.url, 'POST', '/v1/rollouts/groups/stream', { ids, staleness: { max_versions: 0, action: 'filter' } }, trainer);
    expect(groups.text.trim()).toBe('');
    const kept = await call(server.url, 'GET', `/v1/rollouts/groups/stream?ids=${ids.join(',')}&max_staleness=0&view=training`, undefined, trainer);
    const views = kept.text.trim().split('\n').flatMap((line) => (JSON.parse(line) as { results: Array<Record<string, any>> }).results);
    expect(views).toHaveLength(6);
    for (const view of views) {
      expect(view).toMatchObject({ weight_version_min: 0, weight_version_max: 1, stale: true });
      expect(view.turns.map((turn: { weight_version: number }) => turn.weight_version)).toEqual([0, 1, 1, 1]);
    }
  }, 60_000);

  it('an update with in-flight generations left to finish: they keep the old version, later turns the new', async () => {
    weights.served = 1;
    await post('/v1/weights', { version: 1 });
    weights.hold = 2;
    expect((await post('/v1/rollouts', { tasks: [task('fin-a'), task('fin-b')] })).status).toBe(202);
    await until(() => weights.held === 4);
    let answered = false;
    const pausing = post('/v1/weights/pause', { mode: 'finish' }).then((answer) => {
      answered = true;
      return answer;
    });
    // the pause is answered once the generations in flight are done, not before
    await until(async () => ((await call(server.url, 'GET', '/v1/weights', undefined, trainer)).json as any).pause !== null);
    await sleep(100);
    expect(answered).toBe(false);
    weights.hold = null;
    release(); // they end on version 1's weights
    const paused = await pausing;
    expect(paused.json).toMatchObject({ mode: 'finish', in_flight: 4, aborted: 0 });
    weights.served = 2;
    await post('/v1/weights/resume', { version: 2 });
    const results = await resultsOf(server.url, ['fin-a', 'fin-b']);
    for (const result of results) {
      expect(result).toMatchObject({ state: 'done', reward: 1, weight_version_min: 1, weight_version_max: 2 });
      expect(result.turns.map((turn) => turn.weight_version)).toEqual([1, 1, 1, 2]);
      expectLogprobsOfVersions(result);
      expect(asked(fake, result.id)).toEqual([0, 1, 2, 3]);
    }
  }, 60_000);

  it('an update that fails: resumed without a version, generation goes on on the old weights; the pause is not charged to the time limit', async () => {
    weights.served = 2;
    await post('/v1/weights', { version: 2 });
    weights.hold = 1;
    // a time limit shorter than the pause
    expect((await post('/v1/rollouts', { tasks: [task('fail-a', { limits: { time_limit_s: 2 } })] })).status).toBe(202);
    await until(() => weights.held === 2);
    expect((await post('/v1/weights/pause', {})).json).toMatchObject({ mode: 'abort', aborted: 2 });
    weights.hold = null;
    release();
    await sleep(2_500);
    // the update failed: the backends still serve version 2
    const resumed = await post('/v1/weights/resume', {});
    expect(resumed.json).toMatchObject({ newest: 2, default: 2, pause: null });
    const results = await resultsOf(server.url, ['fail-a']);
    for (const result of results) {
      expect(result).toMatchObject({ state: 'done', reward: 1, critical_error: null, weight_version_min: 2, weight_version_max: 2 });
      expectLogprobsOfVersions(result);
      expect(asked(fake, result.id)).toEqual([0, 1, 1, 2, 3]);
    }
  }, 60_000);
});

describe('a service killed during a pause for a weight update', () => {
  const cleanups: Array<() => Promise<void>> = [];
  afterAll(async () => {
    release();
    while (cleanups.length) await cleanups.pop()!();
  });

  function startChild(options: { store: string; llm: string }) {
    return startChildService('counter-server.ts', options, cleanups);
  }

  it('stays paused after its restart, loses and duplicates nothing, and runs what it held on the new weights after the resume', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-weights-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const fake = await startFakePolicy({ script: (_request, ctx) => reply(ctx.turn) });
    cleanups.push(() => fake.close());
    const store = `sqlite://${join(dir, 'store.db')}`;
    weights.served = 0;
    weights.hold = 1;

    const first = await startChild({ store, llm: fake.url });
    await call(first.url, 'POST', '/v1/weights', { version: 0 });
    expect((await call(first.url, 'POST', '/v1/rollouts', { tasks: [task('kill-a'), task('kill-b')] })).status).toBe(202);
    await until(() => weights.held === 4);
    expect((await call(first.url, 'POST', '/v1/weights/pause', { mode: 'abort' })).json).toMatchObject({ aborted: 4 });
    first.child.kill('SIGKILL');
    await once(first.child, 'exit');
    weights.hold = null;
    release();
    weights.served = 1;

    const second = await startChild({ store, llm: fake.url });
    // still mid-update: paused, on the version it had
    expect((await call(second.url, 'GET', '/v1/weights')).json).toMatchObject({ newest: 0, pause: { mode: 'abort' } });
    // what the killed service ran is run again, and waits at its first turn
    const asks = fake.calls.length;
    await until(async () => ((await call(second.url, 'GET', '/v1/status')).json as any).stages.run.active === 4);
    await sleep(300);
    expect(fake.calls.length).toBe(asks);

    expect((await call(second.url, 'POST', '/v1/weights/resume', { version: 1 })).json).toMatchObject({ newest: 1, pause: null });
    const results = await resultsOf(second.url, ['kill-a', 'kill-b']);
    expect(results.map((r) => r.id).sort()).toEqual(['kill-a:0', 'kill-a:1', 'kill-b:0', 'kill-b:1']);
    for (const result of results) {
      // re-run from its start (its session died with the service): every turn on the new weights
      expect(result).toMatchObject({ state: 'done', reward: 1, weight_version_min: 1, weight_version_max: 1 });
      expect(result.turns.map((turn) => turn.weight_version)).toEqual([1, 1, 1, 1]);
      expectLogprobsOfVersions(result);
    }
    await call(second.url, 'POST', '/v1/weights/pause', { mode: 'finish' });
    second.child.kill('SIGTERM');
    await once(second.child, 'exit');
    // one result per rollout in the store
    const opened = await openStore(store);
    try {
      expect((await opened.listResults({ limit: 100 })).items.map((r) => r.id).sort()).toEqual(['kill-a:0', 'kill-a:1', 'kill-b:0', 'kill-b:1']);
      expect(await opened.getSetting('weights')).toMatchObject({ newest: 1, pause: { mode: 'finish' } });
    } finally {
      await opened.close();
    }
  }, 120_000);
});
