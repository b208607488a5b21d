import { defineEnvironment } from '@rollserve/core';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { call, startFakePolicy, type FakePolicy } from '@rollserve/testing';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';

// The result streams as a trainer meets them: opened before anything is submitted, left idle
// behind a proxy's idle time-out, asked for thousands of ids at once.

let fake: FakePolicy;
let server: RolloutServer;
/** The default keep-alive or longer: its streams' headers can not ride on a keep-alive. */
let quiet: RolloutServer;
const TOKEN = 'stream-token';
const auth = { authorization: `Bearer ${TOKEN}` };
// short, so that the test sees a keep-alive without waiting the 15 s default
const KEEP_ALIVE_MS = 100;

/** Reward 1 when the policy's output contains `expected`; no tools, no sandbox. */
const echo = defineEnvironment({
  name: 'echo',
  domain: 'other',
  row: z.object({ expected: z.string() }),
  verify: (row, response) => ({ reward: JSON.stringify(response.output).includes(row.expected) ? 1 : 0 }),
});

const task = (id: string, extra: Record<string, unknown> = {}) => ({
  id,
  env: 'echo',
  row: { responses_create_params: { input: `say ${id}` }, expected: id },
  policy: { model: 'fake-policy' },
  ...extra,
});

beforeAll(async () => {
  fake = await startFakePolicy({ script: (req) => `ok ${String((req.messages.at(-1) as { content: unknown }).content).slice(4)}` });
  server = await startRolloutServer({ environments: [echo], token: TOKEN, llmBackends: [fake.url], defaultModel: 'fake-policy', streamKeepAliveMs: KEEP_ALIVE_MS });
  quiet = await startRolloutServer({ environments: [echo], token: TOKEN, llmBackends: [fake.url], defaultModel: 'fake-policy', streamKeepAliveMs: 3_600_000 });
});
afterAll(async () => {
  await quiet?.close();
  await server?.close();
  await fake?.close();
});

/** Reads `body` until `done(text so far)`; answers the text read. */
async function readUntil(body: AsyncIterable<Buffer>, done: (text: string) => boolean): Promise<string> {
  let text = '';
  for await (const chunk of body) {
    text += chunk.toString('utf8');
    if (done(text)) break;
  }
  return text;
}

describe('the result stream', () => {
  it('answers an idle stream at once: a client opens it, then submits, then reads its result', async () => {
    const controller = new AbortController();
    // resolves with the headers: before the fix, not until the first result (so never, here)
    const stream = await request(`${quiet.url}/v1/rollouts/stream`, { headers: auth, signal: controller.signal });
    expect(stream.statusCode).toBe(200);
    expect(stream.headers['content-type']).toBe('application/x-ndjson');
    const submit = await call(quiet.url, 'POST', '/v1/rollouts', task('opened-first'), auth);
    expect(submit.status).toBe(202);
    const text = await readUntil(stream.body, (t) => t.includes('"opened-first"'));
    controller.abort();
    const line = text.split('\n').find((l) => l.includes('"opened-first"'))!;
    expect(JSON.parse(line)).toMatchObject({ id: 'opened-first', reward: 1 });

    const again = new AbortController();
    const events = await request(`${quiet.url}/v1/rollouts/stream?format=sse`, { headers: auth, signal: again.signal });
    expect(events.statusCode).toBe(200);
    expect(events.headers['content-type']).toBe('text/event-stream');
    expect(events.headers['cache-control']).toBe('no-cache');
    again.abort();
    await events.body.dump().catch(() => undefined);
  });

  it('keeps an idle stream alive: an empty line in NDJSON, a comment in SSE, which readers skip', async () => {
    const controller = new AbortController();
    const ndjson = await request(`${server.url}/v1/rollouts/stream`, { headers: auth, signal: controller.signal });
    const blank = await readUntil(ndjson.body, (t) => t.includes('\n\n') || t.startsWith('\n'));
    expect(blank.split('\n').filter((l) => l.trim() !== '').every((l) => JSON.parse(l))).toBeTruthy();
    const sse = await request(`${server.url}/v1/rollouts/stream?format=sse`, { headers: auth, signal: controller.signal });
    expect(await readUntil(sse.body, (t) => t.includes(': keep-alive\n\n'))).toContain(': keep-alive\n\n');
    controller.abort();
  });

  it('takes any number of ids in a POST body (1,500 in a query string are an HTTP 431)', { timeout: 300_000 }, async () => {
    const ids = Array.from({ length: 1_500 }, (_, i) => `long-id-list-${String(i).padStart(4, '0')}-${'x'.repeat(16)}`);
    const submit = await call(server.url, 'POST', '/v1/rollouts', { tasks: ids.map((id) => task(id)) }, auth);
    expect(submit.status).toBe(202);
    // the way that fails: Node refuses headers over 16 KiB
    const query = await request(`${server.url}/v1/rollouts/stream?ids=${ids.join(',')}`, { headers: auth });
    expect(query.statusCode).toBe(431);
    await query.body.dump();

    const stream = await request(`${server.url}/v1/rollouts/stream`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ ids }),
    });
    expect(stream.statusCode).toBe(200);
    const results = (await stream.body.text())
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as { id: string; reward: number });
    expect(results.map((r) => r.id).sort()).toEqual([...ids].sort());
    expect(results.every((r) => r.reward === 1)).toBe(true);

    // whole groups the same way, as SSE; task ids are rollout ids for n = 1
    const groups = await request(`${server.url}/v1/rollouts/groups/stream`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ ids, format: 'sse' }),
    });
    expect(groups.statusCode).toBe(200);
    const text = await groups.body.text();
    expect(text.match(/^event: group$/gm)).toHaveLength(1_500);
    expect(text.endsWith('event: end\ndata: {}\n\n')).toBe(true);
  });

  it('refuses a POST without ids, or naming an unknown one, as the GET does', async () => {
    expect((await call(server.url, 'POST', '/v1/rollouts/stream', { ids: [] }, auth)).status).toBe(422);
    expect((await call(server.url, 'POST', '/v1/rollouts/stream', { ids: ['no-such-rollout'] }, auth)).status).toBe(404);
    expect((await call(server.url, 'POST', '/v1/rollouts/stream', { ids: ['x'], idz: 1 }, auth)).status).toBe(422);
    expect((await call(server.url, 'POST', '/v1/rollouts/groups/stream', { ids: ['no-such-task'] }, auth)).status).toBe(404);
    expect((await call(server.url, 'POST', '/v1/rollouts/stream', { ids: ['x'] })).status).toBe(401);
  });
});
