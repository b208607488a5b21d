import { createRolloutApi, startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { counterEnvironment, startFakePolicy, type FakePolicy } from '@rollserve/testing';
import openapiTS, { astToString } from 'openapi-typescript';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { z } from 'zod';

// Every route of the generated document gets real requests, and every real answer is checked
// against the schema the document declares for its status: a route, a status or a key that the
// document does not declare fails here, and so does a documented route that no test exercises.

let fake: FakePolicy;
let server: RolloutServer;
const TOKEN = 'openapi-token-1';
const auth = { authorization: `Bearer ${TOKEN}` };

type Content = Record<string, { schema: z.ZodType }>;
type Declared = Map<string, { security?: unknown[]; tags?: string[]; responses: Record<string, { content?: Content }> }>;
let declared: Declared;
let documentOps: string[];
/** `METHOD /path/{param}` → the statuses a real request got. */
const exercised = new Map<string, Set<number>>();

const task = (id: string, question: string, expected: string, extra: Record<string, unknown> = {}) => ({
  id,
  env: 'math',
  row: { responses_create_params: { input: [{ role: 'user', content: question }] }, question, expected_answer: expected },
  policy: { model: 'fake-policy' },
  ...extra,
});

const essence = (contentType: string | undefined) => (contentType ?? '').split(';')[0]!.trim().toLowerCase();

function check(op: string, schema: z.ZodType, value: unknown, what: string): void {
  const parsed = schema.safeParse(value);
  expect(parsed.success, `${op} ${what} does not fit its declared schema: ${parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 5))}`).toBe(true);
}

function sseEvents(text: string): Array<{ event: string; data: string }> {
  return text
    .split('\n\n')
    .filter((block) => block.trim())
    .map((block) => {
      const lines = block.split('\n');
      const event = lines.find((l) => l.startsWith('event: '))?.slice(7) ?? 'message';
      const data = lines.filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
      return { event, data };
    });
}

/**
 * A real request of the documented operation `op` (`GET /v1/rollouts/{id}`) at `path`; its status
 * must be declared and its body must fit the declared schema of that status and media type.
 */
async function exercise(
  op: string,
  path: string,
  init: { body?: unknown; raw?: string; contentType?: string; headers?: Record<string, string>; token?: boolean } = {},
): Promise<{ status: number; text: string; json: unknown; contentType: string }> {
  const operation = declared.get(op);
  expect(operation, `${op} is not in the document`).toBeDefined();
  const [method] = op.split(' ');
  const headers: Record<string, string> = { ...(init.token === false ? {} : auth), ...init.headers };
  let payload: string | undefined;
  if (init.body !== undefined || init.raw !== undefined) {
    payload = init.raw ?? JSON.stringify(init.body);
    headers['content-type'] = init.contentType ?? 'application/json';
  }
  const response = await request(`${server.url}${path}`, { method: method as 'GET', headers, ...(payload === undefined ? {} : { body: payload }) });
  const bytes = Buffer.from(await response.body.arrayBuffer());
  const text = bytes.toString('utf8');
  const status = response.statusCode;
  const contentType = String(response.headers['content-type'] ?? '');
  if (!exercised.has(op)) exercised.set(op, new Set());
  exercised.get(op)!.add(status);

  const declaredResponse = operation!.responses[String(status)];
  expect(declaredResponse, `${op} (${path}) answered ${status}, which the document does not declare: ${text.slice(0, 300)}`).toBeDefined();
  let json: unknown;
  const content = declaredResponse!.content;
  if (!content) return { status, text, json, contentType };
  const mediaType = Object.keys(content).find((m) => m === essence(contentType));
  expect(mediaType, `${op} answered ${status} as ${contentType}; declared: ${Object.keys(content).join(', ')}`).toBeDefined();
  const schema = content[mediaType!]!.schema;
  if (mediaType === 'application/json') {
    json = JSON.parse(text);
    check(op, schema, json, `${status} body`);
  } else if (mediaType === 'application/x-ndjson') {
    const lines = text.split('\n').filter(Boolean);
    for (const line of lines) check(op, schema, JSON.parse(line), `${status} NDJSON line`);
    json = lines.map((l) => JSON.parse(l) as unknown);
  } else if (mediaType === 'text/event-stream') {
    check(op, schema, text, `${status} body`);
    // each data event is what the same route sends as an NDJSON line
    const lineSchema = content['application/x-ndjson']?.schema;
    const events = sseEvents(text);
    for (const event of events) if (lineSchema && event.event !== 'end') check(op, lineSchema, JSON.parse(event.data), `${status} SSE ${event.event} event`);
    json = events;
  } else if (mediaType === 'image/png') {
    expect(bytes.subarray(1, 4).toString('latin1')).toBe('PNG');
  } else {
    expect(text.length).toBeGreaterThan(0);
    check(op, schema, text, `${status} body`);
  }
  return { status, text, json, contentType };
}

beforeAll(async () => {
  fake = await startFakePolicy({
    script: (req) => {
      const question = String((req.messages[0] as { content: unknown }).content);
      if (question.startsWith('hang')) return { content: 'x', hang: true };
      const n = /(\d+)\+(\d+)/.exec(question);
      return n ? `\\boxed{${Number(n[1]) + Number(n[2])}}` : 'no idea';
    },
  });
  server = await startRolloutServer({ environments: [math, counterEnvironment], token: TOKEN, defaultModel: 'fake-policy', llmBackends: [fake.url] });
  // The zod schemas the document is generated from, by operation.
  const app = createRolloutApi(server.service, { token: TOKEN, backends: server.backends, defaultModel: 'fake-policy' });
  declared = new Map();
  for (const def of app.openAPIRegistry.definitions) {
    if (def.type !== 'route') continue;
    declared.set(`${def.route.method.toUpperCase()} ${def.route.path}`, def.route as never);
  }
}, 120_000);

afterAll(async () => {
  await server?.close();
  await fake?.close();
});

describe('the OpenAPI document against real responses', () => {
  it('is generated from the routes: the document and the declared routes are the same set', async () => {
    const doc = await exercise('GET /openapi.json', '/openapi.json', { token: false });
    expect(doc.status).toBe(200);
    const openapi = doc.json as { openapi: string; paths: Record<string, Record<string, unknown>> };
    expect(openapi.openapi).toBe('3.1.0');
    documentOps = Object.entries(openapi.paths).flatMap(([path, ops]) => Object.keys(ops).filter((k) => k !== 'parameters').map((m) => `${m.toUpperCase()} ${path}`));
    expect(documentOps.sort()).toEqual([...declared.keys()].sort());
    expect(documentOps.length).toBeGreaterThan(15);
    // a generated client's functions: every operation named once, tagged with a declared tag
    const document = doc.json as { servers?: Array<{ url: string }>; tags?: Array<{ name: string }>; paths: Record<string, Record<string, { operationId?: string; tags?: string[] }>> };
    const operations = Object.values(document.paths).flatMap((ops) => Object.values(ops));
    const names = operations.map((op) => op.operationId);
    expect(names.every((name) => typeof name === 'string' && /^[a-z][A-Za-z0-9]+$/.test(name)), JSON.stringify(names)).toBe(true);
    expect(new Set(names).size).toBe(names.length);
    const tags = new Set(document.tags?.map((t) => t.name));
    expect(operations.every((op) => op.tags?.length === 1 && tags.has(op.tags[0]!))).toBe(true);
    expect(document.paths['/v1/rollouts']!.post!.tags).toEqual(['Rollouts']);
    expect(document.paths['/v1/nodes/{node_id}/claim']!.post!.tags).toEqual(['Rollout nodes']);
    expect(document.paths['/process']!.post!.tags).toEqual(['ProRL Agent']);
    expect(document.paths['/run']!.post!.tags).toEqual(['NeMo Gym agent']);
    expect(document.servers).toEqual([{ url: './', description: expect.any(String) }]);
  });

  it('/health, /openapi.json and /docs answer without the token; every other route answers 401 without it', async () => {
    expect((await exercise('GET /health', '/health', { token: false })).json).toEqual({ status: 'ok' });
    for (const [op, operation] of declared) {
      if (Array.isArray(operation.security) && operation.security.length === 0) continue;
      const path = op.split(' ')[1]!.replace(/\{[^}]+\}/g, 'x');
      const denied = await exercise(op, path, { token: false, ...(op.startsWith('POST') ? { body: {} } : {}) });
      expect(denied.status, op).toBe(401);
      // the faces standing in for FastAPI servers answer as FastAPI's HTTPBearer does
      const fastApi = operation.tags?.some((tag) => tag === 'ProRL Agent' || tag === 'NeMo Gym agent');
      if (fastApi) expect(denied.json, op).toEqual({ detail: 'Not authenticated' });
      else expect(denied.json, op).toMatchObject({ error: { code: 'UNAUTHORIZED', retryable: false } });
    }
  });

  it('serves /docs as a page whose assets all answer 200, offline', async () => {
    const page = await exercise('GET /docs', '/docs', { token: false });
    expect(page.status).toBe(200);
    expect(page.text).toContain('<div id="swagger-ui">');
    const assets = [...page.text.matchAll(/(?:href|src)="([^"]+)"/g)].map((m) => m[1]!);
    expect(assets.length).toBeGreaterThanOrEqual(5);
    for (const asset of assets) {
      expect(asset, 'no CDN: every asset comes from the service').not.toMatch(/^(https?:)?\/\//);
      const url = new URL(asset, `${server.url}/docs`);
      const answer = await exercise('GET /docs/{asset}', url.pathname, { token: false });
      expect(answer.status, asset).toBe(200);
    }
    // with a trailing slash, as a browser's completion types it: sent to the page
    expect((await exercise('GET /docs/', '/docs/', { token: false })).status).toBe(308);
    const slash = await request(`${server.url}/docs/`);
    await slash.body.dump();
    expect(new URL(String(slash.headers.location), `${server.url}/docs/`).href).toBe(`${server.url}/docs`);
    const init = await request(`${server.url}/docs/init.js`);
    expect(await init.body.text()).toContain("'openapi.json'");
    expect((await exercise('GET /docs/{asset}', '/docs/nope.js', { token: false })).status).toBe(404);
  });

  it('LLM backends: add, list, refuse bad input, remove', async () => {
    expect((await exercise('POST /v1/llm-backends', '/v1/llm-backends', { body: { id: 'second', base_url: fake.url } })).status).toBe(201);
    expect((await exercise('POST /v1/llm-backends', '/v1/llm-backends', { body: { id: 'second', base_url: fake.url } })).status).toBe(409);
    expect((await exercise('POST /v1/llm-backends', '/v1/llm-backends', { body: { base_url: 'not a url' } })).status).toBe(422);
    expect((await exercise('POST /v1/llm-backends', '/v1/llm-backends', { raw: '{nope' })).status).toBe(400);
    const listed = await exercise('GET /v1/llm-backends', '/v1/llm-backends');
    expect((listed.json as { backends: Array<{ id: string; base_url: string }> }).backends.map((b) => b.id)).toContain('second');
    expect((await exercise('DELETE /v1/llm-backends/{id}', '/v1/llm-backends/second')).json).toEqual({ removed: 'second' });
    expect((await exercise('DELETE /v1/llm-backends/{id}', '/v1/llm-backends/second')).status).toBe(404);
  });

  it('weights: announce, read, pause, resume, and their errors', async () => {
    expect((await exercise('POST /v1/weights', '/v1/weights', { body: { version: 1 } })).json).toMatchObject({ newest: 1, default: 1, pause: null });
    expect((await exercise('POST /v1/weights', '/v1/weights', { body: { version: -1 } })).status).toBe(422);
    expect((await exercise('POST /v1/weights', '/v1/weights', { body: { version: 2, backends: ['nope'] } })).status).toBe(404);
    expect((await exercise('POST /v1/weights', '/v1/weights', { raw: '{nope' })).status).toBe(400);
    expect((await exercise('GET /v1/weights', '/v1/weights')).json).toMatchObject({ newest: 1, in_flight: 0 });
    expect((await exercise('POST /v1/weights/pause', '/v1/weights/pause', { body: { mode: 'sometimes' } })).status).toBe(422);
    expect((await exercise('POST /v1/weights/pause', '/v1/weights/pause', { raw: '{nope' })).status).toBe(400);
    expect((await exercise('POST /v1/weights/pause', '/v1/weights/pause', { body: { mode: 'finish' } })).json).toMatchObject({ mode: 'finish', in_flight: 0, state: { pause: { mode: 'finish' } } });
    expect((await exercise('POST /v1/weights/resume', '/v1/weights/resume', { body: { backends: ['x'] } })).status).toBe(422);
    expect((await exercise('POST /v1/weights/resume', '/v1/weights/resume', { raw: '[' })).status).toBe(400);
    expect((await exercise('POST /v1/weights/resume', '/v1/weights/resume', { body: {} })).json).toMatchObject({ newest: 1, pause: null });
  });

  it('rollouts: submit, stream, groups, list, get, training view, cancel, and their errors', async () => {
    const submitted = await exercise('POST /v1/rollouts', '/v1/rollouts', { body: { tasks: [task('o1', '1+1', '2', { n: 2 }), task('o2', '2+2', '5')] } });
    expect(submitted.status).toBe(202);
    expect(submitted.json).toMatchObject({ tasks: [{ task_id: 'o1', rollout_ids: ['o1:0', 'o1:1'] }, { task_id: 'o2' }], warnings: [] });
    expect((await exercise('POST /v1/rollouts', '/v1/rollouts', { body: { ...task('bad', '1+1', '2'), nn: 2 } })).status).toBe(422);
    expect((await exercise('POST /v1/rollouts', '/v1/rollouts', { raw: '{nope' })).status).toBe(400);
    expect((await exercise('POST /v1/rollouts', '/v1/rollouts', { raw: '{}', contentType: 'text/plain' })).status).toBe(400);
    expect((await exercise('POST /v1/rollouts', '/v1/rollouts', { body: { ...task('chess', '1+1', '2'), env: 'chess' } })).status).toBe(404);
    expect((await exercise('POST /v1/rollouts', '/v1/rollouts', { body: task('o2', '2+2', '6') })).status).toBe(409);

    const ndjson = await exercise('GET /v1/rollouts/stream', '/v1/rollouts/stream?ids=o1,o2');
    expect(ndjson.status).toBe(200);
    const results = ndjson.json as Array<{ id: string; task_id: string; sample_index: number; turns: Array<{ prompt_token_ids: unknown }> }>;
    expect(results.map((r) => r.id).sort()).toEqual(['o1:0', 'o1:1', 'o2']);
    expect(results.find((r) => r.id === 'o1:1')).toMatchObject({ task_id: 'o1', sample_index: 1 });
    const sse = await exercise('GET /v1/rollouts/stream', '/v1/rollouts/stream?ids=o2&format=sse');
    expect((sse.json as Array<{ event: string }>).map((e) => e.event)).toEqual(['result', 'end']);
    expect((await exercise('GET /v1/rollouts/stream', '/v1/rollouts/stream?ids=nope')).status).toBe(404);
    expect((await exercise('GET /v1/rollouts/stream', '/v1/rollouts/stream?format=xml')).status).toBe(400);

    const groups = await exercise('GET /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream?ids=o1,o2');
    expect((groups.json as Array<{ task_id: string }>).map((g) => g.task_id).sort()).toEqual(['o1', 'o2']);
    const groupsSse = await exercise('GET /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream?ids=o1', { headers: { accept: 'text/event-stream' } });
    expect((groupsSse.json as Array<{ event: string }>).map((e) => e.event)).toEqual(['group', 'end']);
    expect((await exercise('GET /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream?ids=nope')).status).toBe(404);
    expect((await exercise('GET /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream')).status).toBe(422);
    expect((await exercise('GET /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream?ids=o1&format=xml')).status).toBe(400);
    // the ids in a body: any number of them
    const posted = await exercise('POST /v1/rollouts/stream', '/v1/rollouts/stream', { body: { ids: ['o1', 'o2'] } });
    expect((posted.json as Array<{ id: string }>).map((r) => r.id).sort()).toEqual(['o1:0', 'o1:1', 'o2']);
    const postedSse = await exercise('POST /v1/rollouts/stream', '/v1/rollouts/stream', { body: { ids: ['o2'], format: 'sse', view: 'training' } });
    expect((postedSse.json as Array<{ event: string }>).map((e) => e.event)).toEqual(['result', 'end']);
    expect((await exercise('POST /v1/rollouts/stream', '/v1/rollouts/stream', { body: { ids: ['nope'] } })).status).toBe(404);
    expect((await exercise('POST /v1/rollouts/stream', '/v1/rollouts/stream', { body: { ids: [] } })).status).toBe(422);
    expect((await exercise('POST /v1/rollouts/stream', '/v1/rollouts/stream', { raw: '{nope' })).status).toBe(400);
    const postedGroups = await exercise('POST /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream', { body: { ids: ['o1', 'o2'], view: 'training' } });
    expect((postedGroups.json as Array<{ task_id: string }>).map((g) => g.task_id).sort()).toEqual(['o1', 'o2']);
    expect((await exercise('POST /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream', { body: { ids: ['nope'] } })).status).toBe(404);
    expect((await exercise('POST /v1/rollouts/groups/stream', '/v1/rollouts/groups/stream', { body: { ids: ['o1'], format: 'xml' } })).status).toBe(422);

    const page = await exercise('GET /v1/rollouts', '/v1/rollouts?limit=2&state=done');
    expect((page.json as { items: unknown[]; next_cursor: string | null }).items).toHaveLength(2);
    expect((await exercise('GET /v1/rollouts', '/v1/rollouts?task_id=o1')).json).toMatchObject({ items: [{ id: 'o1:0' }, { id: 'o1:1' }], next_cursor: null });
    expect((await exercise('GET /v1/rollouts', '/v1/rollouts?limit=0')).status).toBe(422);
    expect((await exercise('GET /v1/rollouts', '/v1/rollouts?cursor=@@')).status).toBe(400);

    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/o2')).json).toMatchObject({ id: 'o2', task_id: 'o2', state: 'done', result: { task_id: 'o2' } });
    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/o1')).json).toMatchObject({ task_id: 'o1', rollouts: [{ id: 'o1:0' }, { id: 'o1:1' }] });
    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/o2?view=training')).json).toMatchObject({ id: 'o2', task_id: 'o2', sample_index: 0 });
    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/o1?view=training')).json).toMatchObject({ task_id: 'o1', rollouts: [{ id: 'o1:0' }, { id: 'o1:1' }] });
    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/o2?view=nope')).status).toBe(400);
    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/missing')).status).toBe(404);

    await exercise('POST /v1/rollouts', '/v1/rollouts', { body: task('hang-o', 'hang 1+1', '2') });
    while ((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/hang-o')).text.includes('"state":"queued"')) await new Promise((r) => setTimeout(r, 10));
    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/hang-o?view=training')).status).toBe(409);
    const cancelled = await exercise('DELETE /v1/rollouts/{id}', '/v1/rollouts/hang-o');
    expect(cancelled.json).toMatchObject({ id: 'hang-o', state: 'cancelled', result: { critical_error: 'cancelled', filter: true } });
    expect((await exercise('DELETE /v1/rollouts/{id}', '/v1/rollouts/o1?wait=false')).json).toMatchObject({ task_id: 'o1', rollouts: [{ state: 'done' }, { state: 'done' }] });
    expect((await exercise('DELETE /v1/rollouts/{id}', '/v1/rollouts/missing')).status).toBe(404);
  }, 120_000);

  it('status and metrics', async () => {
    const status = await exercise('GET /v1/status', '/v1/status');
    expect(status.json).toMatchObject({ rollouts: { done: 3, cancelled: 1, in_flight: 0 }, environments: ['math', 'counter'], warnings: [] });
    const metrics = await exercise('GET /metrics', '/metrics');
    expect(metrics.text).toContain('rollserve_rollouts_finished_total');
  });

  it('dynamic sampling: submit with its options, its status, its stream, stop, and their errors', async () => {
    // every sample of a task scores the same here: each group is all-equal, the pool runs out
    const pool = { tasks: [task('ds-o1', '1+1', '2', { n: 2 }), task('ds-o2', '2+2', '5', { n: 2 })], dynamic_sampling: { id: 'ds-o', groups: 1 } };
    const submitted = await exercise('POST /v1/rollouts', '/v1/rollouts', { body: pool });
    expect(submitted.json).toMatchObject({ tasks: [{ task_id: 'ds-o1' }], sampling: { id: 'ds-o', state: 'running', tried: 1 } });
    expect((await exercise('POST /v1/rollouts', '/v1/rollouts', { body: { ...pool, dynamic_sampling: { groups: 3 } } })).status).toBe(422);
    const ndjson = await exercise('GET /v1/rollouts/sampling/{id}/stream', '/v1/rollouts/sampling/ds-o/stream?view=training&max_response_tokens=4');
    expect(ndjson.json).toMatchObject([{ sampling: { state: 'exhausted', tried: 2, kept: 0, dropped_all_equal: 2 } }]);
    const sse = await exercise('GET /v1/rollouts/sampling/{id}/stream', '/v1/rollouts/sampling/ds-o/stream?format=sse');
    expect(sse.json).toMatchObject([{ event: 'sampling' }, { event: 'end' }]);
    expect((await exercise('GET /v1/rollouts/sampling/{id}/stream', '/v1/rollouts/sampling/nope/stream')).status).toBe(404);
    expect((await exercise('GET /v1/rollouts/sampling/{id}/stream', '/v1/rollouts/sampling/ds-o/stream?format=xml')).status).toBe(400);
    expect((await exercise('GET /v1/rollouts/sampling/{id}/stream', '/v1/rollouts/sampling/ds-o/stream?max_response_tokens=-1')).status).toBe(422);
    expect((await exercise('GET /v1/rollouts/sampling/{id}', '/v1/rollouts/sampling/ds-o')).json).toMatchObject({ id: 'ds-o', state: 'exhausted' });
    expect((await exercise('GET /v1/rollouts/sampling/{id}', '/v1/rollouts/sampling/nope')).status).toBe(404);

    await exercise('POST /v1/rollouts', '/v1/rollouts', { body: { tasks: [task('ds-hang', 'hang 1+1', '2', { n: 2 })], dynamic_sampling: { id: 'ds-h', groups: 1 } } });
    const stopped = await exercise('DELETE /v1/rollouts/sampling/{id}', '/v1/rollouts/sampling/ds-h');
    expect(stopped.json).toMatchObject({ state: 'stopped', cancelled: 1 });
    expect((await exercise('DELETE /v1/rollouts/sampling/{id}', '/v1/rollouts/sampling/nope')).status).toBe(404);
  }, 120_000);

  it('the NeMo Gym agent and ProRL routes answer in their declared shapes', async () => {
    const row = { responses_create_params: { input: [{ role: 'user', content: '3+4' }] }, question: '3+4', expected_answer: '7', agent_ref: { name: 'math' } };
    for (const prefix of ['', '/ng-rollout/r1']) {
      const op = prefix ? '/ng-rollout/{rollout_id}' : '';
      const ran = await exercise(`POST ${op}/run`, `${prefix}/run`, { body: row });
      expect(ran.status, ran.text).toBe(200);
      expect(ran.json).toMatchObject({ reward: 1 });
      expect((await exercise(`POST ${op}/run`, `${prefix}/run`, { body: { nope: 1 } })).status).toBe(422);
      const metrics = await exercise(`POST ${op}/aggregate_metrics`, `${prefix}/aggregate_metrics`, { body: { verify_responses: [{ ...(ran.json as object), agent_ref: { name: 'math' }, _ng_task_index: 0, _ng_rollout_index: 0 }] } });
      expect(metrics.status, metrics.text).toBe(200);
      expect((await exercise(`POST ${op}/aggregate_metrics`, `${prefix}/aggregate_metrics`, { body: {} })).status).toBe(422);
    }
    // ProRL's routes: whatever they answer must be declared and fit (their semantics are tested with ProRL's shapes elsewhere).
    const prorl: Array<[string, unknown]> = [
      ['POST /start', undefined],
      ['GET /status', undefined],
      ['POST /process', { instance: { env: 'math', responses_create_params: { input: '20+22?' }, question: '20+22?', expected_answer: '42' }, job_id: 'pr1' }],
      ['POST /process', { instance: {} }],
      ['POST /cancel', { job_id: 'nope' }],
      ['cancel a running job', undefined],
      ['POST /add_llm_server', { address: fake.url }],
      ['POST /clear_llm_server', undefined],
      ['POST /stop', undefined],
      ['GET /status', undefined],
      ['POST /start', undefined],
    ];
    for (const [op, body] of prorl) {
      if (op === 'cancel a running job' && declared.has('POST /process') && declared.has('POST /cancel')) {
        const instance = { env: 'math', responses_create_params: { input: 'hang 1+1' }, question: 'hang 1+1', expected_answer: '2' };
        const processing = exercise('POST /process', '/process', { body: { instance, job_id: 'pr-hang' } });
        while ((await exercise('POST /cancel', '/cancel', { body: { job_id: 'pr-hang' } })).status !== 200) await new Promise((r) => setTimeout(r, 20));
        expect((await processing).status).toBe(200);
        continue;
      }
      if (!declared.has(op)) continue; // the coverage test below names any documented route left out
      await exercise(op, op.split(' ')[1]!, body === undefined ? {} : { body });
    }
  }, 120_000);

  it('rollout nodes: register, list, claim, heartbeat, model turn, commit, leave, and their errors', async () => {
    // (last but one: while a node takes work the service leaves its rollouts to nodes)
    const node = { node_id: 'oa-node', host: 'h', pid: 1, capacity: { init: 1, run: 1, eval: 1 }, max_rollouts: 1, environments: ['math', 'counter'] };
    const registered = await exercise('POST /v1/nodes', '/v1/nodes', { body: node });
    expect(registered.status).toBe(201);
    const headers = { 'x-rollserve-node-credential': (registered.json as { credential: string }).credential };
    expect((await exercise('POST /v1/nodes', '/v1/nodes', { body: { ...node, environments: ['math'] } })).status).toBe(422);
    // its id in use: not taken over without its credential (409), taken back with it
    expect((await exercise('POST /v1/nodes', '/v1/nodes', { body: node })).status).toBe(409);
    expect((await exercise('POST /v1/nodes', '/v1/nodes', { body: node, headers })).json).toMatchObject({ credential: headers['x-rollserve-node-credential'] });
    expect((await exercise('POST /v1/nodes/{node_id}/heartbeat', '/v1/nodes/oa-node/heartbeat', { body: { leases: [] } })).status).toBe(401);
    expect((await exercise('GET /v1/nodes', '/v1/nodes')).json).toMatchObject({ nodes: [{ node_id: 'oa-node', state: 'up' }] });
    // a node asking for work (a claim answered within the last seconds): the service leaves its rollouts to it
    expect((await exercise('POST /v1/nodes/{node_id}/claim', '/v1/nodes/oa-node/claim', { headers, body: { limit: 1, wait_ms: 0 } })).status).toBe(200);
    // (its own policy server: the ProRL test above cleared the service's backends)
    await exercise('POST /v1/rollouts', '/v1/rollouts', { body: task('on-node', '5+5', '10', { policy: { model: 'fake-policy', base_url: fake.url } }) });
    const claimed = await exercise('POST /v1/nodes/{node_id}/claim', '/v1/nodes/oa-node/claim', { headers, body: { limit: 1, wait_ms: 10_000 } });
    const [claim] = (claimed.json as { claims: Array<{ rollout_id: string; attempt: number }> }).claims;
    expect(claim).toMatchObject({ rollout_id: 'on-node' });
    expect((await exercise('POST /v1/nodes/{node_id}/claim', '/v1/nodes/oa-node/claim', { headers, body: { limit: 0 } })).status).toBe(422);
    const lease = { rollout_id: 'on-node', attempt: claim!.attempt };
    expect((await exercise('POST /v1/nodes/{node_id}/heartbeat', '/v1/nodes/oa-node/heartbeat', { headers, body: { leases: [{ ...lease, stage: 'run' }] } })).json).toEqual({ renewed: ['on-node'], lost: [], cancel: [] });
    expect((await exercise('POST /v1/nodes/{node_id}/heartbeat', '/v1/nodes/ghost/heartbeat', { headers, body: { leases: [] } })).status).toBe(404);
    const turn = await exercise('POST /v1/nodes/{node_id}/model', '/v1/nodes/oa-node/model', { headers, body: { ...lease, messages: [{ role: 'user', content: '5+5' }], tools: [] } });
    expect(turn.json).toMatchObject({ content: '\\boxed{10}', tool_calls: [] });
    expect((await exercise('POST /v1/nodes/{node_id}/model', '/v1/nodes/oa-node/model', { headers, body: { ...lease, attempt: lease.attempt + 1, messages: [], tools: [] } })).status).toBe(409);
    // a route is for a node that registered to call the backends itself (x-rollserve-node-features: direct-backends)
    expect((await exercise('POST /v1/nodes/{node_id}/route', '/v1/nodes/oa-node/route', { headers, body: lease })).status).toBe(409);
    const direct = { ...headers, 'x-rollserve-node-features': 'weights,direct-backends' };
    expect((await exercise('POST /v1/nodes', '/v1/nodes', { body: node, headers: direct })).json).toMatchObject({ features: ['direct-backends'], weights: { pause: null } });
    const route = await exercise('POST /v1/nodes/{node_id}/route', '/v1/nodes/oa-node/route', { headers: direct, body: lease });
    expect(route.json).toMatchObject({ ...lease, backend: { id: fake.url, base_url: fake.url }, headers: { 'x-rollout-id': 'on-node' } });
    expect((await exercise('POST /v1/nodes/{node_id}/route', '/v1/nodes/oa-node/route', { headers: direct, body: { rollout_id: 'on-node' } })).status).toBe(422);
    const stage = { queued_ms: 0, active_ms: 0 };
    const result = {
      id: 'on-node', task_id: 'on-node', sample_index: 0, env: 'math', state: 'done', reward: 1, reward_components: null, verify_extras: {}, critical_error: null, filter: false, error: null,
      advantage: null, credit: null, timing: { init: stage, run: stage, eval: stage, total_ms: 0 }, response: null, messages: [], turns: [], finished_at: new Date().toISOString(),
    };
    const commit = { results: [{ ...lease, result }] };
    expect((await exercise('POST /v1/nodes/{node_id}/results', '/v1/nodes/oa-node/results', { headers, body: commit })).json).toEqual({ results: [{ rollout_id: 'on-node', status: 'committed' }] });
    expect((await exercise('POST /v1/nodes/{node_id}/results', '/v1/nodes/oa-node/results', { headers, body: commit })).json).toEqual({ results: [{ rollout_id: 'on-node', status: 'duplicate' }] });
    expect((await exercise('POST /v1/nodes/{node_id}/results', '/v1/nodes/oa-node/results', { headers, raw: '{nope' })).status).toBe(400);
    expect((await exercise('GET /v1/rollouts/{id}', '/v1/rollouts/on-node')).json).toMatchObject({ state: 'done', result: { reward: 1 } });
    expect((await exercise('DELETE /v1/nodes/{node_id}', '/v1/nodes/oa-node', { headers })).json).toEqual({ released: 0 });
    expect((await exercise('DELETE /v1/nodes/{node_id}', '/v1/nodes/oa-node', { headers })).status).toBe(404);
  }, 60_000);

  it('generates a typed client whose operations are the named ones (openapi-typescript)', async () => {
    const served = (await (await request(`${server.url}/openapi.json`)).body.json()) as { paths: Record<string, Record<string, { operationId: string }>> };
    const generated = astToString(await openapiTS(served as never));
    const operations = generated.slice(generated.indexOf('export interface operations {'));
    const named = [...operations.matchAll(/^ {4}(\w+): \{$/gm)].map((m) => m[1]);
    const ids = Object.values(served.paths).flatMap((ops) => Object.values(ops).map((op) => op.operationId));
    expect(named.sort()).toEqual([...ids].sort());
    // a path's operation refers to its named type: `post: operations["submitRollouts"]`
    expect(generated).toMatch(/"\/v1\/rollouts\/stream": \{[^]*?get: operations\["streamResults"\];[^]*?post: operations\["streamResultsOf"\];/);
  });

  it('every operation of the document was exercised with a real request', () => {
    // (the 401 sweep above reaches every route: it does not count)
    const missing = documentOps.filter((op) => ![...(exercised.get(op) ?? [])].some((s) => s !== 401));
    expect(missing, 'documented routes without a real request in this file').toEqual([]);
    // its declared success: a 2xx, for GET /docs/ its redirect
    const success = (op: string, s: number) => (op === 'GET /docs/' ? s === 308 : s >= 200 && s < 300);
    const noSuccess = documentOps.filter((op) => ![...exercised.get(op)!].some((s) => success(op, s)));
    expect(noSuccess, 'documented routes never answered 2xx here').toEqual([]);
  });
});
