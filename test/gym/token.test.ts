import { startResourcesServer, type LaunchedServer } from '@rollserve/core/gym';
import math from '@rollserve/env-math';
import { call, makeResponse } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const TOKEN = 'env-token-123';
let server: LaunchedServer;
let url: string;

beforeAll(async () => {
  server = await startResourcesServer(math, { token: TOKEN });
  url = server.running.url;
});
afterAll(async () => {
  await server?.close();
});

describe('a resources server with a token', () => {
  const body = { responses_create_params: { input: '1+1?' }, response: makeResponse([]), question: '1+1?', expected_answer: '2' };

  it('keeps GET / open as the liveness probe', async () => {
    expect(await call(url, 'GET', '/')).toMatchObject({ status: 200, json: { status: 'ok' } });
  });

  it('answers 401 in FastAPI\'s shape without the right Bearer header, on every other route', async () => {
    for (const [method, path] of [['POST', '/verify'], ['POST', '/seed_session'], ['POST', '/aggregate_metrics'], ['POST', '/execute_python'], ['GET', '/reverify_mode'], ['POST', '/nope']] as const) {
      const missing = await call(url, method, path, method === 'POST' ? body : undefined);
      expect(missing, path).toMatchObject({ status: 401, json: { detail: 'Not authenticated' } });
      expect(missing.headers['www-authenticate']).toBeDefined();
    }
    for (const authorization of ['Bearer wrong', 'Bearer', 'Basic abc', `Bearer ${TOKEN} extra`]) {
      expect(await call(url, 'POST', '/verify', body, { authorization }), authorization).toMatchObject({
        status: 401,
        json: { detail: 'Invalid authentication credentials' },
      });
    }
  });

  it('serves with the token', async () => {
    const ok = await call(url, 'POST', '/verify', body, { authorization: `Bearer ${TOKEN}` });
    expect(ok.status).toBe(200);
    expect((ok.json as { reward: number }).reward).toBe(0);
  });

  it('refuses a non-loopback host without a token before binding', async () => {
    await expect(startResourcesServer(math, { host: '0.0.0.0' })).rejects.toThrow(/refusing to serve 0\.0\.0\.0 without a token/);
    await expect(startResourcesServer(math, { token: 'not a b64token' })).rejects.toThrow(/the token must be/);
  });
});
