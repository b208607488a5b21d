import { startRolloutNode, type NodeEvent } from '@rollserve/core/node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { shellEnvironment } from '@rollserve/testing';
import { getJson, Resources, startService, startShellPolicy, submit } from './helpers.ts';

// The node routes refuse what is wrong with a 4xx in the API's one error shape, never a 500.

const resources = new Resources();
let url: string;
const TOKEN = 'node-routes-token';
const auth = { authorization: `Bearer ${TOKEN}` };
const registration = { node_id: 'n1', host: 'h1', pid: 1, capacity: { init: 1, run: 1, eval: 1 }, max_rollouts: 1, environments: ['shell'] };

beforeAll(async () => {
  const fake = await startShellPolicy(resources);
  url = (await startService(resources, fake.url, { token: TOKEN })).url;
}, 60_000);
afterAll(() => resources.cleanup());

/** The credentials registrations answered, by node id. */
const credentials = new Map<string, string>();
const call = (path: string, init: { method?: string; body?: unknown; raw?: string; token?: boolean; as?: string } = {}) =>
  getJson(url, path, {
    ...init,
    headers: { ...(init.token === false ? {} : auth), ...(init.as && credentials.has(init.as) ? { 'x-rollserve-node-credential': credentials.get(init.as)! } : {}) },
  });
const register = async (body: unknown) => {
  const answer = await call('/v1/nodes', { body });
  if (answer.status === 201) credentials.set(answer.json.node_id, answer.json.credential);
  return answer;
};

function expectError(answer: { status: number; json: any }, status: number, code: string, says?: RegExp): void {
  expect(answer.status, JSON.stringify(answer.json)).toBe(status);
  expect(answer.json).toMatchObject({ error: { code, retryable: false } });
  expect(typeof answer.json.error.message).toBe('string');
  if (says) expect(answer.json.error.message).toMatch(says);
}

