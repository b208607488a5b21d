import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { defineEnvironment } from '@rollserve/core';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { call } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { post } from '../gym/post-body.ts';
import { BodyTooLargeError, readNodeBody } from '../../packages/core/src/server/read-body.ts';

// Every face of the rollout service caps request bodies: its own API (/v1, the node routes),
// ProRL's (/process) and the NeMo Gym agent's (/run) answer 413 in their own error shape, before
// the body is read whole, with a Content-Length or without.

const CAP = 1024 * 1024;
const TOKEN = 'body-limit-token';
const auth = { authorization: `Bearer ${TOKEN}` };

const echo = defineEnvironment({ name: 'echo', domain: 'other', row: z.object({}).passthrough(), verify: () => ({ reward: 1 }) });

let server: RolloutServer;
beforeAll(async () => {
  server = await startRolloutServer({ environments: [echo], store: 'sqlite::memory:', token: TOKEN, maxBodyBytes: CAP, runLocally: 'never' });
});
afterAll(async () => {
  await server?.close();
});

const rolloutShape = { error: { code: 'PAYLOAD_TOO_LARGE', retryable: false } };
const fastApiShape = (cap: number) => ({ detail: `Request Entity Too Large: the body may be at most ${cap} bytes` });

const ROUTES: Array<[path: string, shape: 'rollout' | 'fastapi']> = [
  ['/v1/rollouts', 'rollout'],
  ['/v1/llm-backends', 'rollout'],
  ['/v1/nodes', 'rollout'],
  ['/v1/nodes/n1/heartbeat', 'rollout'],
  ['/v1/nodes/n1/claim', 'rollout'],
  ['/v1/nodes/n1/model', 'rollout'],
  ['/process', 'fastapi'],
  ['/cancel', 'fastapi'],
  ['/add_llm_server', 'fastapi'],
  ['/run', 'fastapi'],
  ['/aggregate_metrics', 'fastapi'],
  ['/ng-rollout/r1/run', 'fastapi'],
  // routes that read no body: the body is capped all the same
  ['/v1/rollouts/some-id', 'rollout'],
  ['/nope', 'rollout'],
];

describe('the rollout service caps request bodies', () => {
  it('answers 413 in each face\'s shape for a declared length above the cap, before the body comes', async () => {
    for (const [path, shape] of ROUTES) {
      const sent = await post(server.url, path, { total: 64 * 1024, declared: 1024 ** 3, hold: true, headers: auth });
      expect(sent.status, path).toBe(413);
      const body = JSON.parse(sent.body) as unknown;
      if (shape === 'rollout') expect(body, path).toMatchObject(rolloutShape);
      else expect(body, path).toEqual(fastApiShape(CAP));
    }
  });

  it('cuts a chunked body at the cap, before it ends', async () => {
    for (const [path, shape] of ROUTES) {
      const sent = await post(server.url, path, { total: 1024 ** 3, hold: true, headers: auth });
      expect(sent.status, path).toBe(413);
      expect(sent.writtenAtAnswer, path).toBeLessThan(1024 ** 3);
      if (shape === 'rollout') expect(JSON.parse(sent.body), path).toMatchObject(rolloutShape);
      else expect(JSON.parse(sent.body), path).toEqual(fastApiShape(CAP));
    }
  });

  it('takes 4 times the cap for a node\'s results, and no more', async () => {
    // under 4 MiB: read whole, then refused for what it says (not JSON), not for its size
    const under = await post(server.url, '/v1/nodes/n1/results', { total: 3 * CAP, headers: auth });
    expect(under.status).toBe(400);
    for (const declared of [undefined, 4 * CAP + 1]) {
      const over = await post(server.url, '/v1/nodes/n1/results', { total: 1024 ** 3, ...(declared ? { declared } : {}), hold: true, headers: auth });
      expect(over.status).toBe(413);
      expect(JSON.parse(over.body)).toMatchObject({ error: { code: 'PAYLOAD_TOO_LARGE', details: { max_bytes: 4 * CAP } } });
    }
  });

  it('refuses an unauthenticated request before reading its body', async () => {
    const sent = await post(server.url, '/v1/rollouts', { total: 64 * 1024, declared: 1024 ** 3, hold: true });
    expect(sent.status).toBe(401);
  });

  it('reads a large body under the cap as before: a task is accepted, bad JSON is a 400', async () => {
    const task = { id: 'big', env: 'echo', row: { responses_create_params: { input: 'x' }, blob: 'z'.repeat(CAP - 4096) }, policy: { model: 'm' } };
    const accepted = await call(server.url, 'POST', '/v1/rollouts', task, auth);
    expect(accepted.status).toBe(202);
    const broken = await post(server.url, '/v1/rollouts', { total: CAP - 1024, headers: auth });
    expect(broken.status).toBe(400);
    expect(JSON.parse(broken.body)).toMatchObject({ error: { code: 'BAD_REQUEST' } });
    // a FastAPI face reads it as FastAPI would: 422 json_invalid
    const run = await post(server.url, '/run', { total: CAP - 1024, headers: auth });
    expect(run.status).toBe(422);
    expect(JSON.parse(run.body)).toMatchObject({ detail: [{ type: 'json_invalid' }] });
  });

  it('answers /health while bodies flood in', async () => {
    const floods = [0, 1, 2, 3].map(() => post(server.url, '/v1/rollouts', { total: 1024 ** 3, hold: true, keepSending: true, headers: auth }));
    expect((await call(server.url, 'GET', '/health')).status).toBe(200);
    for (const sent of await Promise.all(floods)) {
      expect(sent.status).toBe(413);
      expect(sent.cut).toBe(true);
    }
    expect((await call(server.url, 'GET', '/health')).status).toBe(200);
  });
});

describe('a refused body', () => {
  it('leaves the client the whole linger after the 413, however late the answer comes: not cut before it', async () => {
    // a server slower to answer than the linger (a loaded host): the 413 comes 2.5 s after the refusal
    const server = createServer((request, response) => {
      readNodeBody(request, 1024).catch(async (error: unknown) => {
        const refused = error instanceof BodyTooLargeError;
        await new Promise((resolve) => setTimeout(resolve, 2_500));
        const body = refused ? 'too large' : String(error);
        response.writeHead(refused ? 413 : 500, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body), connection: 'close' });
        response.end(body);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = server.address() as AddressInfo;
      // a client that keeps writing (a flood, or curl with a large file) until it has an answer
      const sent = await post(`http://127.0.0.1:${port}`, '/', { total: 1024 ** 3, declared: 2 * 1024 ** 3, hold: true });
      expect(sent).toMatchObject({ status: 413, body: 'too large' });
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
