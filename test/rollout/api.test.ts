import { createRolloutApi, RolloutResult, RolloutTask, startRolloutServer, ToolCallRecord, TurnRecord, type RolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { call, counterEnvironment, startFakePolicy, type FakePolicy } from '@rollserve/testing';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

let fake: FakePolicy;
let server: RolloutServer;
const TOKEN = 'test-token-123';
const auth = { authorization: `Bearer ${TOKEN}` };

const task = (id: string, question: string, expected: string, extra: Record<string, unknown> = {}) => ({
  id,
  env: 'math',
  row: { responses_create_params: { input: [{ role: 'user', content: question }] }, question, expected_answer: expected },
  policy: { model: 'fake-policy' },
  ...extra,
});

beforeAll(async () => {
  fake = await startFakePolicy({
    script: (req) => {
      const question = String((req.messages[0] as { content: unknown }).content);
      if (question.startsWith('hang')) return { content: 'x', hang: true };
      const n = /(\d+)\+(\d+)/.exec(question);
      return n ? `\\boxed{${Number(n[1]) + Number(n[2])}}` : 'no idea';
    },
  });
  server = await startRolloutServer({ environments: [math, counterEnvironment], token: TOKEN, defaultModel: 'fake-policy' });
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

describe('rollout service HTTP API', () => {
  it('requires the bearer token, but not for /health', async () => {
    expect((await call(server.url, 'GET', '/health')).status).toBe(200);
    const denied = await call(server.url, 'GET', '/v1/status');
    expect(denied.status).toBe(401);
    expect(denied.json).toMatchObject({ error: { code: 'UNAUTHORIZED' } });
    expect((await call(server.url, 'GET', '/v1/status', undefined, { authorization: 'Bearer wrong' })).status).toBe(401);
  });

  it('manages LLM backends at run time', async () => {
    const added = await call(server.url, 'POST', '/v1/llm-backends', { id: 'fake', base_url: fake.url }, auth);
    expect(added.status).toBe(201);
    expect((await call(server.url, 'POST', '/v1/llm-backends', { base_url: 'not a url' }, auth)).status).toBe(422);
    const listed = await call(server.url, 'GET', '/v1/llm-backends', undefined, auth);
    expect(JSON.stringify(listed.json)).toContain(fake.url);
    expect((await call(server.url, 'DELETE', '/v1/llm-backends/nope', undefined, auth)).status).toBe(404);
  });

  it('accepts a batch with 202, then serves each result, a listing with a cursor and the status', async () => {
    const submit = await call(server.url, 'POST', '/v1/rollouts', { tasks: [task('a1', '1+1?', '2'), task('a2', '2+2?', '5'), task('a3', '3+4?', '7', { n: 2 })] }, auth);
    expect(submit.status).toBe(202);
    expect(submit.json).toEqual({
      tasks: [
        { task_id: 'a1', rollout_ids: ['a1'], existing: false },
        { task_id: 'a2', rollout_ids: ['a2'], existing: false },
        { task_id: 'a3', rollout_ids: ['a3:0', 'a3:1'], existing: false },
      ],
      warnings: [],
    });
    const stream = await request(`${server.url}/v1/rollouts/stream?ids=a1,a2,a3`, { headers: auth });
    const lines = (await stream.body.text()).split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l) as { id: string; reward: number });
    expect(stream.headers['content-type']).toContain('application/x-ndjson');
    expect(lines.map((l) => l.id).sort()).toEqual(['a1', 'a2', 'a3:0', 'a3:1']);
    const one = await call(server.url, 'GET', '/v1/rollouts/a2', undefined, auth);
    expect(one.json).toMatchObject({ id: 'a2', state: 'done', result: { reward: 0, verify_extras: { extracted_answer: '4' } } });
    // a result's keys come in the schema's order, as it was made (the stream) and as it was stored
    const resultKeys = Object.keys(RolloutResult.shape).filter((key) => key !== 'metadata');
    for (const result of [lines[0], (one.json as { result: unknown }).result] as Array<Record<string, unknown> & { turns: Array<Record<string, unknown>> }>) {
      expect(Object.keys(result)).toEqual(resultKeys);
      expect(Object.keys(result.turns[0]!)).toEqual(Object.keys(TurnRecord.shape));
    }
    expect(Object.keys(ToolCallRecord.shape)).toEqual(['id', 'name', 'arguments', 'output', 'status', 'execution', 'code', 'duration_ms']);
    const group = await call(server.url, 'GET', '/v1/rollouts/a3', undefined, auth);
    expect((group.json as { rollouts: Array<{ result: { reward: number } }> }).rollouts.map((r) => r.result.reward)).toEqual([1, 1]);
    const page1 = await call(server.url, 'GET', '/v1/rollouts?limit=3', undefined, auth);
    const p1 = page1.json as { items: Array<{ id: string }>; next_cursor: string };
    expect(p1.items.map((i) => i.id)).toEqual(['a1', 'a2', 'a3:0']);
    const page2 = await call(server.url, 'GET', `/v1/rollouts?limit=3&cursor=${p1.next_cursor}`, undefined, auth);
    expect((page2.json as { items: Array<{ id: string }> }).items.map((i) => i.id)).toEqual(['a3:1']);
    const status = await call(server.url, 'GET', '/v1/status', undefined, auth);
    expect(status.json).toMatchObject({ stages: { init: { pool: 64 }, run: { pool: 512 }, eval: { pool: 32 } }, environments: ['math', 'counter'] });
    const metrics = await call(server.url, 'GET', '/metrics', undefined, auth);
    expect(metrics.text).toContain('rollserve_stage_seconds_bucket{le="0.001",stage="run"}');
    expect(metrics.text).toMatch(/rollserve_rollouts_finished_total\{state="done",critical_error="none"\} [1-9]/);
  });

  it('streams results as SSE', async () => {
    await call(server.url, 'POST', '/v1/rollouts', task('s1', '5+5?', '10'), auth);
    const stream = await request(`${server.url}/v1/rollouts/stream?ids=s1&format=sse`, { headers: auth });
    const text = await stream.body.text();
    expect(stream.headers['content-type']).toContain('text/event-stream');
    expect(text).toMatch(/event: result\ndata: \{.*"id":"s1".*"reward":1/);
    expect(text).toContain('event: end');
  });

  it('survives a client that leaves an NDJSON stream mid-way: the rollouts go on, and another stream serves them', async () => {
    await call(server.url, 'POST', '/v1/rollouts', { tasks: [task('left-1', '6+6?', '12'), task('left-hang', 'hang 2+2?', '4')] }, auth);
    const leaving = new AbortController();
    const stream = await request(`${server.url}/v1/rollouts/stream?ids=left-1,left-hang`, { headers: auth, signal: leaving.signal });
    let seen = '';
    for await (const chunk of stream.body) {
      seen += Buffer.from(chunk as Uint8Array).toString();
      if (seen.includes('\n')) break; // the first result; the other is stuck at the policy
    }
    expect(JSON.parse(seen.split('\n')[0]!)).toMatchObject({ id: 'left-1', reward: 1 });
    leaving.abort();
    // The service goes on: the stuck rollout is still there to cancel, and a new stream serves both.
    const cancelled = await call(server.url, 'DELETE', '/v1/rollouts/left-hang', undefined, auth);
    expect(cancelled.json).toMatchObject({ id: 'left-hang', state: 'cancelled' });
    const again = await request(`${server.url}/v1/rollouts/stream?ids=left-1,left-hang`, { headers: auth });
    const lines = (await again.body.text()).split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l) as { id: string; state: string });
    expect(lines.map((l) => [l.id, l.state]).sort()).toEqual([
      ['left-1', 'done'],
      ['left-hang', 'cancelled'],
    ]);
  });

  it('cancels a running rollout with DELETE', async () => {
    await call(server.url, 'POST', '/v1/rollouts', task('hang1', 'hang 1+1?', '2'), auth);
    while ((await call(server.url, 'GET', '/v1/rollouts/hang1', undefined, auth)).text.includes('"state":"queued"')) {
      await new Promise((r) => setTimeout(r, 10));
    }
    const cancelled = await call(server.url, 'DELETE', '/v1/rollouts/hang1', undefined, auth);
    expect(cancelled.json).toMatchObject({ id: 'hang1', state: 'cancelled', result: { critical_error: 'cancelled', filter: true } });
  });

  it('answers ProRL-style /process with the finished result', async () => {
    const processed = await call(
      server.url,
      'POST',
      '/process',
      { instance: { env: 'math', responses_create_params: { input: '20+22?' }, question: '20+22?', expected_answer: '42' }, sampling_params: { temperature: 0.5 }, job_id: 'p1' },
      auth,
    );
    expect(processed.status).toBe(200);
    // ProRL Agent's result shape (test/rollout/prorl-api.test.ts covers the rest of that API).
    expect(processed.json).toMatchObject({ job_id: 'p1', reward: 1, resolved: true, critical_error: null, filter: false });
    expect((processed.json as { messages: Array<{ role: string }> }).messages.map((m) => m.role)).toEqual(['user', 'assistant']);
  });

  it('serves an OpenAPI document that covers every route and matches the request schema', async () => {
    const doc = await call(server.url, 'GET', '/openapi.json');
    expect(doc.status).toBe(200);
    const openapi = doc.json as { openapi: string; paths: Record<string, Record<string, unknown>>; components: { schemas: Record<string, { properties?: Record<string, unknown>; required?: string[] }> } };
    expect(openapi.openapi).toBe('3.1.0');
    const documented = new Set(Object.entries(openapi.paths).flatMap(([path, ops]) => Object.keys(ops).filter((k) => k !== 'parameters').map((m) => `${m.toUpperCase()} ${path}`)));
    const app = createRolloutApi(server.service);
    const routes = app.routes.filter((r) => r.method !== 'ALL').map((r) => `${r.method} ${r.path.replace(/:(\w+)/g, '{$1}')}`);
    expect(routes.length).toBeGreaterThan(10);
    for (const route of routes) expect(documented, route).toContain(route);
    const taskSchema = openapi.components.schemas.RolloutTask!;
    expect(Object.keys(taskSchema.properties!).sort()).toEqual(Object.keys(RolloutTask.shape).sort());
    expect(taskSchema.required).toEqual(expect.arrayContaining(['env', 'row', 'policy']));
  });

  it('rejects bad input with clear 4xx errors and stays up', async () => {
    const notJson = await call(server.url, 'POST', '/v1/rollouts', '{nope', auth);
    expect(notJson.status).toBe(400);
    const invalid = await call(server.url, 'POST', '/v1/rollouts', { env: 'math', row: {}, policy: {} }, auth);
    expect(invalid.status).toBe(422);
    expect(invalid.json).toMatchObject({ error: { code: 'UNPROCESSABLE' } });
    const unknownEnv = await call(server.url, 'POST', '/v1/rollouts', { ...task('u', '1+1', '2'), env: 'chess' }, auth);
    expect(unknownEnv.status).toBe(404);
    expect((await call(server.url, 'GET', '/v1/rollouts/missing', undefined, auth)).status).toBe(404);
    expect((await call(server.url, 'GET', '/v1/rollouts?cursor=@@', undefined, auth)).status).toBe(400);
    expect((await call(server.url, 'GET', '/health')).status).toBe(200);
  });

  it('streams whole groups: each task once all its samples are done, advantages filled', async () => {
    const submitted = await call(server.url, 'POST', '/v1/rollouts', { tasks: [task('grp-a', '1+1', '2', { n: 3 }), task('grp-b', '2+2', '4', { n: 2 })] }, auth);
    expect(submitted.status).toBe(202);
    const response = await request(`${server.url}/v1/rollouts/groups/stream?ids=grp-a,grp-b`, { headers: auth });
    const groups = (await response.body.text()).split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l) as { task_id: string; results: Array<{ task_id: string; advantage: number | null }> });
    expect(groups.map((g) => g.task_id).sort()).toEqual(['grp-a', 'grp-b']);
    for (const group of groups) {
      expect(group.results).toHaveLength(group.task_id === 'grp-a' ? 3 : 2);
      expect(group.results.every((r) => r.task_id === group.task_id && r.advantage !== null)).toBe(true);
    }
    expect((await call(server.url, 'GET', '/v1/rollouts/groups/stream?ids=nope', undefined, auth)).status).toBe(404);
  });

  it('streams training views (view=training) of results and of whole groups, as GET ?view=training gives them', async () => {
    const submitted = await call(server.url, 'POST', '/v1/rollouts', { tasks: [task('tv-a', '3+4', '7', { n: 2 }), task('tv-b', '1+2', '3')] }, auth);
    expect(submitted.status).toBe(202);
    const lines = async (path: string) => (await (await request(`${server.url}${path}`, { headers: auth })).body.text()).split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l) as Record<string, any>);
    const single = await lines('/v1/rollouts/stream?ids=tv-b&view=training');
    expect(single).toHaveLength(1);
    expect(single[0]).toMatchObject({ id: 'tv-b', task_id: 'tv-b', reward: 1, sequence_error: null });
    expect(single[0]!.response_ids.length).toBeGreaterThan(0);
    expect(single[0]).not.toHaveProperty('response'); // not the full result
    expect(single[0]).toEqual((await call(server.url, 'GET', '/v1/rollouts/tv-b?view=training', undefined, auth)).json);
    const [group] = await lines('/v1/rollouts/groups/stream?ids=tv-a&view=training');
    expect(group!.task_id).toBe('tv-a');
    expect(group!.results.map((r: { id: string }) => r.id)).toEqual(['tv-a:0', 'tv-a:1']);
    expect(group!.results.every((r: { advantage: number | null; prompt_ids: number[] }) => r.advantage !== null && r.prompt_ids.length > 0)).toBe(true);
    expect({ task_id: 'tv-a', rollouts: group!.results }).toEqual((await call(server.url, 'GET', '/v1/rollouts/tv-a?view=training', undefined, auth)).json);
    for (const path of ['/v1/rollouts/stream?ids=tv-b&view=full', '/v1/rollouts/groups/stream?ids=tv-a&view=full']) {
      const refused = await call(server.url, 'GET', path, undefined, auth);
      expect(refused.status, path).toBe(400);
      expect(refused.json).toMatchObject({ error: { code: 'BAD_REQUEST', message: expect.stringMatching(/view is "training"/) } });
    }
  });

  it('refuses unknown fields with a 422 that names them, instead of running with defaults', async () => {
    const typo = await call(server.url, 'POST', '/v1/rollouts', { ...task('typo', '1+1', '2'), nn: 4 }, auth);
    expect(typo.status).toBe(422);
    expect(typo.json).toMatchObject({ error: { code: 'UNPROCESSABLE', details: [{ code: 'unrecognized_keys', keys: ['nn'] }] } });
    const base = task('typo2', '1+1', '2');
    const nested = await call(server.url, 'POST', '/v1/rollouts', { tasks: [{ ...base, policy: { ...base.policy, samplng: { temperature: 0 } } }] }, auth);
    expect(nested.status).toBe(422);
    expect(nested.json).toMatchObject({ error: { details: [{ code: 'unrecognized_keys', keys: ['samplng'], path: ['tasks', 0, 'policy'] }] } });
    expect((nested.json as { error: { message: string } }).error.message).toContain('samplng');
    const limits = await call(server.url, 'POST', '/v1/rollouts', { ...task('typo3', '1+1', '2'), limits: { max_turn: 3 } }, auth);
    expect(limits.status).toBe(422);
    // a typo inside sampling: vLLM would ignore it and sample at its defaults
    const sampling = await call(server.url, 'POST', '/v1/rollouts', { tasks: [base, { ...task('typo4', '1+1', '2'), policy: { model: 'fake-policy', sampling: { temprature: 0.7, n: 4 } } }] }, auth);
    expect(sampling.status).toBe(422);
    expect(sampling.json).toMatchObject({ error: { code: 'UNPROCESSABLE', details: [{ code: 'unrecognized_keys', keys: ['temprature', 'n'], path: ['tasks', 1, 'policy', 'sampling'] }] } });
    expect((sampling.json as { error: { message: string } }).error.message).toContain('"temprature" (did you mean "temperature"?), "n" (did you mean the task\'s `n`?)');
    // vLLM's own names beyond the common ones pass
    const vllm = await call(server.url, 'POST', '/v1/rollouts', { ...task('vllm-extras', '1+1', '2'), policy: { model: 'fake-policy', sampling: { temperature: 0, min_p: 0.05, skip_special_tokens: false } } }, auth);
    expect(vllm.status).toBe(202);
    // nothing of those ran
    expect((await call(server.url, 'GET', '/v1/rollouts/typo', undefined, auth)).status).toBe(404);
    expect((await call(server.url, 'GET', '/v1/rollouts/typo2', undefined, auth)).status).toBe(404);
  });
});