describe('node routes: bad requests', () => {
  it('registration: the token, the schema, and every environment of the service', async () => {
    expectError(await call('/v1/nodes', { body: registration, token: false }), 401, 'UNAUTHORIZED');
    expectError(await call('/v1/nodes', { raw: '{nope' }), 400, 'BAD_REQUEST');
    expectError(await call('/v1/nodes', { body: {} }), 422, 'UNPROCESSABLE', /node_id/);
    expectError(await call('/v1/nodes', { body: { ...registration, capacity: { init: 0, run: 1, eval: 1 } } }), 422, 'UNPROCESSABLE', /capacity/);
    expectError(await call('/v1/nodes', { body: { ...registration, node_id: 'a b/c' } }), 422, 'UNPROCESSABLE', /node_id/);
    expectError(await call('/v1/nodes', { body: { ...registration, environments: ['math'] } }), 422, 'UNPROCESSABLE', /shell/);
    expectError(await call('/v1/nodes', { body: { ...registration, node_id: 'service' } }), 422, 'UNPROCESSABLE', /reserved.*node_id/s);
    expectError(await call('/v1/nodes', { body: { ...registration, node_id: 'SERVICE' } }), 422, 'UNPROCESSABLE', /reserved/);
    const ok = await register({ ...registration, slurm: { job_id: '7', node_name: 'n1' } });
    expect(ok.status).toBe(201);
    expect(ok.json).toMatchObject({ node_id: 'n1', credential: expect.stringMatching(/^[\w-]{43}$/) });
    const listed = await call('/v1/nodes');
    expect(listed.json.nodes).toMatchObject([{ node_id: 'n1', slurm: { job_id: '7', node_name: 'n1' }, state: 'up', leases: 0 }]);
  });

  it('unknown nodes are a 404 (register again); bad bodies a 422 or 400', async () => {
    expectError(await call('/v1/nodes/ghost/heartbeat', { as: 'n1', body: { leases: [] } }), 404, 'NOT_FOUND', /ghost/);
    expectError(await call('/v1/nodes/ghost/claim', { as: 'n1', body: { limit: 1, wait_ms: 0 } }), 404, 'NOT_FOUND');
    expectError(await call('/v1/nodes/ghost', { as: 'n1', method: 'DELETE' }), 404, 'NOT_FOUND');
    expectError(await call('/v1/nodes/n1/heartbeat', { as: 'n1', body: { leases: [{ rollout_id: 'x', attempt: -1, stage: 'run' }] } }), 422, 'UNPROCESSABLE', /attempt/);
    expectError(await call('/v1/nodes/n1/heartbeat', { as: 'n1', body: { leases: [{ rollout_id: 'x', attempt: 1, stage: 'flying' }] } }), 422, 'UNPROCESSABLE', /stage/);
    expectError(await call('/v1/nodes/n1/claim', { as: 'n1', body: { limit: 0 } }), 422, 'UNPROCESSABLE', /limit/);
    expectError(await call('/v1/nodes/n1/claim', { as: 'n1', raw: 'limit=1' }), 400, 'BAD_REQUEST');
    expectError(await call('/v1/nodes/n1/results', { as: 'n1', body: { results: [] } }), 422, 'UNPROCESSABLE', /results/);
    expectError(await call('/v1/nodes/n1/results', { as: 'n1', body: { results: [{ rollout_id: 'x', attempt: 1, result: { id: 'x' } }] } }), 422, 'UNPROCESSABLE', /task_id/);
    // results whose token ids come sent once ($tokens) but do not decode
    const sent = (result: unknown) => ({ body: { results: [{ rollout_id: 'x', attempt: 1, result }] } });
    expectError(await call('/v1/nodes/n1/results', { as: 'n1', ...sent({ $tokens: 9, turns: [] }) }), 422, 'UNPROCESSABLE', /token encoding 9/);
    expectError(await call('/v1/nodes/n1/results', { as: 'n1', ...sent({ $tokens: 1, turns: [{ promptTokenIds: { keep: 3, add: [1] } }] }) }), 422, 'UNPROCESSABLE', /turns\[0\]\.promptTokenIds/);
    expectError(await call('/v1/nodes/n1/results', { as: 'n1', ...sent({ $tokens: 1, turns: [], response: { output: [{ prompt_token_ids: { $turn: 0 } }] } }) }), 422, 'UNPROCESSABLE', /response\.output\[0\]\.prompt_token_ids: no turn 0/);
    expectError(await call('/v1/nodes/n1/model', { as: 'n1', body: { rollout_id: 'x', attempt: 1, messages: 'hi', tools: [] } }), 422, 'UNPROCESSABLE', /messages/);
    // a turn for a rollout the node does not hold
    expectError(await call('/v1/nodes/n1/model', { as: 'n1', body: { rollout_id: 'x', attempt: 1, messages: [{ role: 'user', content: 'hi' }], tools: [] } }), 409, 'CONFLICT', /x/);
  });

  it('a node that leaves is answered 404 until it registers again', async () => {
    expect(await register({ ...registration, node_id: 'n2' })).toMatchObject({ status: 201 });
    expect(await call('/v1/nodes/n2/heartbeat', { as: 'n2', body: { leases: [] } })).toEqual({ status: 200, json: { renewed: [], lost: [], cancel: [] } });
    // a node that reads pauses of generation (x-rollserve-node-features: weights) hears of them; an older one gets the form above
    const features = { ...auth, 'x-rollserve-node-credential': credentials.get('n2')!, 'x-rollserve-node-features': 'weights' };
    expect(await getJson(url, '/v1/nodes/n2/heartbeat', { body: { leases: [] }, headers: features })).toEqual({ status: 200, json: { renewed: [], lost: [], cancel: [], generation_paused: false } });
    expect(await call('/v1/nodes/n2/claim', { as: 'n2', body: { limit: 1, wait_ms: 0 } })).toEqual({ status: 200, json: { claims: [] } });
    expect(await call('/v1/nodes/n2', { as: 'n2', method: 'DELETE' })).toEqual({ status: 200, json: { released: 0 } });
    expectError(await call('/v1/nodes/n2/heartbeat', { as: 'n2', body: { leases: [] } }), 404, 'NOT_FOUND');
    // a node that left may come back without its old credential: it gets a new one
    const old = credentials.get('n2');
    expect(await register({ ...registration, node_id: 'n2' })).toMatchObject({ status: 201 });
    expect(credentials.get('n2')).not.toBe(old);
    expect((await call('/v1/nodes/n2/heartbeat', { as: 'n2', body: { leases: [] } })).status).toBe(200);
    expectError(await getJson(url, '/v1/nodes/n2/heartbeat', { body: { leases: [] }, headers: { ...auth, 'x-rollserve-node-credential': old! } }), 401, 'UNAUTHORIZED', /credential/);
  });
});

