import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFakePolicy, workspaceRoot } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { getJson, Resources, sleep, until } from './helpers.ts';

// Rollout nodes as a hostile party would play them, against the real `rollserve start` over HTTP:
// a client with the trainer's token but no node credential, a registered node reaching for another
// node's work, an id taken over, heartbeats that flood, a node that takes no work but stays up.

const resources = new Resources();
afterEach(() => resources.cleanup());

const ROLLSERVE = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');
const TOKEN = 'hostile-token';
const bearer = { authorization: `Bearer ${TOKEN}` };
const CREDENTIAL = 'x-rollserve-node-credential';

/** A temporary directory, removed at cleanup. */
async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-hostile-'));
  resources.add(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** `rollserve start` on free ports, its store in `dir` (a new temporary one by default); resolves with the rollout service's URL. */
async function startRollserve(args: string[], dir?: string): Promise<{ url: string; child: ChildProcess; stop: () => Promise<void> }> {
  dir ??= await tempDir();
  const child = spawn(process.execPath, [ROLLSERVE, 'start', '--port', '0', '--token', TOKEN, '--store', `sqlite://${join(dir, 'store.db')}`, '--journal', join(dir, 'none.jsonl'), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' },
  });
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c));
  child.stderr!.on('data', (c: Buffer) => (output += c));
  const exited = once(child, 'exit');
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGINT');
    await exited;
  };
  resources.add(stop);
  await until(() => /^swe\s+http/m.test(output) || child.exitCode !== null);
  const url = /^rollouts\s+(http:\/\/127\.0\.0\.1:\d+)/m.exec(output)?.[1];
  if (!url) throw new Error(`rollserve start did not start: ${output}`);
  return { url, child, stop };
}

const mathTask = (id: string, extra: Record<string, unknown> = {}) => ({
  id,
  env: 'math',
  row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' },
  policy: { model: 'fake-policy' },
  ...extra,
});

const registration = (nodeId: string, maxRollouts = 2) => ({
  node_id: nodeId,
  host: 'h',
  pid: 1,
  capacity: { init: 1, run: 1, eval: 1 },
  max_rollouts: maxRollouts,
  environments: ['math', 'stem', 'code', 'swe'],
});

/** A result a forger would send: reward 0.777 for `id`. */
const forged = (id: string) => {
  const stage = { queued_ms: 0, active_ms: 0 };
  return {
    id, task_id: id, sample_index: 0, env: 'math', state: 'done', reward: 0.777, reward_components: null, verify_extras: {}, critical_error: null, filter: false, error: null,
    advantage: null, credit: null, timing: { init: stage, run: stage, eval: stage, total_ms: 0 }, response: null, messages: [], turns: [], finished_at: new Date().toISOString(),
  };
};

