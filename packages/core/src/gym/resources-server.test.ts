import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineEnvironment } from '../spec/environment.ts';
import { defineTool } from '../spec/tool.ts';
import { createResourcesServer, stripRolloutPrefix, type ResourcesServer } from './resources-server.ts';
import { serveFetch, type RunningServer } from '../server/serve.ts';

const closed: string[] = [];
let hangStarted: () => void = () => undefined;
let hangAborted: (reason: unknown) => void = () => undefined;
const env = defineEnvironment({
  name: 'probe',
  domain: 'other',
  row: z.object({ expected: z.string() }),
  tools: {
    slow: defineTool({
      description: 'waits',
      parameters: z.object({ ms: z.number() }),
      timeoutMs: 200,
      handler: ({ ms }, ctx) =>
        new Promise((resolve) => {
          const timer = setTimeout(() => resolve({ waited: ms }), ms);
          ctx.signal.addEventListener('abort', () => clearTimeout(timer));
        }),
    }),
    hang: defineTool({
      description: 'waits until its signal aborts',
      parameters: z.object({}),
      handler: (_args, ctx) =>
        new Promise((resolve) => {
          hangStarted();
          ctx.signal.addEventListener('abort', () => {
            hangAborted(ctx.signal.reason);
            resolve('aborted');
          });
        }),
    }),
    text: defineTool({ description: 'plain text', parameters: z.object({}), handler: () => 'plain output' }),
    boom: defineTool({ description: 'throws', parameters: z.object({}), handler: () => { throw new RangeError('bad range'); } }),
    own: defineTool({
      description: 'registers a resource on the session',
      parameters: z.object({ tag: z.string() }),
      handler: ({ tag }, ctx) => {
        ctx.session.onClose(() => void closed.push(tag));
        return { ok: true };
      },
    }),
  },
  verify(row, response) {
    const text = JSON.stringify(response.output);
    if (text.includes('THROW')) throw new TypeError('verifier bug');
    return { reward: text.includes(row.expected) ? 1 : 0, seen: response.output.length };
  },
});

let app: ResourcesServer;
let server: RunningServer;

async function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  const response = await fetch(new URL(path, server.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: response.status, text: await response.text(), cookies: response.headers.getSetCookie() };
}

beforeAll(async () => {
  app = createResourcesServer(env);
  server = await serveFetch(app);
});
afterAll(async () => {
  await server.close();
  await app.close();
});

describe('resources server', () => {
  it('strips only valid rollout prefixes', () => {
    expect(stripRolloutPrefix('/ng-rollout/3-0/verify')).toEqual({ path: '/verify', rolloutId: '3-0' });
    expect(stripRolloutPrefix('/ng-rollout/-x/verify')).toEqual({ path: '/ng-rollout/-x/verify' });
    expect(stripRolloutPrefix('/verify')).toEqual({ path: '/verify' });
  });

  it('maps zod failures to pydantic error items with body locations', async () => {
    const response = await post('/verify', { responses_create_params: { input: 5 }, response: { output: 'no' }, expected: 3 });
    expect(response.status).toBe(422);
    const { detail } = JSON.parse(response.text) as { detail: Array<{ type: string; loc: unknown[]; msg: string }> };
    expect(detail).toContainEqual(expect.objectContaining({ loc: ['body', 'response', 'output'], type: 'list_type', msg: 'Input should be a valid list' }));
    expect(detail).toContainEqual(expect.objectContaining({ loc: ['body', 'expected'], type: 'string_type' }));
    expect(detail.some((d) => d.loc.join('.') === 'body.responses_create_params.input')).toBe(true);
  });

  it('rejects a body that is not an object with model_attributes_type', async () => {
    const response = await post('/verify', '[1,2]');
    expect(response.status).toBe(422);
    expect(JSON.parse(response.text).detail[0]).toMatchObject({ type: 'model_attributes_type', loc: ['body'] });
    const empty = await post('/verify', '');
    expect(JSON.parse(empty.text).detail[0]).toMatchObject({ type: 'missing', loc: ['body'] });
  });

  it('turns a verifier bug into a 500 with a repr body, and the server stays up', async () => {
    const body = { responses_create_params: { input: 'x' }, response: { output: [{ type: 'message', content: 'THROW' }] }, expected: 'a' };
    const response = await post('/verify', body);
    expect(response.status).toBe(500);
    expect(JSON.parse(response.text)).toBe("TypeError('verifier bug')");
    expect(response.cookies.length).toBe(1);
    const ok = await post('/verify', { ...body, response: { output: [{ type: 'message', content: 'a' }] } });
    expect(JSON.parse(ok.text)).toMatchObject({ reward: 1, seen: 1 });
  });

  it('limits tool time and reports it to the model; text outputs stay text', async () => {
    const slow = await post('/slow', { ms: 5_000 });
    expect(slow.status).toBe(504);
    expect(JSON.parse(slow.text).detail).toMatch(/timed out after 200 ms/);
    expect((await post('/slow', { ms: 1 })).text).toBe('{"waited":1}');
    expect((await post('/text', {})).text).toBe('plain output');
    const boom = await post('/boom', {});
    expect(boom.status).toBe(500);
    expect(JSON.parse(boom.text)).toBe("RangeError('bad range')");
  });

  it("aborts a tool's signal when its client goes away, and answers the next call", async () => {
    const started = new Promise<void>((resolve) => (hangStarted = resolve));
    const aborted = new Promise<unknown>((resolve) => (hangAborted = resolve));
    const client = new AbortController();
    const call = fetch(new URL('/hang', server.url), { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}', signal: client.signal });
    await started;
    client.abort();
    await expect(call).rejects.toThrow();
    expect(String(await aborted)).toMatch(/prematurely closed/);
    expect((await post('/text', {})).text).toBe('plain output');
  });

  it('frees the session and its resources after verify', async () => {
    const tool = await post('/own', { tag: 'kernel-1' });
    const cookie = tool.cookies[0]!.split(';')[0]!;
    expect(app.sessions.size).toBeGreaterThan(0);
    const before = app.sessions.size;
    await post('/verify', { responses_create_params: { input: 'x' }, response: { output: [] }, expected: 'a' }, { cookie });
    expect(closed).toEqual(['kernel-1']);
    expect(app.sessions.size).toBe(before - 1);
  });

  it('takes a 50 MB body and stays up', async () => {
    const big = 'y'.repeat(50 * 1024 * 1024);
    const response = await post('/verify', { responses_create_params: { input: big }, response: { output: [] }, expected: 'zz' });
    expect(response.status).toBe(200);
    expect(JSON.parse(response.text).reward).toBe(0);
    expect((await fetch(server.url)).status).toBe(200);
  });

  it('reaps idle sessions', async () => {
    const store = app.sessions;
    const session = store.get('idle-one');
    session.onClose(() => void closed.push('reaped'));
    expect(await store.reap(Date.now() + 2 * 3_600_000)).toBeGreaterThan(0);
    expect(closed).toContain('reaped');
  });
});