describe('a node of rollserve before issue 24', () => {
  it('commits camelCase results, whole or with each token id once ($tokens: 1): stored and answered in today\'s form', async () => {
    expect(await register({ ...registration, node_id: 'old-node', max_rollouts: 2 })).toMatchObject({ status: 201 });
    const ids = await submit(url, ['old-whole', 'old-encoded'], auth);
    const claimed = await call('/v1/nodes/old-node/claim', { as: 'old-node', body: { limit: 2, wait_ms: 0 } });
    const claims = claimed.json.claims as Array<{ rollout_id: string; task_id: string; attempt: number }>;
    expect(claims.map((c) => c.rollout_id).sort()).toEqual([...ids].sort());
    // as that version's runner made a result: camelCase inside, its keys in its order
    const legacy = (id: string) => ({
      id, taskId: id, sampleIndex: 0, env: 'shell', state: 'done', reward: 1, rewardComponents: null, verifyExtras: { tag: id }, criticalError: null, error: null,
      response: { id: `resp_${id}`, output: [{ type: 'message', prompt_token_ids: [1, 2], generation_token_ids: [3], generation_log_probs: [-1] }] },
      messages: [{ role: 'user', content: `print tag ${id}` }],
      turns: [{
        index: 0, promptTokenIds: [1, 2], generationTokenIds: [3], generationLogprobs: [-1], finishReason: 'stop', text: id, reasoning: null,
        toolCalls: [{ id: 'c0', name: 'bash', arguments: '{}', output: '', status: 'ok', execution: { exitCode: 0, timedOut: false, exception: null }, code: 'true', durationMs: 3 }],
        llmLatencyMs: 5, backend: null, code: 'true', status: 'ok', malformed: null, rewards: { format: 0, tool: 1, outcome: 1, shaping: 0 }, reward: 1, return: 1, normalizedReturn: null,
      }],
      filter: false, advantage: null, credit: null,
      timing: { init: { queuedMs: 1, activeMs: 2 }, run: { queuedMs: 3, activeMs: 4 }, eval: { queuedMs: 5, activeMs: 6 }, totalMs: 21 }, finishedAt: '2026-01-01T00:00:00.000Z',
    });
    const whole = legacy('old-whole');
    const encoded = legacy('old-encoded');
    encoded.response.output[0] = { ...encoded.response.output[0]!, prompt_token_ids: { $turn: 0 }, generation_token_ids: { $turn: 0 }, generation_log_probs: { $turn: 0 } } as never;
    const attempt = (id: string) => claims.find((c) => c.rollout_id === id)!.attempt;
    const committed = await call('/v1/nodes/old-node/results', {
      as: 'old-node',
      body: { results: [{ rollout_id: 'old-whole', attempt: attempt('old-whole'), result: whole }, { rollout_id: 'old-encoded', attempt: attempt('old-encoded'), result: { ...encoded, $tokens: 1 } }] },
    });
    expect(committed.json).toEqual({ results: [{ rollout_id: 'old-whole', status: 'committed' }, { rollout_id: 'old-encoded', status: 'committed' }] });
    for (const id of ids) {
      const { json } = await call(`/v1/rollouts/${id}`);
      expect(Object.keys(json.result)).toEqual(['id', 'task_id', 'sample_index', 'env', 'state', 'reward', 'reward_components', 'verify_extras', 'critical_error', 'filter', 'error', 'advantage', 'credit', 'timing', 'response', 'messages', 'turns', 'weight_version_min', 'weight_version_max', 'stale', 'finished_at']);
      expect(json.result).toMatchObject({
        task_id: id, sample_index: 0, verify_extras: { tag: id }, critical_error: null, finished_at: '2026-01-01T00:00:00.000Z',
        // (from before weight versions: none)
        weight_version_min: null, weight_version_max: null, stale: false,
        timing: { init: { queued_ms: 1, active_ms: 2 }, run: { queued_ms: 3, active_ms: 4 }, eval: { queued_ms: 5, active_ms: 6 }, total_ms: 21 },
        response: { output: [{ prompt_token_ids: [1, 2], generation_token_ids: [3], generation_log_probs: [-1] }] },
        turns: [{ prompt_token_ids: [1, 2], generation_token_ids: [3], generation_logprobs: [-1], finish_reason: 'stop', llm_latency_ms: 5, weight_version: null, normalized_return: null, tool_calls: [{ duration_ms: 3, execution: { exit_code: 0, timed_out: false, exception: null } }] }],
      });
      expect(json.result.turns[0]).not.toHaveProperty('promptTokenIds');
    }
  });
});

describe('a node the service will not take back', () => {
  it('leaves instead of spinning when re-registering is refused (here: the restarted service wants another token)', async () => {
    const own = new Resources();
    try {
      const fake = await startShellPolicy(own);
      const first = await startService(own, fake.url, { token: 'old-token', heartbeatMs: 100, nodeTimeoutMs: 1_000 });
      const events: NodeEvent[] = [];
      const node = await startRolloutNode({ serviceUrl: first.url, token: 'old-token', nodeId: 'stale-token', environments: [shellEnvironment], pools: { init: 1, run: 1, eval: 1 }, onEvent: (e) => events.push(e) });
      own.add(() => node.close());
      await first.close();
      await startService(own, fake.url, { token: 'new-token', heartbeatMs: 100, nodeTimeoutMs: 1_000, port: Number(new URL(first.url).port) });
      const { refused } = await node.ended();
      expect(refused).toMatchObject({ code: 'UNAUTHORIZED' });
      expect(events.filter((e) => e.type === 'refused')).toEqual([{ type: 'refused', code: 'UNAUTHORIZED', message: expect.any(String) }]);
      expect(node.held).toBe(0);
    } finally {
      await own.cleanup();
    }
  }, 60_000);
});
