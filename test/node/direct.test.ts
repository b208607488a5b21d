import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RolloutResult } from '@rollserve/core/service';
import { startFakePolicy, type FakePolicy } from '@rollserve/testing';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { getJson, Resources, sandboxDir, sleep, startNode, startService, startShellPolicy, submit, until, type TestService } from './helpers.ts';

// A rollout node that says `direct-backends` sends its policy turns to the backends itself, on the
// route the service hands it per rollout (least in flight across the cluster, sticky), instead of
// through the service's /model route; everything else about its rollouts is as before. Real node
// processes (`rollserve node`'s agent), the real service over HTTP, the scripted policy.

const resources = new Resources();
afterEach(() => resources.cleanup(), 60_000);

/** The shell environment's scripted policy: `echo tag-<tag>` in the sandbox, then the answer. */
async function shellPolicy(latencyMs = 0): Promise<FakePolicy> {
  const fake = await startFakePolicy({
    ...(latencyMs > 0 ? { latencyMs } : {}),
    script: (request) => {
      const messages = request.messages as Array<{ role: string }>;
      if (messages.some((m) => m.role === 'tool')) return 'done';
      const tag = /tag (\w+)/.exec(JSON.stringify(messages))![1]!;
      return { toolCalls: [{ name: 'bash', arguments: { command: `echo tag-${tag}` } }] };
    },
  });
  resources.add(() => fake.close());
  return fake;
}

/** Counts the policy turns the service proxied for nodes (POST /v1/nodes/{id}/model). */
function proxied(test: TestService) {
  return vi.spyOn(test.service, 'modelTurn');
}

/** The requests the service's own pool sent each backend. */
async function poolRequests(url: string): Promise<Record<string, { requests: number; rollouts_in_flight: number }>> {
  const { json } = await getJson(url, '/v1/llm-backends');
  return Object.fromEntries((json.backends as Array<{ id: string; requests: number; rollouts_in_flight: number }>).map((b) => [b.id, b]));
}

/** What a turn is made of, latency and timings left out. */
const turnShape = (turn: RolloutResult['turns'][number]) => ({
  prompt_token_ids: turn.prompt_token_ids,
  generation_token_ids: turn.generation_token_ids,
  generation_logprobs: turn.generation_logprobs,
  finish_reason: turn.finish_reason,
  text: turn.text,
  tool_calls: turn.tool_calls.map(({ name, arguments: args, status, output }) => ({ name, args, status, output })),
  backend: turn.backend,
  weight_version: turn.weight_version,
});

