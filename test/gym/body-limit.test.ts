import { defineEnvironment, defineTool } from '@rollserve/core';
import { startResourcesServer, type LaunchedServer } from '@rollserve/core/gym';
import math from '@rollserve/env-math';
import { call, makeResponse } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { post } from './post-body.ts';

// Request bodies on a NeMo Gym face are capped: a larger one is FastAPI's 413 `{"detail": ...}`,
// answered before the body is read whole (a declared length at once, a chunked one at the cap),
// and the server answers other requests meanwhile.

const CAP = 1024 * 1024;

const echo = defineEnvironment({
  name: 'echo',
  domain: 'other',
  row: z.object({}).passthrough(),
  tools: { echo: defineTool({ description: 'echoes', parameters: z.object({ text: z.string() }), handler: ({ text }) => ({ length: text.length }) }) },
  verify: () => ({ reward: 1 }),
});

let small: LaunchedServer;
let mathServer: LaunchedServer;
beforeAll(async () => {
  small = await startResourcesServer(echo, { maxBodyBytes: CAP });
  mathServer = await startResourcesServer(math);
});
afterAll(async () => {
  await small?.close();
  await mathServer?.close();
});

const tooLarge = (cap: number) => ({ detail: `Request Entity Too Large: the body may be at most ${cap} bytes` });

describe('a resources server caps request bodies', () => {
  it('refuses a declared Content-Length above the cap before the body is sent, on every route', async () => {
    // routes that read no body too (a 404, the liveness probe's path): nothing reads a declared flood
    for (const path of ['/verify', '/seed_session', '/aggregate_metrics', '/echo', '/ng-rollout/r1/verify', '/nope', '/']) {
      // 64 KiB sent of a declared 1 GiB, then held: the answer cannot wait for the body
      const sent = await post(small.running.url, path, { total: 64 * 1024, declared: 1024 ** 3, hold: true });
      expect(sent.status, path).toBe(413);
      expect(JSON.parse(sent.body), path).toEqual(tooLarge(CAP));
    }
  });

  it('cuts a chunked body at the cap, before it ends', async () => {
    for (const path of ['/verify', '/echo']) {
      const sent = await post(small.running.url, path, { total: 1024 ** 3, hold: true });
      expect(sent.status, path).toBe(413);
      expect(JSON.parse(sent.body)).toEqual(tooLarge(CAP));
      expect(sent.writtenAtAnswer).toBeLessThan(1024 ** 3);
    }
  });

  it('drops the connection of a client that keeps sending after the 413', async () => {
    const total = 1024 ** 3;
    for (const declared of [undefined, total]) {
      const sent = await post(small.running.url, '/verify', { total, ...(declared === undefined ? {} : { declared }), hold: true, keepSending: true });
      expect(sent.status).toBe(413);
      expect(sent.cut).toBe(true);
      expect(sent.written).toBeLessThan(total);
    }
    expect((await call(small.running.url, 'GET', '/')).json).toEqual({ status: 'ok' });
  });

  it('reads bodies up to the cap as before', async () => {
    const text = 'b'.repeat(CAP - 100);
    expect(await call(small.running.url, 'POST', '/echo', { text })).toMatchObject({ status: 200, json: { length: text.length } });
    // one byte past it, whole and declared: refused
    const over = await call(small.running.url, 'POST', '/echo', { text: 'b'.repeat(CAP) });
    expect(over).toMatchObject({ status: 413, json: tooLarge(CAP) });
  });

  it('has a 64 MiB cap by default, and answers others while 50 MB bodies arrive', async () => {
    const body = { responses_create_params: { input: '1+1?' }, response: makeResponse([]), question: '1+1?', expected_answer: '2' };
    const floods = Promise.all([0, 1, 2].map(() => post(mathServer.running.url, '/verify', { total: 50_000_000 })));
    const during = await call(mathServer.running.url, 'POST', '/verify', body);
    expect(during.status).toBe(200);
    expect((await call(mathServer.running.url, 'GET', '/')).json).toEqual({ status: 'ok' });
    // 50 MB of invalid JSON is under the cap: read and refused as FastAPI refuses it
    for (const sent of await floods) expect(sent.status).toBe(422);
    const over = await post(mathServer.running.url, '/verify', { total: 64 * 1024, declared: 64 * 1024 * 1024 + 1, hold: true });
    expect(over.status).toBe(413);
    expect(JSON.parse(over.body)).toEqual(tooLarge(64 * 1024 * 1024));
  });
});