describe('rollout nodes against a hostile party (rollserve start over HTTP)', () => {
  it('refuses forged commits, takeovers of a live id and heartbeats beyond a node\'s capacity, in the documented error shape', async () => {
    const { url } = await startRollserve(['--run-locally', 'never']);
    const api = (path: string, init: { method?: string; body?: unknown; credential?: string } = {}) =>
      getJson(url, path, { ...init, headers: { ...bearer, ...(init.credential ? { [CREDENTIAL]: init.credential } : {}) } });
    const expectError = (answer: { status: number; json: any }, status: number, code: string, says?: RegExp) => {
      expect(answer.status, JSON.stringify(answer.json)).toBe(status);
      expect(answer.json).toMatchObject({ error: { code, message: expect.any(String), retryable: false } });
      if (says) expect(answer.json.error.message).toMatch(says);
    };
    const commit = (nodeId: string, rolloutId: string, attempt: number, credential?: string) =>
      api(`/v1/nodes/${nodeId}/results`, { body: { results: [{ rollout_id: rolloutId, attempt, result: forged(rolloutId) }] }, ...(credential ? { credential } : {}) });
    const unchanged = async (id: string, state: string) => expect((await api(`/v1/rollouts/${id}`)).json).toMatchObject({ id, state, result: null });

    for (const id of ['queued-one', 'leased-one']) expect((await api('/v1/rollouts', { body: mathTask(id) })).status).toBe(202);

    // an id that never registered, for a queued rollout at attempt 0: refused, nothing stored
    expectError(await commit('never-registered', 'queued-one', 0), 404, 'NOT_FOUND');
    // the service's own worker id is no node's
    expectError(await commit('service', 'queued-one', 0), 422, 'UNPROCESSABLE', /reserved/);
    expectError(await api('/v1/nodes', { body: registration('service') }), 422, 'UNPROCESSABLE', /reserved/);
    expectError(await api('/v1/nodes', { body: registration('Service') }), 422, 'UNPROCESSABLE', /reserved/);

    const a = await api('/v1/nodes', { body: registration('node-a') });
    const b = await api('/v1/nodes', { body: registration('node-b') });
    expect([a.status, b.status]).toEqual([201, 201]);
    const [credA, credB] = [a.json.credential as string, b.json.credential as string];
    expect(credA).not.toBe(credB);

    // a registered node, with its own credential, for a queued rollout no one holds: not committed
    expect((await commit('node-b', 'queued-one', 0, credB)).json).toEqual({ results: [{ rollout_id: 'queued-one', status: 'stale' }] });
    await unchanged('queued-one', 'queued');

    // node-a takes one rollout; node-b reaches for it at its very attempt
    const claimed = await api('/v1/nodes/node-a/claim', { body: { limit: 1, wait_ms: 0 }, credential: credA });
    expect(claimed.json.claims).toHaveLength(1);
    const { rollout_id: held, attempt } = claimed.json.claims[0] as { rollout_id: string; attempt: number };
    expect((await commit('node-b', held, attempt, credB)).json).toEqual({ results: [{ rollout_id: held, status: 'stale' }] });
    // in node-a's name: without a credential, with node-b's, with a made-up one
    expectError(await commit('node-a', held, attempt), 401, 'UNAUTHORIZED', /credential/);
    expectError(await commit('node-a', held, attempt, credB), 401, 'UNAUTHORIZED');
    expectError(await commit('node-a', held, attempt, 'x'.repeat(43)), 401, 'UNAUTHORIZED');
    // nor heartbeat, claim, model turn or leave in its name
    expectError(await api('/v1/nodes/node-a/heartbeat', { body: { leases: [{ rollout_id: held, attempt, stage: 'run' }] }, credential: credB }), 401, 'UNAUTHORIZED');
    expectError(await api('/v1/nodes/node-a/claim', { body: { limit: 1, wait_ms: 0 } }), 401, 'UNAUTHORIZED');
    expectError(await api('/v1/nodes/node-a/model', { body: { rollout_id: held, attempt, messages: [{ role: 'user', content: 'hi' }], tools: [] }, credential: credB }), 401, 'UNAUTHORIZED');
    expectError(await api('/v1/nodes/node-a', { method: 'DELETE', credential: credB }), 401, 'UNAUTHORIZED');
    await unchanged(held, 'queued'); // (leased, not started: the API shows it queued)

    // the live id is not taken over: re-registering it needs its credential
    expectError(await api('/v1/nodes', { body: registration('node-a') }), 409, 'CONFLICT', /in use/);
    expectError(await api('/v1/nodes', { body: registration('node-a'), credential: credB }), 409, 'CONFLICT');
    const renewed = await api('/v1/nodes/node-a/heartbeat', { body: { leases: [{ rollout_id: held, attempt, stage: 'run' }] }, credential: credA });
    expect(renewed).toEqual({ status: 200, json: { renewed: [held], lost: [], cancel: [] } });
    // its own process registering again keeps its credential and its lease
    expect((await api('/v1/nodes', { body: registration('node-a'), credential: credA })).json).toMatchObject({ node_id: 'node-a', credential: credA });
    expect((await api('/v1/nodes/node-a/heartbeat', { body: { leases: [{ rollout_id: held, attempt, stage: 'run' }] }, credential: credA })).json.renewed).toEqual([held]);

    // heartbeats and claims beyond its capacity (max_rollouts 2)
    const leases = (n: number) => Array.from({ length: n }, (_, i) => ({ rollout_id: `made-up-${i}`, attempt: 1, stage: 'run' }));
    expectError(await api('/v1/nodes/node-a/heartbeat', { body: { leases: leases(3) }, credential: credA }), 422, 'UNPROCESSABLE', /max_rollouts \(2\)/);
    expectError(await api('/v1/nodes/node-a/claim', { body: { limit: 3, wait_ms: 0 }, credential: credA }), 422, 'UNPROCESSABLE', /max_rollouts \(2\)/);
    const flood = await api('/v1/nodes/node-a/heartbeat', { body: { leases: leases(100_000) }, credential: credA });
    expect(flood.status).toBeGreaterThanOrEqual(400);
    expect(flood.status).toBeLessThan(500);
    // a claim hands out no more than its free capacity: it holds one of two
    const more = await api('/v1/nodes/node-a/claim', { body: { limit: 2, wait_ms: 0 }, credential: credA });
    expect(more.json.claims).toHaveLength(1);

    // its own lease, with a result that names another task's sample: refused
    const misnamed = { ...forged(held), task_id: 'another-task' };
    expectError(await api('/v1/nodes/node-a/results', { body: { results: [{ rollout_id: held, attempt, result: misnamed }] }, credential: credA }), 422, 'UNPROCESSABLE', /names task "another-task"/);

    // the holder commits: that one counts
    const mine = await commit('node-a', held, attempt, credA);
    expect(mine.json).toEqual({ results: [{ rollout_id: held, status: 'committed' }] });
    expect((await api(`/v1/rollouts/${held}`)).json).toMatchObject({ state: 'done', result: { reward: 0.777 } });
    expect((await api('/v1/status')).status).toBe(200);
  }, 120_000);

  it('after a restart of the service a node id is still its node\'s: taken back with its credential, lease and all; refused without it', async () => {
    const dir = await tempDir();
    const first = await startRollserve(['--run-locally', 'never'], dir);
    const api = (url: string, path: string, init: { method?: string; body?: unknown; credential?: string } = {}) =>
      getJson(url, path, { ...init, headers: { ...bearer, ...(init.credential ? { [CREDENTIAL]: init.credential } : {}) } });
    expect((await api(first.url, '/v1/rollouts', { body: mathTask('kept') })).status).toBe(202);
    const { credential } = (await api(first.url, '/v1/nodes', { body: registration('keeper') })).json as { credential: string };
    const [claim] = (await api(first.url, '/v1/nodes/keeper/claim', { body: { limit: 1, wait_ms: 0 }, credential })).json.claims as Array<{ rollout_id: string; attempt: number }>;
    expect(claim).toMatchObject({ rollout_id: 'kept', attempt: 1 });
    await first.stop();

    const second = await startRollserve(['--run-locally', 'never'], dir);
    // the store knows whose the id is: not another's to take, nor the placeholder's to lose
    expect((await api(second.url, '/v1/nodes', { body: registration('keeper') })).status).toBe(409);
    const other = (await api(second.url, '/v1/nodes', { body: registration('other') })).json.credential as string;
    expect((await api(second.url, '/v1/nodes', { body: registration('keeper'), credential: other })).status).toBe(409);
    expect((await api(second.url, '/v1/nodes', { body: registration('keeper'), credential })).json).toMatchObject({ node_id: 'keeper', credential });
    const lease = { rollout_id: 'kept', attempt: claim!.attempt, stage: 'run' };
    expect((await api(second.url, '/v1/nodes/keeper/heartbeat', { body: { leases: [lease] }, credential })).json).toEqual({ renewed: ['kept'], lost: [], cancel: [] });
    expect((await api(second.url, '/v1/nodes/other/results', { body: { results: [{ rollout_id: 'kept', attempt: claim!.attempt, result: forged('kept') }] }, credential: other })).json.results).toEqual([{ rollout_id: 'kept', status: 'stale' }]);
    const result = { ...forged('kept'), reward: 1 };
    expect((await api(second.url, '/v1/nodes/keeper/results', { body: { results: [{ rollout_id: 'kept', attempt: claim!.attempt, result }] }, credential })).json.results).toEqual([{ rollout_id: 'kept', status: 'committed' }]);
  }, 120_000);

  it('with --node-token: the node routes take only it, every other route only --token; the real rollserve node runs on it', async () => {
    const fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
    resources.add(() => fake.close());
    const NODE_TOKEN = 'hostile-node-token';
    const nodeBearer = { authorization: `Bearer ${NODE_TOKEN}` };
    const { url } = await startRollserve(['--run-locally', 'never', '--llm', fake.url, '--node-token', NODE_TOKEN]);
    const status = async (path: string, headers: Record<string, string>, body?: unknown) => (await getJson(url, path, { headers, ...(body === undefined ? {} : { body }) })).status;
    // the trainer's token registers no node, nor does a node's token act as the trainer
    expect(await status('/v1/nodes', bearer, registration('by-trainer'))).toBe(401);
    expect(await status('/v1/rollouts', nodeBearer, mathTask('by-node'))).toBe(401);
    expect(await status('/v1/nodes', nodeBearer)).toBe(401); // (listing nodes is the trainer's)
    expect(await status('/v1/nodes', bearer)).toBe(200);
    const reg = await getJson(url, '/v1/nodes', { body: registration('by-node-token'), headers: nodeBearer });
    expect(reg.status).toBe(201);
    const credential = { [CREDENTIAL]: reg.json.credential as string };
    expect(await status('/v1/nodes/by-node-token/heartbeat', { ...bearer, ...credential }, { leases: [] })).toBe(401);
    expect(await status('/v1/nodes/by-node-token/heartbeat', { ...nodeBearer, ...credential }, { leases: [] })).toBe(200);

    const sandboxes = await tempDir();
    const child = spawn(process.execPath, [ROLLSERVE, 'node', '--service', url, '--token', NODE_TOKEN, '--id', 'real-node', '--run', '1', '--init', '1', '--eval', '1'], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent', TMPDIR: sandboxes },
    });
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    resources.add(async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    });
    let out = '';
    child.stdout!.on('data', (c: Buffer) => (out += c));
    await until(() => out.includes('registered') || child.exitCode !== null);
    expect(out).toMatch(/^node real-node registered/);
    expect(await status('/v1/rollouts', bearer, mathTask('on-real-node'))).toBe(202);
    const done = await getJson(url, '/v1/rollouts/stream?ids=on-real-node', { headers: bearer });
    expect(done.json).toMatchObject({ id: 'on-real-node', state: 'done', reward: 1 });
    child.kill('SIGTERM');
    expect(await exited).toEqual([0, null]);
  }, 120_000);

  it('a flood of full-size heartbeats from a node with a large capacity: each answered, and the service answers others meanwhile', async () => {
    const { url } = await startRollserve(['--run-locally', 'never']);
    const registered = await getJson(url, '/v1/nodes', { body: registration('big', 10_000), headers: bearer });
    const headers = { ...bearer, [CREDENTIAL]: registered.json.credential as string };
    const leases = Array.from({ length: 10_000 }, (_, i) => ({ rollout_id: `made-up-${i}`, attempt: 1, stage: 'run' }));
    let inFlight = true;
    const beats = Promise.all(Array.from({ length: 8 }, () => getJson(url, '/v1/nodes/big/heartbeat', { body: { leases }, headers }))).finally(() => (inFlight = false));
    let healthy = 0;
    while (inFlight) {
      expect((await getJson(url, '/health')).status).toBe(200);
      healthy++;
      await sleep(20);
    }
    for (const answer of await beats) {
      expect(answer.status).toBe(200);
      expect(answer.json.renewed).toEqual([]);
      expect(answer.json.lost).toHaveLength(10_000);
    }
    expect(healthy).toBeGreaterThan(0);
  }, 120_000);

  it('run-locally auto: a node that heartbeats but never claims starves nothing, and a lease held without a commit past its life is run again', async () => {
    const fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
    resources.add(() => fake.close());
    const { url } = await startRollserve(['--run-locally', 'auto', '--llm', fake.url, '--lease-s', '2']);
    const reg = await getJson(url, '/v1/nodes', { body: registration('idle', 1), headers: bearer });
    expect(reg.status).toBe(201);
    const headers = { ...bearer, [CREDENTIAL]: reg.json.credential as string };
    // heartbeats, never a claim, all along
    const held: Array<{ rollout_id: string; attempt: number; stage: string }> = [];
    let beating = true;
    let lostSeen: string[] = [];
    const beats = (async () => {
      while (beating) {
        const answer = await getJson(url, '/v1/nodes/idle/heartbeat', { body: { leases: held }, headers });
        expect(answer.status).toBe(200);
        lostSeen = [...lostSeen, ...(answer.json.lost as string[])];
        await sleep(200);
      }
    })();
    try {
      const submitted = await getJson(url, '/v1/rollouts', { body: { tasks: [mathTask('idle-0'), mathTask('idle-1'), mathTask('idle-2')] }, headers: bearer });
      expect(submitted.status).toBe(202);
      const stream = await getJson(url, '/v1/rollouts/stream?ids=idle-0,idle-1,idle-2', { headers: bearer });
      const results = (stream.json as string).split('\n').filter((l) => l.trim() !== '').map((line) => JSON.parse(line) as { id: string; state: string; reward: number });
      expect(results.map((r) => [r.id, r.state, r.reward]).sort()).toEqual([['idle-0', 'done', 1], ['idle-1', 'done', 1], ['idle-2', 'done', 1]]);

      // now it claims one (limits of 1 s each: its lease lives 6 s). Asking for work (a claim answered in
      // the last seconds, then one open), it is left the work
      expect((await getJson(url, '/v1/nodes/idle/claim', { body: { limit: 1, wait_ms: 0 }, headers })).json).toEqual({ claims: [] });
      const claiming = getJson(url, '/v1/nodes/idle/claim', { body: { limit: 1, wait_ms: 30_000 }, headers });
      expect((await getJson(url, '/v1/rollouts', { body: mathTask('hoarded', { limits: { init_timeout_s: 1, time_limit_s: 1 } }), headers: bearer })).status).toBe(202);
      const claims = (await claiming).json.claims as Array<{ rollout_id: string; attempt: number }>;
      expect(claims.map((c) => c.rollout_id)).toEqual(['hoarded']);
      // and holds it, heartbeating, never committing: past its life the lease is not renewed, and the rollout runs again
      held.push({ rollout_id: 'hoarded', attempt: claims[0]!.attempt, stage: 'run' });
      const done = await getJson(url, '/v1/rollouts/stream?ids=hoarded', { headers: bearer });
      expect(done.json).toMatchObject({ id: 'hoarded', state: 'done', reward: 1 });
      expect(lostSeen).toContain('hoarded'); // the hoarder was told its lease is gone
    } finally {
      beating = false;
      await beats;
    }
  }, 120_000);
});
