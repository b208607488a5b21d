import { Agent, request as httpRequest, type IncomingHttpHeaders } from 'node:http';
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
/** The same app served without its fast path: every request through Hono, as before it. */
let honoOnly: RunningServer;
/** Requests the fast path took (answered or handed to the app). */
let taken = 0;

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
  server = await serveFetch({
    fetch: app.fetch,
    fastPath: (incoming, outgoing, fallback) => {
      const took = app.fastPath(incoming, outgoing, fallback);
      if (took) taken++;
      return took;
    },
  });
  honoOnly = await serveFetch({ fetch: app.fetch });
});
afterAll(async () => {
  await server.close();
  await honoOnly.close();
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

  describe('fast path', () => {
    interface Raw {
      status: number;
      headers: string[];
      body: string;
      reusedSocket: boolean;
    }
    /** One request on node:http, the answer as it came: status, raw headers in order, body. */
    const raw = (url: string, path: string, options: { method?: string; headers?: Record<string, string>; body?: string | Buffer; agent?: Agent } = {}) =>
      new Promise<Raw>((resolve, reject) => {
        const req = httpRequest(new URL(path, url), { method: options.method ?? 'POST', headers: options.headers, agent: options.agent ?? false }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => (body += chunk));
          res.on('end', () => resolve({ status: res.statusCode!, headers: res.rawHeaders, body, reusedSocket: req.reusedSocket }));
        });
        req.on('error', reject);
        req.end(options.body);
      });
    /** The raw headers with the Date and a new session's cookie id made comparable. */
    const comparable = (answer: Raw) => ({
      ...answer,
      reusedSocket: undefined,
      headers: answer.headers.map((value, i) =>
        answer.headers[i - 1]?.toLowerCase() === 'date' ? '<date>' : value.replace(/=[0-9a-f-]{36}\.[0-9a-f]{32};/, '=<new session>;'),
      ),
    });
    const cookieOf = (headers: string[] | IncomingHttpHeaders) => {
      const list = Array.isArray(headers) ? headers : [];
      const at = list.findIndex((h) => h.toLowerCase() === 'set-cookie');
      return list[at + 1]!.split(';')[0]!;
    };

    it('answers every kind of tool call as the app alone does', async () => {
      const seeded = await raw(server.url, '/seed_session', { headers: { 'content-type': 'application/json' }, body: '{}' });
      const cookie = cookieOf(seeded.headers);
      const json = { 'content-type': 'application/json' };
      const cases: Array<[string, { method?: string; headers?: Record<string, string>; body?: string | Buffer }]> = [
        ['/text', { headers: { ...json, cookie }, body: '{}' }],
        ['/slow', { headers: { ...json, cookie }, body: '{"ms":1}' }],
        ['/own', { headers: { ...json, cookie }, body: '{"tag":"fast"}' }],
        ['/ng-rollout/7-1/text', { headers: { ...json, cookie }, body: '{}' }],
        ['/text?x=1', { headers: { ...json, cookie }, body: '{}' }],
        ['/text', { headers: json, body: '{}' }],
        ['/text', { headers: { ...json, cookie: `${cookie}x` }, body: '{}' }],
        ['/text', { headers: { ...json, cookie }, body: '' }],
        ['/text', { headers: { cookie }, body: '{}' }],
        ['/text', { headers: { 'content-type': 'text/plain', cookie }, body: '{}' }],
        ['/own', { headers: { ...json, cookie }, body: '{"tag":5}' }],
        ['/own', { headers: { ...json, cookie }, body: '{"tag":' }],
        ['/own', { headers: { ...json, cookie }, body: 'null' }],
        ['/own', { headers: { ...json, cookie }, body: Buffer.from([0xff]) }],
        ['/slow', { headers: { ...json, cookie }, body: '{"ms":5000}' }],
        ['/boom', { headers: { ...json, cookie }, body: '{}' }],
        ['/text', { method: 'GET', headers: { cookie } }],
        ['/text', { headers: { ...json, cookie, host: 'LOCALHOST' }, body: '{}' }],
        ['/text', { headers: { ...json, cookie, 'transfer-encoding': 'chunked' }, body: '{}' }],
      ];
      for (const [i, [path, options]] of cases.entries()) {
        const before = taken;
        const fast = await raw(server.url, path, options);
        // the plain calls (the first four: 200s) and those it hands to the app (422, 400, 504, 500) are its own
        if (i < 4 || (i >= 5 && i < 9) || (i >= 10 && i < 16)) expect(taken, path).toBe(before + 1);
        const hono = await raw(honoOnly.url, path, options);
        expect(comparable(fast), `${options.method ?? 'POST'} ${path} ${JSON.stringify(options)}`).toEqual(comparable(hono));
      }
      closed.splice(0);
    });

    it('keeps the connection of a call it handed to the app', async () => {
      const agent = new Agent({ keepAlive: true, maxSockets: 1 });
      try {
        const refused = await raw(server.url, '/own', { headers: { 'content-type': 'application/json' }, body: '{"tag":5}', agent });
        expect(refused.status).toBe(422);
        // @hono/node-server would cut a connection whose body it still waits for 500 ms after the answer
        await new Promise((resolve) => setTimeout(resolve, 700));
        const next = await raw(server.url, '/text', { headers: { 'content-type': 'application/json' }, body: '{}', agent });
        expect(next).toMatchObject({ status: 200, body: 'plain output', reusedSocket: true });
      } finally {
        agent.destroy();
      }
    });
  });
});