describe('a submission with no usable policy backend', () => {
  let bare: RolloutServer | undefined;
  afterAll(async () => {
    await bare?.close();
  });

  it('says so in its 202 and in /v1/status until a backend is added, then runs', async () => {
    bare = await startRolloutServer({ environments: [math] });
    const status0 = await call(bare.url, 'GET', '/v1/status');
    expect(status0.json).toMatchObject({ warnings: [], llm_backends: [] });

    // a task naming its own base_url needs no backend of the service's
    const own = await call(bare.url, 'POST', '/v1/rollouts', task('own-url', '1+2', '3', { policy: { model: 'fake-policy', base_url: fake.url } }));
    expect(own.status).toBe(202);
    expect(own.json).toMatchObject({ warnings: [] });

    const submitted = await call(bare.url, 'POST', '/v1/rollouts', { tasks: [task('nb1', '1+1', '2'), task('nb2', '2+3', '5', { n: 2 })] });
    expect(submitted.status).toBe(202);
    const warnings = (submitted.json as { warnings: string[] }).warnings;
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/no policy backend.*nb1, nb2.*add one with POST \/v1\/llm-backends or --llm/);

    const status = await call(bare.url, 'GET', '/v1/status');
    const held = (status.json as { warnings: string[] }).warnings;
    expect(held).toHaveLength(1);
    expect(held[0]).toMatch(/no policy backend for 3 unfinished rollouts.*add one with POST \/v1\/llm-backends or --llm/);

    expect((await call(bare.url, 'POST', '/v1/llm-backends', { base_url: fake.url })).status).toBe(201);
    expect((await call(bare.url, 'GET', '/v1/status')).json).toMatchObject({ warnings: [] });
    const stream = await request(`${bare.url}/v1/rollouts/stream?ids=nb1,nb2,own-url`);
    const results = (await stream.body.text()).split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l) as { id: string; reward: number });
    expect(results.map((r) => [r.id, r.reward]).sort()).toEqual([['nb1', 1], ['nb2:0', 1], ['nb2:1', 1], ['own-url', 1]]);
    expect((await call(bare.url, 'GET', '/v1/status')).json).toMatchObject({ warnings: [] });
  });
});
