import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RolloutResult } from '@rollserve/core/service';
import { renderPrompt, toyTokenizer } from '@rollserve/testing';
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { descendants, getJson, Resources, sandboxDir, startCommitFaults, startNode, startService, startShellPolicy, streamResults, submit, until } from './helpers.ts';

// Rollout nodes as real processes (the agent of `rollserve node`, with a bwrap-sandboxed
// environment) against a real central service on loopback: work spreads over nodes, a node
// killed, frozen or leaving has its work run elsewhere, and every rollout ends with one result.
// The service's timings are short (heartbeat 250 ms, node timeout 3 s) so that losses show soon.

const resources = new Resources();
afterEach(() => resources.cleanup());

const ids = (prefix: string, n: number) => Array.from({ length: n }, (_, i) => `${prefix}${i}`);
const bwrapUnder = (pid: number) => descendants(pid).filter((p) => p.comm === 'bwrap');

/** Each of `ids` committed exactly once by the service, done with reward 1. */
function expectOneGoodResultEach(results: readonly RolloutResult[], rolloutIds: readonly string[]): void {
  const committed = results.filter((r) => rolloutIds.includes(r.id));
  expect(committed.map((r) => r.id).sort()).toEqual([...rolloutIds].sort());
  for (const r of committed) expect({ id: r.id, state: r.state, reward: r.reward }).toEqual({ id: r.id, state: 'done', reward: 1 });
}