describe('a node calling the policy backends itself', () => {
  it("sends every turn to the backend, none through the service, and records them as the service's own proxied turns are recorded", async () => {
    const fake = await shellPolicy();
    const sandboxes = await sandboxDir(resources);
    const ids = ['d1', 'd2', 'd3'];
    const run = async (directBackends: boolean) => {
      const test = await startService(resources, fake.url);
      expect((await getJson(test.url, '/v1/weights', { body: { version: 3 } })).status).toBe(200);
      const spy = proxied(test);
      const node = await startNode(resources, { serviceUrl: test.url, nodeId: directBackends ? 'direct' : 'proxied', pools: { init: 3, run: 3, eval: 3 }, maxRollouts: 3, directBackends }, sandboxes);
      const before = fake.calls.length;
      await submit(test.url, ids);
      await until(() => test.results.length === ids.length);
      const results = [...test.results].sort((a, b) => a.id.localeCompare(b.id));
      for (const result of results) expect(result).toMatchObject({ state: 'done', reward: 1, critical_error: null, weight_version_min: 3, weight_version_max: 3 });
      const calls = fake.calls.length - before;
      const pool = Object.values(await poolRequests(test.url))[0]!;
      // every lease ended with its commit: no backend load is left counted
      expect(pool.rollouts_in_flight).toBe(0);
      node.child.kill('SIGTERM');
      await node.exited;
      return { results, proxiedTurns: spy.mock.calls.length, poolRequests: pool.requests, calls };
    };

    const direct = await run(true);
    expect(direct.calls).toBe(6); // two turns per rollout, each reached the policy once
    expect(direct.proxiedTurns).toBe(0);
    expect(direct.poolRequests).toBe(0);
    // the requests carry the rollout's id as the service's do (x-rollout-id)
    expect(new Set(fake.calls.slice(0, 6).map((c) => c.headers['x-rollout-id']))).toEqual(new Set(direct.results.map((r) => r.id)));

    const viaService = await run(false);
    expect(viaService.proxiedTurns).toBe(6);
    expect(viaService.poolRequests).toBe(6);
    expect(direct.results.map((r) => r.turns.map(turnShape))).toEqual(viaService.results.map((r) => r.turns.map(turnShape)));
    for (const turn of direct.results.flatMap((r) => r.turns)) {
      expect(turn.generation_token_ids!.length).toBeGreaterThan(0);
      expect(turn.generation_logprobs).toHaveLength(turn.generation_token_ids!.length);
      expect(turn.prompt_token_ids!.length).toBeGreaterThan(0);
    }
  }, 120_000);

  it('spreads rollouts over two backends by fewest in flight, each rollout on one backend for all its turns', async () => {
    const [a, b] = [await shellPolicy(300), await shellPolicy(300)];
    const test = await startService(resources, [a.url, b.url]);
    const spy = proxied(test);
    const sandboxes = await sandboxDir(resources);
    await startNode(resources, { serviceUrl: test.url, nodeId: 'spread', pools: { init: 4, run: 4, eval: 4 }, maxRollouts: 4 }, sandboxes);
    const ids = ['s1', 's2', 's3', 's4'];
    await submit(test.url, ids);
    // while all four are held, two count as each backend's load
    await until(async () => Object.values(await poolRequests(test.url)).every((backend) => backend.rollouts_in_flight === 2));
    await until(() => test.results.length === ids.length);
    const backendOf = new Map<string, string>();
    for (const result of test.results) {
      expect(result.state).toBe('done');
      const used = new Set(result.turns.map((t) => t.backend));
      expect(used.size).toBe(1); // sticky
      backendOf.set(result.id, [...used][0]!);
    }
    const counts = [...backendOf.values()].reduce<Record<string, number>>((m, id) => ({ ...m, [id]: (m[id] ?? 0) + 1 }), {});
    expect(Object.values(counts)).toEqual([2, 2]);
    expect(a.calls).toHaveLength(4);
    expect(b.calls).toHaveLength(4);
    expect(spy).not.toHaveBeenCalled();
    expect(Object.values(await poolRequests(test.url)).map((backend) => backend.rollouts_in_flight)).toEqual([0, 0]);
  }, 120_000);

  it('honours a pause of generation: turns in flight at the node are aborted, none starts until the resume, and they run again on the new version', async () => {
    const fake = await shellPolicy(1_500);
    const test = await startService(resources, fake.url);
    const spy = proxied(test);
    expect((await getJson(test.url, '/v1/weights', { body: { version: 4 } })).status).toBe(200);
    const sandboxes = await sandboxDir(resources);
    await startNode(resources, { serviceUrl: test.url, nodeId: 'pausing', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await submit(test.url, ['p1', 'p2']);
    // both first turns are at the policy, sent by the node
    await until(() => fake.calls.length === 2);
    const paused = await getJson(test.url, '/v1/weights/pause', { body: { mode: 'abort' } });
    expect(paused.json).toMatchObject({ mode: 'abort', in_flight: 2, aborted: 2 });
    const during = fake.calls.length;
    await sleep(1_500);
    expect(fake.calls.length).toBe(during);
    expect(test.results).toHaveLength(0);
    expect((await getJson(test.url, '/v1/weights/resume', { body: { version: 5 } })).json).toMatchObject({ newest: 5, pause: null });
    await until(() => test.results.length === 2);
    for (const result of test.results) {
      expect(result).toMatchObject({ state: 'done', reward: 1, weight_version_min: 5, weight_version_max: 5 });
      expect(result.turns.map((turn) => turn.weight_version)).toEqual([5, 5]);
    }
    expect(spy).not.toHaveBeenCalled();
  }, 120_000);

  it("a pause in 'finish' mode answers once the node's turns in flight have ended, which keep the old version", async () => {
    const fake = await shellPolicy(1_500);
    const test = await startService(resources, fake.url);
    expect((await getJson(test.url, '/v1/weights', { body: { version: 4 } })).status).toBe(200);
    const sandboxes = await sandboxDir(resources);
    await startNode(resources, { serviceUrl: test.url, nodeId: 'finishing', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await submit(test.url, ['q1', 'q2']);
    await until(() => fake.calls.length === 2);
    const paused = await getJson(test.url, '/v1/weights/pause', { body: { mode: 'finish' } });
    expect(paused.json).toMatchObject({ mode: 'finish', in_flight: 2, aborted: 0 });
    // answered after the node's two first turns ended (each 1.5 s at the policy); no second turn started
    const during = fake.calls.length;
    expect(during).toBe(2);
    await sleep(1_000);
    expect(fake.calls.length).toBe(during);
    expect((await getJson(test.url, '/v1/weights/resume', { body: { version: 5 } })).status).toBe(200);
    await until(() => test.results.length === 2);
    for (const result of test.results) {
      expect(result).toMatchObject({ state: 'done', reward: 1, weight_version_min: 4, weight_version_max: 5 });
      expect(result.turns.map((turn) => turn.weight_version)).toEqual([4, 5]);
    }
  }, 120_000);

  it("a node lost mid-rollout gives back its rollouts' backend load; another node finishes them", async () => {
    const fake = await shellPolicy(2_000);
    const test = await startService(resources, fake.url);
    const sandboxes = await sandboxDir(resources);
    const doomed = await startNode(resources, { serviceUrl: test.url, nodeId: 'doomed', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await submit(test.url, ['l1', 'l2']);
    await until(() => fake.calls.length === 2);
    expect(Object.values(await poolRequests(test.url))[0]!.rollouts_in_flight).toBe(2);
    doomed.child.kill('SIGKILL');
    await doomed.exited;
    // lost after the node timeout: its leases (and the routes counted with them) are released
    await until(async () => Object.values(await poolRequests(test.url))[0]!.rollouts_in_flight === 0);
    fake.setFaults({});
    await startNode(resources, { serviceUrl: test.url, nodeId: 'heir', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await until(() => test.results.length === 2);
    for (const result of test.results) expect(result).toMatchObject({ state: 'done', reward: 1 });
    expect(Object.values(await poolRequests(test.url))[0]!.rollouts_in_flight).toBe(0);
  }, 120_000);

  it('across a restart of the service: the node goes on, asks for its routes again, and the new service counts them as its backend\'s load', async () => {
    const policy = await startShellPolicy(resources);
    policy.sleep = 2; // the rollouts are in their sandboxes, between their turns, when the service restarts
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-direct-restart-'));
    resources.add(() => rm(dir, { recursive: true, force: true }));
    const store = `sqlite://${join(dir, 'store.db')}`;
    const first = await startService(resources, policy.url, { store });
    const sandboxes = await sandboxDir(resources);
    const node = await startNode(resources, { serviceUrl: first.url, nodeId: 'survivor', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await submit(first.url, ['x1', 'x2']);
    await until(() => policy.calls.length === 2);
    await first.close();
    policy.setFaults({ latencyMs: 1_500 }); // the second turns take long enough to be seen in flight
    const second = await startService(resources, policy.url, { store, port: Number(new URL(first.url).port) });
    await node.waitFor('registered', (event) => event.again);
    await until(async () => Object.values(await poolRequests(second.url))[0]!.rollouts_in_flight === 2);
    await until(() => second.results.length === 2);
    for (const result of second.results) {
      expect(result).toMatchObject({ state: 'done', reward: 1 });
      expect(new Set(result.turns.map((t) => t.backend)).size).toBe(1);
    }
    expect(Object.values(await poolRequests(second.url))[0]).toMatchObject({ rollouts_in_flight: 0, requests: 0 });
  }, 120_000);

  it('a backend that stops answering: the node asks for another route and the service takes the dead one out of rotation', async () => {
    const [a, b] = [await shellPolicy(), await shellPolicy()];
    const test = await startService(resources, [a.url, b.url]);
    const sandboxes = await sandboxDir(resources);
    await a.kill();
    await startNode(resources, { serviceUrl: test.url, nodeId: 'rerouting', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await submit(test.url, ['f1', 'f2']);
    await until(() => test.results.length === 2);
    for (const result of test.results) {
      expect(result.state).toBe('done');
      expect(result.turns.every((t) => t.backend === new URL(b.url).host)).toBe(true);
    }
    const backends = await poolRequests(test.url);
    expect((backends[new URL(a.url).host] as unknown as { healthy: boolean }).healthy).toBe(false);
  }, 120_000);
  it('backends added and removed while the node runs: a rollout on a removed backend moves to the one added', async () => {
    const [a, b] = [await startShellPolicy(resources), await startShellPolicy(resources)];
    a.sleep = 1; // each rollout holds its sandbox a second between its two turns
    const test = await startService(resources, a.url);
    const sandboxes = await sandboxDir(resources);
    await startNode(resources, { serviceUrl: test.url, nodeId: 'moving', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await submit(test.url, ['m1', 'm2']);
    await until(() => a.calls.length === 2);
    const [idA, idB] = [new URL(a.url).host, new URL(b.url).host];
    expect((await getJson(test.url, '/v1/llm-backends', { body: { base_url: b.url } })).status).toBe(201);
    expect((await getJson(test.url, `/v1/llm-backends/${idA}`, { method: 'DELETE' })).status).toBe(200);
    await until(() => test.results.length === 2);
    for (const result of test.results) {
      expect(result).toMatchObject({ state: 'done', reward: 1 });
      expect(result.turns.map((t) => t.backend)).toEqual([idA, idB]);
    }
    expect(a.calls).toHaveLength(2);
    expect(b.calls).toHaveLength(2);
    expect((await poolRequests(test.url))[idB]).toMatchObject({ rollouts_in_flight: 0, requests: 0 });
  }, 120_000);
});

describe('old and new, mixed', () => {
  it('an older node (no direct-backends) gets its turns proxied as before; a new node against a service that hands out no routes falls back to /model', async () => {
    const fake = await shellPolicy();
    const sandboxes = await sandboxDir(resources);
    // the older node
    const service = await startService(resources, fake.url);
    const spy = proxied(service);
    await startNode(resources, { serviceUrl: service.url, nodeId: 'old-node', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2, directBackends: false }, sandboxes);
    await submit(service.url, ['o1', 'o2']);
    await until(() => service.results.length === 2);
    for (const result of service.results) expect(result).toMatchObject({ state: 'done', reward: 1 });
    expect(spy).toHaveBeenCalledTimes(4);
    // a service that does not take the feature up (as one from before it)
    const older = await startService(resources, fake.url, { directBackends: false });
    const olderSpy = proxied(older);
    await startNode(resources, { serviceUrl: older.url, nodeId: 'new-node', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await submit(older.url, ['n1', 'n2']);
    await until(() => older.results.length === 2);
    for (const result of older.results) expect(result).toMatchObject({ state: 'done', reward: 1 });
    expect(olderSpy).toHaveBeenCalledTimes(4);
  }, 120_000);

  it("the route is a node's: no token and a client's token are refused, and a node that did not register for it gets a 409", async () => {
    const fake = await shellPolicy();
    const test = await startService(resources, fake.url, { token: 'client-token', nodeToken: 'node-token' });
    const registration = { node_id: 'r1', host: 'h', pid: 1, capacity: { init: 1, run: 1, eval: 1 }, max_rollouts: 1, environments: ['shell'] };
    const asNode = { authorization: 'Bearer node-token', 'x-rollserve-node-features': 'weights,direct-backends' };
    const registered = await getJson(test.url, '/v1/nodes', { body: registration, headers: asNode });
    expect(registered.status).toBe(201);
    expect(registered.json).toMatchObject({ features: ['direct-backends'], weights: { pause: null, backends: [new URL(fake.url).host] } });
    const credential = { 'x-rollserve-node-credential': registered.json.credential as string };
    await submit(test.url, ['auth1'], { authorization: 'Bearer client-token' });
    const claimed = await getJson(test.url, '/v1/nodes/r1/claim', { body: { limit: 1, wait_ms: 5_000 }, headers: { ...asNode, ...credential } });
    const claim = claimed.json.claims[0];
    expect(claim.route).toMatchObject({ rollout_id: claim.rollout_id, attempt: claim.attempt, backend: { id: new URL(fake.url).host, base_url: fake.url }, headers: { 'x-rollout-id': claim.rollout_id } });
    expect(claimed.json.weights).toMatchObject({ backends: [new URL(fake.url).host] });
    const body = { rollout_id: claim.rollout_id, attempt: claim.attempt };
    expect((await getJson(test.url, '/v1/nodes/r1/route', { body, headers: credential })).status).toBe(401);
    expect((await getJson(test.url, '/v1/nodes/r1/route', { body, headers: { ...credential, authorization: 'Bearer client-token' } })).status).toBe(401);
    const route = await getJson(test.url, '/v1/nodes/r1/route', { body, headers: { ...asNode, ...credential } });
    expect(route.status).toBe(200);
    expect(route.json).toEqual(claim.route);
    expect((await getJson(test.url, '/v1/nodes/r1/route', { body: { ...body, attempt: claim.attempt + 1 }, headers: { ...asNode, ...credential } })).status).toBe(409);
    // one that registered without the feature
    const plain = await getJson(test.url, '/v1/nodes', { body: { ...registration, node_id: 'r2' }, headers: { authorization: 'Bearer node-token' } });
    expect(plain.json.features).toBeUndefined();
    expect(plain.json.weights).toBeUndefined();
    const refused = await getJson(test.url, '/v1/nodes/r2/route', { body, headers: { authorization: 'Bearer node-token', 'x-rollserve-node-credential': plain.json.credential } });
    expect(refused.status).toBe(409);
    // the list says which way each node's turns go
    const listed = await getJson(test.url, '/v1/nodes', { headers: { authorization: 'Bearer client-token' } });
    expect(Object.fromEntries((listed.json.nodes as Array<{ node_id: string; direct_backends: boolean }>).map((n) => [n.node_id, n.direct_backends]))).toEqual({ r1: true, r2: false });
  }, 60_000);
});
