import { appendFile, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { RolloutError } from '@rollserve/core';
import {
  buildResponse,
  importJournal,
  openStore,
  RolloutTask,
  type JournalRecord,
  type OpenStoreOptions,
  type RolloutResult,
  type RolloutStore,
  type RolloutTaskInput,
  type TurnRecord,
} from '@rollserve/core/service';

// The suite's fixtures: a task and a stored result (exported for an engine's own tests as storeSuiteTask, storeSuiteResult).
const task = (id: string, n = 1, extra: Partial<RolloutTaskInput> = {}): RolloutTask =>
  RolloutTask.parse({ id, env: 'math', row: { responses_create_params: { input: `question ${id}` } }, policy: { model: 'm' }, n, ...extra });

const result = (id: string, taskId: string, sampleIndex = 0, extra: Partial<RolloutResult> = {}): RolloutResult => ({
  id,
  task_id: taskId,
  sample_index: sampleIndex,
  env: 'math',
  state: 'done',
  reward: 1,
  reward_components: null,
  verify_extras: { extracted_answer: '42' },
  critical_error: null,
  filter: false,
  error: null,
  advantage: null,
  credit: null,
  timing: { init: { queued_ms: 0, active_ms: 1 }, run: { queued_ms: 0, active_ms: 2 }, eval: { queued_ms: 0, active_ms: 3 }, total_ms: 6 },
  response: null,
  messages: [{ role: 'user', content: `question ${taskId}` }, { role: 'assistant', content: '42' }],
  turns: [],
  weight_version_min: null,
  weight_version_max: null,
  stale: false,
  finished_at: '2026-01-01T00:00:00.000Z',
  ...extra,
});

/** A result as the agent loop makes one: each turn's prompt is the last one, its generation and a tool's output. */
function multiTurn(id: string, taskId: string, sampleIndex = 0, extra: Partial<RolloutResult> = {}): RolloutResult {
  const turns: TurnRecord[] = [];
  let prompt = Array.from({ length: 500 }, (_, i) => (i * 31) % 5_000);
  for (let t = 0; t < 8; t++) {
    const generation = Array.from({ length: 30 }, (_, i) => 10_000 + t * 100 + i);
    turns.push({
      index: t, prompt_token_ids: prompt, generation_token_ids: generation, generation_logprobs: generation.map((g) => -(g % 7) / 4), finish_reason: 'tool_calls',
      text: null, reasoning: null, tool_calls: [], llm_latency_ms: 1, backend: 'b', weight_version: null, code: null, status: 'none', malformed: null,
      rewards: { format: null, tool: null, outcome: null, shaping: null }, reward: 0, return: 0, normalized_return: null,
    });
    prompt = [...prompt, ...generation, ...Array.from({ length: 100 }, (_, i) => 20_000 + t * 1_000 + i)];
  }
  return result(id, taskId, sampleIndex, { turns, response: buildResponse({ id, model: 'm', turns, tools: [], usage: { input: 1, output: 1 } }), ...extra });
}

/** Every id reachable through paging. */
async function allRolloutIds(store: RolloutStore, query: Parameters<RolloutStore['listRollouts']>[0] = {}): Promise<string[]> {
  const ids: string[] = [];
  let cursor: string | null = null;
  do {
    const page = await store.listRollouts({ ...query, cursor, limit: 3 });
    ids.push(...page.items.map((r) => r.id));
    cursor = page.cursor;
  } while (cursor !== null);
  return ids;
}


/** An engine the store suite runs on: how to start it, make an empty store's URL, and reach it with its own driver. */
export interface StoreSuiteEngine {
  /** The suite's title, and the `kind` the opened store reports unless `kind` says otherwise. */
  name: string;
  kind?: string;
  start?(): Promise<void>;
  stop?(): Promise<void>;
  /** A URL for a new, empty store. */
  newUrl(): Promise<string>;
  /** Runs raw SQL on the store at `url` with the engine's own driver (the migration tests take a database back a version). */
  exec(url: string, sql: string): Promise<void>;
  /** 'pooled' when two stores opened on one URL commit concurrently (a server); 'single' for one connection per store (an embedded file). */
  connections: 'pooled' | 'single';
  /** Tests only this engine has (reopening a file, a server restart), run in the suite's describe with its store. */
  extra?(context: StoreSuiteContext): void;
}

/** What an engine's own tests see: the current test's store and URL, the suite's clock, and `open` for another store. */
export interface StoreSuiteContext {
  store(): RolloutStore;
  url(): string;
  advance(ms: number): void;
  open(url?: string, options?: OpenStoreOptions): Promise<RolloutStore>;
}

/**
 * The behaviour every store engine must show, through `openStore` and the RolloutStore interface:
 * `describeStoreSuite({ name: 'sqlite', newUrl, exec, connections: 'single' })` in an engine's tests
 * (test/store/store.test.ts runs it for SQLite and PostgreSQL). Every store it opens is closed after each test.
 */
export function describeStoreSuite(engine: StoreSuiteEngine): void {
  const kind = engine.kind ?? engine.name;
  describe(`store behaviour: ${engine.name}`, () => {
    let clock = 0;
    const opened: RolloutStore[] = [];
    let url = '';
    let store: RolloutStore;
    const open = async (at = url, options: OpenStoreOptions = {}) => {
      const s = await openStore(at, { now: () => clock, ...options });
      opened.push(s);
      return s;
    };

    beforeAll(() => engine.start?.(), 120_000);
    afterAll(() => engine.stop?.(), 120_000);
    beforeEach(async () => {
      clock = 1_000_000;
      url = await engine.newUrl();
      store = await open();
    });
    afterEach(async () => {
      await Promise.all(opened.splice(0).map((s) => s.close()));
    });

    it('applies its migrations once', async () => {
      expect(store.kind).toBe(kind);
      expect(await store.schemaVersion()).toBe(4);
      const again = await open();
      expect(await again.schemaVersion()).toBe(4);
    });

    it('accepts a commit only from the worker holding the lease at that attempt, in the same statement as the fence', async () => {
      await store.putTasks([task('a'), task('b'), task('c')]);
      const [held] = await store.claim({ workerId: 'n1', limit: 1, leaseMs: 60_000 });
      expect(held).toMatchObject({ id: 'a', attempt: 1 });
      // another node, at the very attempt of n1's lease: refused, nothing stored
      expect(await store.commit({ rolloutId: 'a', attempt: 1, result: result('a', 'a', 0, { reward: 0.777 }), workerId: 'n2' })).toEqual({ status: 'stale', currentAttempt: 1, state: 'leased' });
      // a worker that never claimed anything, for a queued rollout no one holds: refused
      expect(await store.commit({ rolloutId: 'b', attempt: 0, result: result('b', 'b', 0, { reward: 0.777 }), workerId: 'never-registered' })).toEqual({ status: 'stale', currentAttempt: 0, state: 'queued' });
      // `unheld` ends a queued rollout (the service's own cancel), never a leased one
      expect(await store.commit({ rolloutId: 'a', attempt: 1, result: result('a', 'a', 0, { reward: 0.777 }), workerId: 'service', unheld: true })).toMatchObject({ status: 'stale' });
      expect(await store.getResult('a')).toBeUndefined();
      expect(await store.getResult('b')).toBeUndefined();
      expect(await store.getRollout('a')).toMatchObject({ state: 'leased', workerId: 'n1', attempt: 1 });
      // in a batch too
      expect(await store.commitMany([{ rolloutId: 'a', attempt: 1, result: result('a', 'a', 0, { reward: 0.777 }), workerId: 'n2' }])).toEqual([{ status: 'stale', currentAttempt: 1, state: 'leased' }]);
      // the holder commits; another node repeating that commit is not told it was its own
      expect(await store.commit({ rolloutId: 'a', attempt: 1, result: result('a', 'a'), workerId: 'n1' })).toEqual({ status: 'committed' });
      expect(await store.commit({ rolloutId: 'a', attempt: 1, result: result('a', 'a', 0, { reward: 0.777 }), workerId: 'n2' })).toMatchObject({ status: 'stale' });
      expect(await store.commit({ rolloutId: 'a', attempt: 1, result: result('a', 'a'), workerId: 'n1' })).toEqual({ status: 'duplicate' });
      expect((await store.getResult('a'))?.reward).toBe(1);
      // a renewal, too, renews only the holder's own leases
      const [other] = await store.claim({ workerId: 'n2', limit: 1, leaseMs: 60_000 });
      expect(await store.renewLeases('n1', [{ rolloutId: other!.id, attempt: other!.attempt }], 60_000)).toEqual({ renewed: [], lost: [other!.id] });
      expect(await store.renewLeases('n2', [{ rolloutId: other!.id, attempt: other!.attempt }], 60_000)).toEqual({ renewed: [other!.id], lost: [] });
      // and a release of single leases (one held too long) only the holder's, at their attempt
      expect(await store.releaseLeases('n1', [{ rolloutId: other!.id, attempt: other!.attempt }])).toEqual([]);
      expect(await store.releaseLeases('n2', [{ rolloutId: other!.id, attempt: other!.attempt + 1 }])).toEqual([]);
      expect(await store.releaseLeases('n2', [{ rolloutId: other!.id, attempt: other!.attempt }])).toEqual([other!.id]);
      expect(await store.getRollout(other!.id)).toMatchObject({ state: 'queued', workerId: null });
    });

    it('renews a long list of leases across its chunks, each answered once', async () => {
      const ids = Array.from({ length: 1_300 }, (_, i) => `l${i}`);
      await store.putTasks(ids.map((id) => task(id)));
      const claimed = await store.claim({ workerId: 'n1', limit: 1_300, leaseMs: 1_000 });
      const leases = [...claimed.map((c) => ({ rolloutId: c.id, attempt: c.attempt })), { rolloutId: 'made-up', attempt: 1 }, { rolloutId: 'l0', attempt: 7 }];
      clock += 500;
      const outcome = await store.renewLeases('n1', leases, 10_000);
      expect(outcome.renewed).toHaveLength(1_300);
      expect(outcome.lost).toEqual(['made-up', 'l0']);
      clock += 5_000; // past the first lease, within the renewed one
      expect(await store.expireLeases()).toEqual([]);
    });

    it("keeps rollout nodes' credential hashes, across a reopening", async () => {
      expect(await store.getNodeCredential('n1')).toBeUndefined();
      await store.putNodeCredential({ nodeId: 'n1', credentialHash: 'aa'.repeat(32), issuedAt: 5 });
      await store.putNodeCredential({ nodeId: 'n2', credentialHash: 'bb'.repeat(32), issuedAt: 6 });
      await store.putNodeCredential({ nodeId: 'n1', credentialHash: 'cc'.repeat(32), issuedAt: 7 }); // issued again
      const again = await open();
      expect(await again.getNodeCredential('n1')).toEqual({ nodeId: 'n1', credentialHash: 'cc'.repeat(32), issuedAt: 7 });
      await again.deleteNodeCredential('n1');
      expect(await store.getNodeCredential('n1')).toBeUndefined();
      expect(await store.getNodeCredential('n2')).toMatchObject({ credentialHash: 'bb'.repeat(32) });
    });

    it('migrates a store of schema version 1 (before node credentials): its data kept, credentials kept from then on', async () => {
      await store.putTasks([task('old')]);
      await store.claim({ workerId: 'n1', limit: 1, leaseMs: 60_000 });
      await store.close();
      // back to version 1, as a database written by the release before
      const downgrade = 'DROP TABLE sampling_groups; DROP TABLE samplings; DROP TABLE settings; DROP TABLE nodes; DELETE FROM schema_version WHERE version >= 2;';
      await engine.exec(url, downgrade);
      const migrated = await open();
      expect(await migrated.schemaVersion()).toBe(4);
      expect(await migrated.getRollout('old')).toMatchObject({ state: 'leased', workerId: 'n1', attempt: 1 });
      await migrated.putNodeCredential({ nodeId: 'n1', credentialHash: 'dd'.repeat(32), issuedAt: 1 });
      expect(await migrated.getNodeCredential('n1')).toMatchObject({ credentialHash: 'dd'.repeat(32) });
    });

    it('keeps settings across a reopening (schema version 3: the weight state of a pause for a weight update)', async () => {
      expect(await store.getSetting('weights')).toBeUndefined();
      await store.putSetting('weights', { newest: 3, pause: { mode: 'abort' } });
      await store.putSetting('weights', { newest: 4, pause: null });
      const again = await open();
      expect(await again.getSetting('weights')).toEqual({ newest: 4, pause: null });
    });

    it('keeps a dynamic sampling, its groups and their outcomes across a reopening (schema version 4)', async () => {
      const settings = { groups: 2, maxGroups: 3, maxInFlight: 2, metric: 'reward' as const };
      const pool = [task('p0', 2), task('p1', 2), task('p2', 2)];
      expect(await store.putSampling({ id: 's1', settings, pool })).toBe(true);
      expect(await store.putSampling({ id: 's1', settings: { ...settings, groups: 1 }, pool: [] })).toBe(false);
      expect(await store.getSampling('s1')).toEqual({ id: 's1', settings, pool, poolSize: 3, next: 0, state: 'running', error: null, groups: [], createdAt: clock, endedAt: null });
      // two groups start (written before their tasks are stored), one is judged, one start fails
      await store.updateSampling('s1', { started: [{ taskId: 'p0', position: 0 }, { taskId: 'p1', position: 1 }], next: 2 });
      await store.putTasks([pool[0]!, pool[1]!]);
      await store.updateSampling('s1', { started: [{ taskId: 'p0', position: 0 }] }); // written twice: once
      await store.updateSampling('s1', { outcomes: [{ taskId: 'p1', outcome: 'kept', kept: 0 }] });
      await store.updateSampling('s1', { started: [{ taskId: 'p2', position: 2 }], next: 3 });
      await store.updateSampling('s1', { unstarted: ['p2'] });
      await store.updateSampling('nope', { outcomes: [{ taskId: 'p1', outcome: 'all_equal' }], end: { state: 'done', error: null } }); // changes nothing
      const again = await open();
      expect(await again.runningSamplings()).toEqual([
        {
          id: 's1', settings, pool, poolSize: 3, next: 3, state: 'running', error: null, createdAt: clock, endedAt: null,
          groups: [{ taskId: 'p0', position: 0, outcome: 'running', kept: null }, { taskId: 'p1', position: 1, outcome: 'kept', kept: 0 }],
        },
      ]);

      // the end, with its surplus group cancelled: until its samples have results, they are found
      await store.commit({ rolloutId: 'p0:0', attempt: 0, result: result('p0:0', 'p0', 0), workerId: 'service', unheld: true });
      clock += 10;
      await again.updateSampling('s1', { outcomes: [{ taskId: 'p0', outcome: 'cancelled' }], end: { state: 'stopped', error: 'why' } });
      expect(await store.runningSamplings()).toEqual([]);
      expect(await store.getSampling('s1')).toMatchObject({ state: 'stopped', error: 'why', pool: [], poolSize: 3, endedAt: clock, groups: [{ taskId: 'p0', outcome: 'cancelled' }, { taskId: 'p1', outcome: 'kept', kept: 0 }] });
      expect(await store.unfinishedCancelledSamples()).toEqual(['p0:1']);
      await store.commit({ rolloutId: 'p0:1', attempt: 0, result: result('p0:1', 'p0', 1, { state: 'cancelled' }), workerId: 'service', unheld: true });
      expect(await store.unfinishedCancelledSamples()).toEqual([]);
      expect(await store.getSampling('nope')).toBeUndefined();
    });

    it('forgets ended samplings but the last N to end, never a running one', async () => {
      const settings = { groups: 1, maxGroups: 1, maxInFlight: 1, metric: 'reward' as const };
      for (const id of ['e1', 'e2', 'e3', 'run']) {
        await store.putSampling({ id, settings, pool: [task(`${id}-t`)] });
        await store.updateSampling(id, { started: [{ taskId: `${id}-t`, position: 0 }], next: 1 });
      }
      // ended in the order e2, e3, e1
      for (const id of ['e2', 'e3', 'e1']) {
        clock += 1;
        await store.updateSampling(id, { outcomes: [{ taskId: `${id}-t`, outcome: 'all_equal' }], end: { state: 'exhausted', error: null } });
      }
      expect(await store.pruneSamplings(2)).toBe(1);
      expect(await store.getSampling('e2')).toBeUndefined();
      expect((await store.getSampling('e3'))?.state).toBe('exhausted');
      expect((await store.getSampling('e1'))?.groups).toHaveLength(1);
      expect(await store.pruneSamplings(1)).toBe(1);
      expect(await store.getSampling('e3')).toBeUndefined();
      expect(await store.pruneSamplings(1)).toBe(0);
      expect((await store.runningSamplings()).map((s) => s.id)).toEqual(['run']);
      // its groups went with it: the id is new again
      expect(await store.putSampling({ id: 'e2', settings, pool: [] })).toBe(true);
      expect((await store.getSampling('e2'))?.groups).toEqual([]);
      await store.deleteSampling('e2');
      expect(await store.getSampling('e2')).toBeUndefined();
    });

    it('puts tasks idempotently by id, a batch whole or not at all', async () => {
      const first = await store.putTasks([task('a', 2), task('b')]);
      expect(first).toEqual([
        { taskId: 'a', rolloutIds: ['a:0', 'a:1'], existing: false },
        { taskId: 'b', rolloutIds: ['b'], existing: false },
      ]);
      const second = await store.putTasks([task('a', 2), task('c'), task('c')]);
      expect(second).toEqual([
        { taskId: 'a', rolloutIds: ['a:0', 'a:1'], existing: true },
        { taskId: 'c', rolloutIds: ['c'], existing: false },
        { taskId: 'c', rolloutIds: ['c'], existing: false },
      ]);
      expect((await store.getTask('a'))?.task).toEqual(task('a', 2));
      expect(await store.counts()).toEqual({ queued: 4, leased: 0, done: 0, failed: 0, cancelled: 0 });

      // a known id with another body fails the whole batch: 'd' is not added either
      const conflict = await store.putTasks([task('d'), task('a', 3)]).catch((error: unknown) => error);
      expect(RolloutError.isInstance(conflict) && conflict.code).toBe('CONFLICT');
      // a task whose rollout id is another task's sample
      const clash = await store.putTasks([task('a:1')]).catch((error: unknown) => error);
      expect(RolloutError.isInstance(clash) && clash.code).toBe('CONFLICT');
      expect(await store.getTask('d')).toBeUndefined();
      expect(await store.getTask('a:1')).toBeUndefined();
      expect(await store.counts()).toEqual({ queued: 4, leased: 0, done: 0, failed: 0, cancelled: 0 });
    });

    it('gives concurrent claimers disjoint sets, each claim at attempt 1', async () => {
      await store.putTasks(Array.from({ length: 20 }, (_, i) => task(`t${i}`, 2)));
      // several clients (connections, pools) claiming at once
      const clients = [store, ...(await Promise.all(Array.from({ length: 4 }, () => open())))];
      const claimed = await Promise.all(
        clients.map(async (client, w) => {
          const mine: Array<{ id: string; attempt: number; taskId: string }> = [];
          for (;;) {
            const batch = await client.claim({ workerId: `w${w}`, limit: 3, leaseMs: 60_000 });
            if (batch.length === 0) return mine;
            mine.push(...batch.map(({ id, attempt, taskId, task }) => ({ id, attempt, taskId: task.id === taskId ? taskId : 'mismatch' })));
          }
        }),
      );
      const ids = claimed.flat().map((c) => c.id);
      expect(ids).toHaveLength(40);
      expect(new Set(ids).size).toBe(40);
      expect(claimed.flat().every((c) => c.attempt === 1 && c.taskId !== 'mismatch')).toBe(true);
      expect(await store.counts()).toMatchObject({ queued: 0, leased: 40 });
      const owner = await store.getRollout(claimed[1]![0]!.id);
      expect(owner).toMatchObject({ state: 'leased', workerId: 'w1', attempt: 1, leaseExpiresAt: clock + 60_000 });
    });

    it('stores a batch and claims in one go: older work first, idempotent, nothing stored on a conflict', async () => {
      await store.putTasks([task('old')]);
      const first = await store.putTasksAndClaim([task('g', 2), task('x')], { workerId: 'service', limit: 2, leaseMs: 5_000 });
      expect(first.outcomes).toEqual([
        { taskId: 'g', rolloutIds: ['g:0', 'g:1'], existing: false },
        { taskId: 'x', rolloutIds: ['x'], existing: false },
      ]);
      // claim's order: the rollout queued before this batch goes first
      expect(first.claimed.map((c) => [c.id, c.attempt, c.task.id])).toEqual([
        ['old', 1, 'old'],
        ['g:0', 1, 'g'],
      ]);
      expect(await store.getRollout('g:0')).toMatchObject({ state: 'leased', workerId: 'service', leaseExpiresAt: clock + 5_000 });
      expect(await store.counts()).toMatchObject({ queued: 2, leased: 2 });

      const again = await store.putTasksAndClaim([task('x')], { workerId: 'service', limit: 10, leaseMs: 5_000 });
      expect(again.outcomes).toEqual([{ taskId: 'x', rolloutIds: ['x'], existing: true }]);
      expect(again.claimed.map((c) => c.id)).toEqual(['g:1', 'x']);

      const clash = await store.putTasksAndClaim([task('y'), task('x', 3)], { workerId: 'service', limit: 10, leaseMs: 5_000 }).catch((error: unknown) => error);
      expect(RolloutError.isInstance(clash) && clash.code).toBe('CONFLICT');
      expect(await store.getTask('y')).toBeUndefined();
      expect(await store.counts()).toMatchObject({ queued: 0, leased: 4 });
      await expect(store.putTasksAndClaim([task('z')], { workerId: 'service', limit: 0, leaseMs: 5_000 })).rejects.toThrow(/limit/);
      expect(await store.getTask('z')).toBeUndefined();
    });

    it('re-issues a rollout whose lease expired with a higher attempt; the old holder has lost it', async () => {
      await store.putTasks([task('a'), task('b')]);
      const [a] = await store.claim({ workerId: 'n1', limit: 1, leaseMs: 1_000 });
      expect(a).toMatchObject({ id: 'a', attempt: 1 });
      clock += 800;
      expect(await store.renewLeases('n1', [{ rolloutId: 'a', attempt: 1 }], 1_000)).toEqual({ renewed: ['a'], lost: [] });
      clock += 900; // renewed until +1800: still held
      expect(await store.claim({ workerId: 'n2', limit: 5, leaseMs: 1_000 })).toMatchObject([{ id: 'b', attempt: 1 }]);
      clock += 1_000; // now past it
      const reissued = await store.claim({ workerId: 'n2', limit: 5, leaseMs: 1_000 });
      expect(reissued.map((r) => [r.id, r.attempt])).toEqual([['a', 2]]);
      expect(await store.renewLeases('n1', [{ rolloutId: 'a', attempt: 1 }], 1_000)).toEqual({ renewed: [], lost: ['a'] });

      // the sweep re-queues expired leases without a claim
      clock += 5_000;
      expect((await store.expireLeases()).sort()).toEqual(['a', 'b']);
      expect(await store.getRollout('a')).toMatchObject({ state: 'queued', attempt: 2, workerId: null, leaseExpiresAt: null });
      expect((await store.claim({ workerId: 'n3', limit: 1, leaseMs: 1_000 }))[0]).toMatchObject({ id: 'a', attempt: 3 });
    });

    it('rejects a stale commit (old attempt) and accepts the current one', async () => {
      await store.putTasks([task('a')]);
      await store.claim({ workerId: 'lost', limit: 1, leaseMs: 1_000 });
      clock += 2_000;
      const [current] = await store.claim({ workerId: 'n2', limit: 1, leaseMs: 1_000 });
      expect(current?.attempt).toBe(2);

      const late = await store.commit({ rolloutId: 'a', attempt: 1, result: result('a', 'a', 0, { reward: 0 }), workerId: 'lost' });
      expect(late).toEqual({ status: 'stale', currentAttempt: 2, state: 'leased' });
      expect(await store.getResult('a')).toBeUndefined();

      const accepted = await store.commit({ rolloutId: 'a', attempt: 2, result: result('a', 'a'), workerId: 'n2' });
      expect(accepted).toEqual({ status: 'committed' });
      expect(await store.getResult('a')).toEqual(result('a', 'a'));
      expect(await store.getRollout('a')).toMatchObject({ state: 'done', attempt: 2, workerId: 'n2', leaseExpiresAt: null });

      // after it is done: the old attempt is still stale, and nothing claims it again
      expect(await store.commit({ rolloutId: 'a', attempt: 1, result: result('a', 'a', 0, { reward: 0 }), workerId: 'lost' })).toMatchObject({ status: 'stale', state: 'done' });
      expect(await store.getResult('a')).toEqual(result('a', 'a'));
      clock += 10_000;
      expect(await store.claim({ workerId: 'n3', limit: 1, leaseMs: 1_000 })).toEqual([]);
      expect(await store.commit({ rolloutId: 'nope', attempt: 1, result: result('nope', 'nope'), workerId: 'n1' })).toEqual({ status: 'not_found' });
    });

    it('stores one result for a double commit of the same attempt', async () => {
      await store.putTasks([task('a')]);
      const [claimed] = await store.claim({ workerId: 'n1', limit: 1, leaseMs: 10_000 });
      const other = engine.connections === 'pooled' ? await open() : store;
      const outcomes = await Promise.all([
        store.commit({ rolloutId: 'a', attempt: claimed!.attempt, result: result('a', 'a'), workerId: 'n1' }),
        other.commit({ rolloutId: 'a', attempt: claimed!.attempt, result: result('a', 'a', 0, { reward: 0.5 }), workerId: 'n1' }),
      ]);
      expect(outcomes.map((o) => o.status).sort()).toEqual(['committed', 'duplicate']);
      const stored = await store.listResults();
      expect(stored.items).toHaveLength(1);
      expect(await store.counts()).toMatchObject({ done: 1, leased: 0, queued: 0 });
    });

    it('reads many results in one call: those that exist, across its 500-id chunks', async () => {
      const ids = Array.from({ length: 1_200 }, (_, i) => `m${i}`);
      await store.putTasks(ids.map((id) => task(id)));
      const finished = ids.filter((_, i) => i % 3 === 0);
      for (const id of finished) expect((await store.commit({ rolloutId: id, attempt: 0, result: result(id, id, 0, { reward: Number(id.slice(1)) }), workerId: 'service', unheld: true })).status).toBe('committed');
      const found = await store.getResults([...ids, 'nope']);
      expect([...found.keys()].sort()).toEqual([...finished].sort());
      expect(found.get('m999')?.reward).toBe(999);
      expect((await store.getResults([])).size).toBe(0);
    });

    it('commits a batch with an outcome each, as if one after the other', async () => {
      await store.putTasks([task('a'), task('b'), task('c')]);
      const claimed = await store.claim({ workerId: 'n1', limit: 3, leaseMs: 10_000 });
      const attempt = (id: string) => claimed.find((c) => c.id === id)!.attempt;
      const outcomes = await store.commitMany([
        { rolloutId: 'a', attempt: attempt('a'), result: result('a', 'a'), workerId: 'n1' },
        { rolloutId: 'b', attempt: attempt('b') + 1, result: result('b', 'b'), workerId: 'n1' },
        { rolloutId: 'nope', attempt: 1, result: result('nope', 'nope'), workerId: 'n1' },
        { rolloutId: 'c', attempt: attempt('c'), result: result('c', 'c', 0, { state: 'failed', reward: 0 }), workerId: 'n1' },
      ]);
      expect(outcomes).toEqual([{ status: 'committed' }, { status: 'stale', currentAttempt: attempt('b'), state: 'leased' }, { status: 'not_found' }, { status: 'committed' }]);
      expect(await store.counts()).toMatchObject({ done: 1, failed: 1, leased: 1 });
      // the same batch again: what committed is a duplicate now
      expect((await store.commitMany([{ rolloutId: 'a', attempt: attempt('a'), result: result('a', 'a'), workerId: 'n1' }])).map((o) => o.status)).toEqual(['duplicate']);
      // an unfinished result fails the whole batch before anything is written
      const error = await store
        .commitMany([
          { rolloutId: 'b', attempt: attempt('b'), result: result('b', 'b'), workerId: 'n1' },
          { rolloutId: 'b', attempt: attempt('b'), result: result('b', 'b', 0, { state: 'run' }), workerId: 'n1' },
        ])
        .catch((e: unknown) => e);
      expect(RolloutError.isInstance(error) && error.code).toBe('BAD_REQUEST');
      expect(await store.getRollout('b')).toMatchObject({ state: 'leased' });
    });

    it('gives multi-turn results back as committed (their token ids stored once), through every way in and out', async () => {
      await store.putTasks([task('one'), task('many'), task('g', 2)]);
      const claimed = await store.claim({ workerId: 'n1', limit: 4, leaseMs: 10_000 });
      const attempt = (id: string) => claimed.find((c) => c.id === id)!.attempt;
      const plain = (value: unknown) => JSON.parse(JSON.stringify(value)) as unknown;
      const one = multiTurn('one', 'one');
      const many = multiTurn('many', 'many', 0, { reward: 0 });
      expect(await store.commit({ rolloutId: 'one', attempt: attempt('one'), result: one, workerId: 'n1' })).toEqual({ status: 'committed' });
      expect(await store.commitMany([{ rolloutId: 'many', attempt: attempt('many'), result: many, workerId: 'n1' }])).toEqual([{ status: 'committed' }]);
      await store.commit({ rolloutId: 'g:0', attempt: attempt('g:0'), result: multiTurn('g:0', 'g', 0), workerId: 'n1' });
      const amended = multiTurn('g:0', 'g', 0, { advantage: 1 });
      await store.commit({ rolloutId: 'g:1', attempt: attempt('g:1'), result: multiTurn('g:1', 'g', 1, { advantage: -1 }), amend: [amended], workerId: 'n1' });
      expect(plain(await store.getResult('one'))).toEqual(plain(one));
      expect(plain((await store.getResults(['many', 'g:0'])).get('many'))).toEqual(plain(many));
      expect(plain(await store.getResult('g:0'))).toEqual(plain(amended));
      const listed = await store.listResults({ limit: 10 });
      expect(listed.items.map((r) => r.id).sort()).toEqual(['g:0', 'g:1', 'many', 'one']);
      expect(plain(listed.items.find((r) => r.id === 'one'))).toEqual(plain(one));
    });

    it('reads results a release before issue 24 stored (camelCase, whole or with $tokens: 1) in today\'s form', async () => {
      await store.putTasks([task('old-whole'), task('old-encoded')]);
      for (const c of await store.claim({ workerId: 'n1', limit: 2, leaseMs: 10_000 })) {
        await store.commit({ rolloutId: c.id, attempt: c.attempt, result: result(c.id, c.taskId), workerId: 'n1' });
      }
      await store.close();
      // the bodies as that release wrote them: camelCase inside, its runner's key order
      const call = { id: 'c', name: 'bash', arguments: '{}', output: 'o', status: 'ok', execution: { exitCode: 0, timedOut: false, exception: null }, code: 'ls', durationMs: 2 };
      const turn = (index: number, promptTokenIds: unknown) => ({
        index, promptTokenIds, generationTokenIds: [9], generationLogprobs: [-1], finishReason: 'stop', text: 't', reasoning: null, toolCalls: [call], llmLatencyMs: 1,
        backend: 'b', code: 'ls', status: 'ok', malformed: null, rewards: { format: 0, tool: 1, outcome: 0, shaping: 0 }, reward: 0, return: 0, normalizedReturn: null,
      });
      const stage = { queuedMs: 0, activeMs: 1 };
      const old = (id: string, turns: unknown[], extra: object = {}) => ({
        id, taskId: id, sampleIndex: 0, env: 'math', state: 'done', reward: 1, rewardComponents: null, verifyExtras: { extracted_answer: '42' }, criticalError: null, error: null,
        response: null, messages: [], turns, filter: false, advantage: null, credit: null, timing: { init: stage, run: stage, eval: stage, totalMs: 3 }, finishedAt: '2026-01-01T00:00:00.000Z',
        ...extra,
      });
      const bodies = [old('old-whole', [turn(0, [1, 2]), turn(1, [1, 2, 9, 3])]), old('old-encoded', [turn(0, [1, 2]), turn(1, { keep: 2, add: [9, 3] })], { $tokens: 1 })];
      for (const body of bodies) await engine.exec(url, `UPDATE results SET body = '${JSON.stringify(body)}' WHERE rollout_id = '${body.id}'`);
      const reopened = await open();
      const today = (id: string) => ({
        id, task_id: id, sample_index: 0, env: 'math', state: 'done', reward: 1, reward_components: null, verify_extras: { extracted_answer: '42' }, critical_error: null,
        filter: false, error: null, advantage: null, credit: null,
        timing: { init: { queued_ms: 0, active_ms: 1 }, run: { queued_ms: 0, active_ms: 1 }, eval: { queued_ms: 0, active_ms: 1 }, total_ms: 3 },
        response: null, messages: [],
        turns: [0, 1].map((index) => ({
          index, prompt_token_ids: index === 0 ? [1, 2] : [1, 2, 9, 3], generation_token_ids: [9], generation_logprobs: [-1], finish_reason: 'stop', text: 't', reasoning: null,
          tool_calls: [{ id: 'c', name: 'bash', arguments: '{}', output: 'o', status: 'ok', execution: { exit_code: 0, timed_out: false, exception: null }, code: 'ls', duration_ms: 2 }],
          llm_latency_ms: 1, backend: 'b', weight_version: null, code: 'ls', status: 'ok', malformed: null, rewards: { format: 0, tool: 1, outcome: 0, shaping: 0 }, reward: 0, return: 0, normalized_return: null,
        })),
        // (results from before weight versions read back with them null)
        weight_version_min: null, weight_version_max: null, stale: false,
        finished_at: '2026-01-01T00:00:00.000Z',
      });
      // (JSON text compared: the keys come in the order the API sends them)
      for (const id of ['old-whole', 'old-encoded']) expect(JSON.stringify(await reopened.getResult(id))).toBe(JSON.stringify(today(id)));
      expect(JSON.stringify((await reopened.getResults(['old-encoded'])).get('old-encoded'))).toBe(JSON.stringify(today('old-encoded')));
      expect((await reopened.listResults({ limit: 10 })).items.map((r) => r.task_id).sort()).toEqual(['old-encoded', 'old-whole']);
    });

    it('commits a cancelled result for a rollout never claimed (attempt 0), and rejects unfinished results', async () => {
      await store.putTasks([task('a'), task('b')]);
      expect(await store.commit({ rolloutId: 'a', attempt: 0, result: result('a', 'a', 0, { state: 'cancelled' }), workerId: 'service', unheld: true })).toEqual({ status: 'committed' });
      expect(await store.counts()).toMatchObject({ cancelled: 1, queued: 1 });
      const error = await store.commit({ rolloutId: 'b', attempt: 0, result: result('b', 'b', 0, { state: 'run' }), workerId: 'service', unheld: true }).catch((e: unknown) => e);
      expect(RolloutError.isInstance(error) && error.code).toBe('BAD_REQUEST');
      expect(await store.getRollout('b')).toMatchObject({ state: 'queued' });
    });

    it('rewrites the group in the same transaction as its last commit (amend)', async () => {
      await store.putTasks([task('g', 2), task('x')]);
      const claimed = await store.claim({ workerId: 'n1', limit: 3, leaseMs: 10_000 });
      const attempt = (id: string) => claimed.find((c) => c.id === id)!.attempt;
      await store.commit({ rolloutId: 'g:0', attempt: attempt('g:0'), result: result('g:0', 'g', 0), workerId: 'n1' });
      await store.commit({ rolloutId: 'x', attempt: attempt('x'), result: result('x', 'x'), workerId: 'n1' });
      const outcome = await store.commit({
        rolloutId: 'g:1',
        attempt: attempt('g:1'),
        result: result('g:1', 'g', 1, { advantage: -1 }),
        // 'x' is another task's: left alone
        amend: [result('g:0', 'g', 0, { advantage: 1 }), result('x', 'x', 0, { advantage: 7 })],
        workerId: 'n1',
      });
      expect(outcome).toEqual({ status: 'committed' });
      expect((await store.getResult('g:0'))?.advantage).toBe(1);
      expect((await store.getResult('g:1'))?.advantage).toBe(-1);
      expect((await store.getResult('x'))?.advantage).toBeNull();
      // a stale commit's amendments are not applied either
      expect(await store.commit({ rolloutId: 'g:1', attempt: 99, result: result('g:1', 'g', 1), amend: [result('g:0', 'g', 0, { advantage: 5 })], workerId: 'n1' })).toMatchObject({ status: 'stale' });
      expect((await store.getResult('g:0'))?.advantage).toBe(1);
    });

    it("re-issues a lost node's rollouts; its late commits are then stale", async () => {
      await store.putTasks(Array.from({ length: 5 }, (_, i) => task(`t${i}`)));
      const lost = await store.claim({ workerId: 'n1', limit: 3, leaseMs: 60_000 });
      const kept = await store.claim({ workerId: 'n2', limit: 2, leaseMs: 60_000 });
      expect((await store.releaseWorker('n1')).sort()).toEqual(lost.map((r) => r.id).sort());
      expect(await store.counts()).toMatchObject({ queued: 3, leased: 2 });
      const again = await store.claim({ workerId: 'n3', limit: 10, leaseMs: 60_000 });
      expect(again.map((r) => [r.id, r.attempt])).toEqual(lost.map((r) => [r.id, 2]));
      for (const r of lost) {
        expect(await store.commit({ rolloutId: r.id, attempt: r.attempt, result: result(r.id, r.taskId), workerId: 'n1' })).toMatchObject({ status: 'stale', currentAttempt: 2 });
      }
      expect(await store.renewLeases('n2', kept.map((r) => ({ rolloutId: r.id, attempt: r.attempt })), 60_000)).toEqual({ renewed: kept.map((r) => r.id), lost: [] });
      expect(await store.releaseWorker('nobody')).toEqual([]);
    });

    it('lists rollouts and results with a cursor and filters', async () => {
      await store.putTasks([task('a', 3), task('b', 2), task('c')]);
      expect(await allRolloutIds(store)).toEqual(['a:0', 'a:1', 'a:2', 'b:0', 'b:1', 'c']);
      expect(await allRolloutIds(store, { taskId: 'b' })).toEqual(['b:0', 'b:1']);
      const claimed = await store.claim({ workerId: 'n1', limit: 4, leaseMs: 60_000 });
      expect(claimed.map((c) => c.id)).toEqual(['a:0', 'a:1', 'a:2', 'b:0']);
      await store.commit({ rolloutId: 'a:2', attempt: 1, result: result('a:2', 'a', 2, { state: 'failed' }), workerId: 'n1' });
      await store.commit({ rolloutId: 'a:0', attempt: 1, result: result('a:0', 'a', 0), workerId: 'n1' });
      await store.commit({ rolloutId: 'b:0', attempt: 1, result: result('b:0', 'b', 0), workerId: 'n1' });
      expect(await allRolloutIds(store, { state: 'queued' })).toEqual(['b:1', 'c']);
      expect(await allRolloutIds(store, { state: ['done', 'failed'] })).toEqual(['a:0', 'a:2', 'b:0']);
      const page = await store.listResults({ limit: 2 });
      expect(page.items.map((r) => r.id)).toEqual(['a:2', 'a:0']); // in commit order
      expect((await store.listResults({ cursor: page.cursor })).items.map((r) => r.id)).toEqual(['b:0']);
      expect((await store.listResults({ state: 'done', taskId: 'a' })).items.map((r) => r.id)).toEqual(['a:0']);
      expect(await store.counts()).toEqual({ queued: 2, leased: 1, done: 2, failed: 1, cancelled: 0 });
      const bad = await store.listRollouts({ cursor: 'x; DROP TABLE rollouts' }).catch((e: unknown) => e);
      expect(RolloutError.isInstance(bad) && bad.code).toBe('BAD_REQUEST');
    });

    it('forgets old results by age and by count (retention), with their rollouts and emptied tasks', async () => {
      const retained = await open(url, { retention: { keepLast: 4 } });
      await store.putTasks([task('a', 2), ...Array.from({ length: 5 }, (_, i) => task(`t${i}`))]);
      const claimed = await store.claim({ workerId: 'n1', limit: 10, leaseMs: 3_600_000 });
      for (const c of claimed) {
        await store.commit({ rolloutId: c.id, attempt: c.attempt, result: result(c.id, c.taskId, c.sampleIndex), workerId: 'n1' });
        clock += 1_000;
      }
      // committed at +0 (a:0), +1s (a:1), +2s (t0) … +6s (t4); now is +7s
      expect(await store.prune({ maxAgeMs: 5_500 })).toEqual({ results: 2, tasks: 1 }); // a:0 and a:1, then task a
      expect(await store.getResult('a:0')).toBeUndefined();
      expect(await store.getRollout('a:1')).toBeUndefined();
      expect(await store.getTask('a')).toBeUndefined();
      expect(await retained.prune()).toEqual({ results: 1, tasks: 1 }); // keepLast 4: t0 goes
      expect((await store.listResults()).items.map((r) => r.id)).toEqual(['t1', 't2', 't3', 't4']);
      expect(await store.prune({ keepLast: 4 })).toEqual({ results: 0, tasks: 0 });
      expect(await store.prune({})).toEqual({ results: 0, tasks: 0 });
      // a forgotten task id may run again
      expect(await store.putTasks([task('a', 2)])).toEqual([{ taskId: 'a', rolloutIds: ['a:0', 'a:1'], existing: false }]);
    });

    it('imports a JSONL journal once: last result of a rollout wins, a cut line is skipped', async () => {
      const dir = await mkdtemp(join(tmpdir(), 'rollserve-journal-import-'));
      try {
        const path = join(dir, 'journal.jsonl');
        // a journal as rollserve wrote it before the store: a JSON record per line
        const at = new Date().toISOString();
        const records: JournalRecord[] = [
          { type: 'task', taskId: 'j', task: task('j', 2), rolloutIds: ['j:0', 'j:1'], at },
          { type: 'task', taskId: 'k', task: task('k', 2), rolloutIds: ['k:0', 'k:1'], at },
          { type: 'task', taskId: 'm', task: task('m'), rolloutIds: ['m'], at },
          { type: 'result', result: result('j:0', 'j', 0) },
          { type: 'result', result: result('j:1', 'j', 1, { state: 'failed', reward: 0 }) },
          { type: 'result', result: result('k:0', 'k', 0) },
          // the group's credit rewrites j:0 once j is whole
          { type: 'result', result: result('j:0', 'j', 0, { advantage: 1 }) },
        ];
        await writeFile(path, records.map((record) => `${JSON.stringify(record)}\n`).join(''));
        await appendFile(path, '{"type":"result","result":{"id":"m","taskI'); // a write cut short by a crash

        // the store already knows 'm' (say, submitted again since)
        await store.putTasks([task('m')]);
        const first = await importJournal(store, path);
        expect(first).toEqual({ imported: true, tasks: 2, results: 3, skippedLines: 1 });
        expect(await store.getResult('j:0')).toEqual(result('j:0', 'j', 0, { advantage: 1 }));
        expect((await store.getResult('j:1'))?.state).toBe('failed');
        expect(await store.getRollout('k:1')).toMatchObject({ state: 'queued', attempt: 0 });
        expect(await store.counts()).toEqual({ queued: 2, leased: 0, done: 2, failed: 1, cancelled: 0 });

        const second = await importJournal(store, path);
        expect(second).toEqual({ imported: false, tasks: 0, results: 0, skippedLines: 0 });
        expect(await store.counts()).toEqual({ queued: 2, leased: 0, done: 2, failed: 1, cancelled: 0 });
        expect((await store.listResults()).items).toHaveLength(3);
        // the imported work runs on: the unfinished rollouts are claimable
        expect((await store.claim({ workerId: 'n1', limit: 5, leaseMs: 1_000 })).map((c) => c.id)).toEqual(['m', 'k:1']); // 'm' was put first
        const missing = await importJournal(store, join(dir, 'nope.jsonl')).catch((e: unknown) => e);
        expect(RolloutError.isInstance(missing) && missing.code).toBe('NOT_FOUND');
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    });

    it('rejects bad arguments with BAD_REQUEST', async () => {
      for (const call of [
        () => store.claim({ workerId: 'n', limit: 0, leaseMs: 1_000 }),
        () => store.claim({ workerId: 'n', limit: 1, leaseMs: -1 }),
        () => store.listResults({ limit: 1e9 }),
        () => openStore('mysql://localhost/db'),
        () => openStore('sqlite://'),
      ]) {
        const error = await call().catch((e: unknown) => e);
        expect(RolloutError.isInstance(error) && error.code).toBe('BAD_REQUEST');
      }
    });

    engine.extra?.({
      store: () => store,
      url: () => url,
      advance: (ms) => {
        clock += ms;
      },
      open,
    });
  });
}

export { task as storeSuiteTask, result as storeSuiteResult };