describe('rollout nodes', () => {
  it('run the rollouts of a batch between them, each rollout once; GET /v1/nodes shows both', async () => {
    const fake = await startShellPolicy(resources);
    fake.sleep = 1; // long enough that one node cannot take the whole batch alone
    const { url, results } = await startService(resources, fake.url);
    const sandboxes = await sandboxDir(resources);
    const pools = { init: 2, run: 3, eval: 2 };
    const [a, b] = await Promise.all([
      startNode(resources, { serviceUrl: url, nodeId: 'node-a', pools, maxRollouts: 3 }, sandboxes),
      startNode(resources, { serviceUrl: url, nodeId: 'node-b', pools, maxRollouts: 3 }, sandboxes),
    ]);
    const listed = await getJson(url, '/v1/nodes');
    expect(listed.status).toBe(200);
    expect(listed.json.nodes.map((n: { node_id: string; state: string }) => [n.node_id, n.state]).sort()).toEqual([
      ['node-a', 'up'],
      ['node-b', 'up'],
    ]);
    expect(listed.json.nodes[0]).toMatchObject({ capacity: pools, max_rollouts: 3, environments: ['shell'] });
    expect((await getJson(url, '/metrics')).json).toMatch(/^rollserve_nodes_up 2$/m);

    const rollouts = await submit(url, ids('two', 12));
    // once seen stuck under a full suite's load (not reproduced): what each side knew, if again
    onTestFailed(() => {
      console.log(`results: ${results.map((r) => `${r.id}:${r.state}`).join(' ')}\nnode-a: ${a.output().slice(-3_000)}\nnode-b: ${b.output().slice(-3_000)}`);
    });
    const streamed = await streamResults(url, rollouts);
    expect(streamed.map((r) => r.id).sort()).toEqual([...rollouts].sort());
    expectOneGoodResultEach(results, rollouts);

    const committedBy = (node: typeof a) => node.events.filter((e) => e.type === 'committed' && e.status === 'committed').map((e) => (e as { rolloutId: string }).rolloutId);
    await until(() => committedBy(a).length + committedBy(b).length >= rollouts.length); // (their stdout may lag the service)
    expect(committedBy(a).length).toBeGreaterThan(0);
    expect(committedBy(b).length).toBeGreaterThan(0);
    expect([...committedBy(a), ...committedBy(b)].sort()).toEqual([...rollouts].sort());
    const after = await getJson(url, '/v1/nodes');
    for (const node of after.json.nodes) expect(node).toMatchObject({ state: 'up', leases: 0 });
    expect(after.json.nodes.map((n: { committed: number }) => n.committed).reduce((a: number, b: number) => a + b, 0)).toBe(rollouts.length);
    expect((await getJson(url, '/metrics')).json).toMatch(/^rollserve_rollouts_in_flight 0$/m);
  }, 180_000);

  it('route policy calls through the service across nodes: least in flight over the backends, every turn of a rollout on one', async () => {
    const [p1, p2] = [await startShellPolicy(resources), await startShellPolicy(resources)];
    p1.sleep = p2.sleep = 1; // rollouts overlap: the backends' in-flight counts matter
    const { url, results } = await startService(resources, [p1.url, p2.url]);
    const sandboxes = await sandboxDir(resources);
    const pools = { init: 3, run: 3, eval: 3 };
    await Promise.all([
      startNode(resources, { serviceUrl: url, nodeId: 'route-a', pools, maxRollouts: 3 }, sandboxes),
      startNode(resources, { serviceUrl: url, nodeId: 'route-b', pools, maxRollouts: 3 }, sandboxes),
    ]);
    const rollouts = await submit(url, ids('route', 8));
    await streamResults(url, rollouts);
    expectOneGoodResultEach(results, rollouts);
    // the prompts the policy tokenised for each conversation (named by its user message), in turn order
    const firstUser = (messages: unknown[]) => JSON.stringify(messages.find((m) => (m as { role: string }).role === 'user'));
    const promptsOf = (messages: unknown[]) =>
      [...p1.requests, ...p2.requests]
        .filter((r) => firstUser(r.messages) === firstUser(messages))
        .sort((x, y) => x.messages.length - y.messages.length)
        .map((r) => toyTokenizer.encode(renderPrompt(r.messages, r.tools as unknown[] | undefined)));
    for (const result of results) {
      expect(result.turns).toHaveLength(2);
      expect(new Set(result.turns.map((t) => t.backend)).size, result.id).toBe(1); // sticky per rollout
      // each turn's whole prompt came through the node's commit, which sends every id once
      expect(result.turns.map((t) => t.prompt_token_ids)).toEqual(promptsOf(result.messages));
      const items = (result.response as { output: Array<Record<string, unknown>> }).output.filter((item) => 'prompt_token_ids' in item);
      expect(items.map((item) => item.prompt_token_ids)).toEqual(result.turns.map((t) => t.prompt_token_ids));
    }
    // both backends served, each a fair share (least in flight, not all on the first)
    const served = [p1, p2].map((p) => p.requests.length);
    expect(served[0]! + served[1]!).toBe(16);
    expect(Math.min(...served)).toBeGreaterThanOrEqual(4);
  }, 180_000);

  it('a node SIGKILLed mid-batch: after the node timeout its rollouts run on another node, each once', async () => {
    const fake = await startShellPolicy(resources);
    fake.sleep = 600; // held in RUN by a sleeping sandbox until the node dies
    const { url, results } = await startService(resources, fake.url);
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: url, nodeId: 'doomed', pools: { init: 4, run: 4, eval: 4 }, maxRollouts: 4 }, sandboxes);
    const rollouts = await submit(url, ids('kill', 4));
    const claims = await a.waitForCount('claimed', 4);
    await until(() => fake.requests.length >= 4); // every rollout is in its sandbox's sleep
    a.child.kill('SIGKILL');
    await a.exited;
    fake.sleep = 0;

    const b = await startNode(resources, { serviceUrl: url, nodeId: 'survivor', pools: { init: 4, run: 4, eval: 4 }, maxRollouts: 4 }, sandboxes);
    await streamResults(url, rollouts);
    expectOneGoodResultEach(results, rollouts);
    // the survivor ran each of them under a new attempt
    for (const claim of claims) {
      const rerun = await b.waitFor('claimed', (e) => e.rolloutId === claim.rolloutId);
      expect(rerun.attempt).toBeGreaterThan(claim.attempt);
    }
    const nodes = (await getJson(url, '/v1/nodes')).json.nodes as Array<{ node_id: string; state: string }>;
    expect(nodes.find((n) => n.node_id === 'doomed')?.state).toBe('lost');
  }, 180_000);

  it('a node SIGSTOPped past the node timeout learns on SIGCONT that its leases are lost: it kills its sandboxes and commits nothing; a late commit is stale', async () => {
    const fake = await startShellPolicy(resources);
    fake.sleep = 600;
    const { url, service, results } = await startService(resources, fake.url);
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: url, nodeId: 'frozen', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    const rollouts = await submit(url, ids('stop', 2));
    const claims = await a.waitForCount('claimed', 2);
    await until(() => fake.requests.length >= 2 && bwrapUnder(a.pid).length >= 2);

    a.child.kill('SIGSTOP');
    await until(async () => ((await getJson(url, '/v1/nodes')).json.nodes as Array<{ node_id: string; state: string }>).some((n) => n.node_id === 'frozen' && n.state === 'lost'));
    fake.sleep = 0;
    await startNode(resources, { serviceUrl: url, nodeId: 'thawed-not', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await streamResults(url, rollouts);
    expectOneGoodResultEach(results, rollouts);
    expect(bwrapUnder(a.pid).length).toBeGreaterThanOrEqual(2); // still sleeping under the frozen node

    a.child.kill('SIGCONT');
    for (const claim of claims) {
      await a.waitFor('lost', (e) => e.rolloutId === claim.rolloutId);
      await a.waitFor('dropped', (e) => e.rolloutId === claim.rolloutId);
    }
    await until(() => bwrapUnder(a.pid).length === 0);
    await a.waitFor('registered', (e) => e.again); // and it comes back for more work
    expect(a.events.filter((e) => e.type === 'committed')).toEqual([]);

    // a late commit in the frozen node's name, without its credential, changes nothing (one with
    // it is stale: the store takes a result only from the lease's holder; see hostile.test.ts)
    const first = claims[0]!;
    const stored = (await service.result(first.rolloutId))!;
    const late = await getJson(url, '/v1/nodes/frozen/results', { body: { results: [{ rollout_id: first.rolloutId, attempt: first.attempt, result: { ...stored, reward: 0 } }] } });
    expect(late).toMatchObject({ status: 401, json: { error: { code: 'UNAUTHORIZED' } } });
    expect((await service.result(first.rolloutId))!.reward).toBe(1);
    expect(results.filter((r) => r.id === first.rolloutId)).toHaveLength(1);
  }, 180_000);

  it('SIGTERM: the node aborts what it holds, leaves (exit 0), and its rollouts are queued again at once', async () => {
    const fake = await startShellPolicy(resources);
    fake.sleep = 600;
    // a node timeout no test waits for: the re-queue must come from the node's leaving
    const { url, results } = await startService(resources, fake.url, { nodeTimeoutMs: 600_000, leaseMs: 600_000 });
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: url, nodeId: 'leaving', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    const rollouts = await submit(url, ids('term', 2));
    await a.waitForCount('claimed', 2);
    await until(() => fake.requests.length >= 2 && bwrapUnder(a.pid).length >= 2);

    a.child.kill('SIGTERM');
    expect(await a.exited).toEqual({ code: 0, signal: null });
    expect(await a.waitFor('left')).toEqual({ type: 'left', released: 2 });
    expect(a.events.filter((e) => e.type === 'committed')).toEqual([]);
    for (const id of rollouts) expect((await getJson(url, `/v1/rollouts/${id}`)).json).toMatchObject({ id, state: 'queued', result: null });
    const nodes = (await getJson(url, '/v1/nodes')).json.nodes as Array<{ node_id: string; state: string }>;
    expect(nodes.find((n) => n.node_id === 'leaving')?.state).toBe('left');

    fake.sleep = 0;
    await startNode(resources, { serviceUrl: url, nodeId: 'arriving', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    await streamResults(url, rollouts);
    expectOneGoodResultEach(results, rollouts);
  }, 180_000);

  it('a node whose service is gone for its serviceLostMs kills its sandboxes and ends (status 3), instead of retrying for ever', async () => {
    const fake = await startShellPolicy(resources);
    fake.sleep = 600;
    const { url, close } = await startService(resources, fake.url, { nodeTimeoutMs: 600_000, leaseMs: 600_000 });
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: url, nodeId: 'orphan', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2, serviceLostMs: 1_500 }, sandboxes);
    await submit(url, ids('orphan', 2));
    await a.waitForCount('claimed', 2);
    await until(() => fake.requests.length >= 2 && bwrapUnder(a.pid).length >= 2);
    const sandboxPids = bwrapUnder(a.pid).map((p) => p.pid);

    await close();
    expect(await a.exited).toEqual({ code: 3, signal: null });
    expect(a.events.filter((e) => e.type === 'orphaned')).toEqual([{ type: 'orphaned', reason: expect.stringMatching(/has not answered/) }]);
    expect(a.events.filter((e) => e.type === 'committed')).toEqual([]);
    const gone = (pid: number) => {
      try {
        return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.startsWith('Z');
      } catch {
        return true;
      }
    };
    await until(() => sandboxPids.every(gone));
  }, 180_000);

  it('cancelling a rollout that runs on a node: the node aborts it, kills its sandbox and commits the cancelled result', async () => {
    const fake = await startShellPolicy(resources);
    fake.sleep = 600;
    const { url, results } = await startService(resources, fake.url);
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: url, nodeId: 'busy', pools: { init: 1, run: 1, eval: 1 }, maxRollouts: 1 }, sandboxes);
    const [id] = await submit(url, ['cancel-me']);
    await a.waitFor('claimed');
    await until(() => fake.requests.length >= 1 && bwrapUnder(a.pid).length >= 1);

    const cancelled = await getJson(url, `/v1/rollouts/${id}`, { method: 'DELETE' });
    expect(cancelled).toMatchObject({ status: 200, json: { id, state: 'cancelled', result: { state: 'cancelled', critical_error: 'cancelled', filter: true } } });
    await a.waitFor('cancel', (e) => e.rolloutId === id);
    expect(await a.waitFor('committed', (e) => e.rolloutId === id)).toMatchObject({ status: 'committed', state: 'cancelled' });
    expect(results.filter((r) => r.id === id).map((r) => r.state)).toEqual(['cancelled']);
    await until(() => bwrapUnder(a.pid).length === 0);
  }, 180_000);

  it('the service restarted (same store and address): nodes register again under their ids and finish their rollouts, each once', async () => {
    const fake = await startShellPolicy(resources);
    fake.sleep = 3; // the service is down while the sandboxes sleep
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-node-store-'));
    resources.add(() => rm(dir, { recursive: true, force: true }));
    const store = `sqlite://${join(dir, 'store.db')}`;
    // a node timeout longer than the restart: the nodes' leases stay theirs
    const timings = { store, nodeTimeoutMs: 8_000 };
    const first = await startService(resources, fake.url, timings);
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: first.url, nodeId: 'steady', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    const rollouts = await submit(first.url, ids('restart', 2));
    const claims = await a.waitForCount('claimed', 2);
    await until(() => fake.requests.length >= 2);

    await first.close();
    const second = await startService(resources, fake.url, { ...timings, port: Number(new URL(first.url).port) });
    await a.waitFor('registered', (e) => e.again);
    await streamResults(second.url, rollouts);
    expectOneGoodResultEach(second.results, rollouts);
    // the node's rollouts ended on the node; nothing it committed was refused
    for (const claim of claims) await a.waitFor('committed', (e) => e.rolloutId === claim.rolloutId && e.status === 'committed');
    expect(a.events.filter((e) => e.type === 'committed' && e.status !== 'committed')).toEqual([]);
    // and they went on through the restart: the new service took the leases' policy calls, nothing ran twice
    expect(a.events.filter((e) => e.type === 'claimed')).toHaveLength(2);
    expect(a.events.filter((e) => e.type === 'lost' || e.type === 'dropped')).toEqual([]);
  }, 180_000);

  it('a commit whose answer is lost, or that the service cannot take, is sent again until answered: one result each', async () => {
    const fake = await startShellPolicy(resources);
    const { url, results } = await startService(resources, fake.url);
    const proxy = await startCommitFaults(resources, url, { lostAnswers: 1, unavailable: 2 });
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: proxy.url, nodeId: 'retrying', pools: { init: 1, run: 1, eval: 1 }, maxRollouts: 1 }, sandboxes);
    const rollouts = await submit(url, ids('retry', 3));
    await streamResults(url, rollouts);
    expectOneGoodResultEach(results, rollouts);
    // the first commit went through but its answer was lost: the node sends it again and hears
    // it is a duplicate (a heartbeat's "lost" meanwhile does not stop a finished rollout's commit)
    const first = (await a.waitFor('claimed')).rolloutId; // (one at a time: its commit was the first)
    const rest = rollouts.filter((id) => id !== first);
    const settled = await Promise.race([a.waitFor('committed', (e) => e.rolloutId === first), a.waitFor('lost', (e) => e.rolloutId === first)]);
    expect(settled, JSON.stringify(settled)).toMatchObject({ type: 'committed', status: 'duplicate' });
    for (const id of rest) expect(await a.waitFor('committed', (e) => e.rolloutId === id)).toMatchObject({ status: 'committed', state: 'done' });
    expect(proxy.seen).toMatchObject({ lost: 1, refused: 2 });
  }, 180_000);

  it('a commit answered late: heartbeats sent meanwhile, which the service answers "lost" (it took the commit), do not make the node report its committed rollouts lost', async () => {
    const fake = await startShellPolicy(resources);
    const { url, results } = await startService(resources, fake.url);
    // heartbeats every 250 ms: several go out while each commit's answer is held
    const proxy = await startCommitFaults(resources, url, { lostAnswers: 0, unavailable: 0, slowAnswersMs: 1_500 });
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: proxy.url, nodeId: 'slow-answers', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    const rollouts = await submit(url, ids('late', 3));
    await streamResults(url, rollouts);
    expectOneGoodResultEach(results, rollouts);
    for (const id of rollouts) {
      const settled = await Promise.race([a.waitFor('committed', (e) => e.rolloutId === id), a.waitFor('lost', (e) => e.rolloutId === id)]);
      expect(settled, JSON.stringify(settled)).toMatchObject({ type: 'committed', status: 'committed', state: 'done' });
    }
    expect(a.events.filter((e) => e.type === 'lost')).toEqual([]);
  }, 180_000);

  it('a service from before results were sent with each token id once: the node sends them whole, each rollout once', async () => {
    const fake = await startShellPolicy(resources);
    const { url, results } = await startService(resources, fake.url);
    const proxy = await startCommitFaults(resources, url, { lostAnswers: 0, unavailable: 0, oldService: true });
    const sandboxes = await sandboxDir(resources);
    const a = await startNode(resources, { serviceUrl: proxy.url, nodeId: 'upgraded', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2 }, sandboxes);
    const rollouts = await submit(url, ids('whole', 4));
    await streamResults(url, rollouts);
    expectOneGoodResultEach(results, rollouts);
    for (const id of rollouts) expect(await a.waitFor('committed', (e) => e.rolloutId === id)).toMatchObject({ status: 'committed', state: 'done' });
    // refused once in the compact form, then whole from then on
    expect(proxy.seen).toMatchObject({ refusedForm: 1 });
    expect(proxy.seen.passed).toBeGreaterThanOrEqual(1);
    for (const result of results) expect(result.turns.every((t) => Array.isArray(t.prompt_token_ids))).toBe(true);
  }, 180_000);
});
