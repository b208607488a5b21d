import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RolloutError } from '@rollserve/core';
import { isRetryable, NodeClient, withRetry } from '@rollserve/core/node';
import { afterEach, describe, expect, it } from 'vitest';
import { Resources, startService, startShellPolicy } from './helpers.ts';

// The node's HTTP client: every failure a RolloutError that says whether to try again, and
// withRetry tries again exactly those.

const resources = new Resources();
afterEach(() => resources.cleanup());

const registration = { node_id: 'c1', host: 'h', pid: 1, capacity: { init: 1, run: 1, eval: 1 }, max_rollouts: 1, environments: ['shell'] };

/** A server that answers 503 `failures` times, then lets `then` answer. */
async function flaky(failures: number, then: string): Promise<{ url: string; hits: () => number }> {
  let hits = 0;
  const server = createServer((req, res) => {
    req.resume();
    hits++;
    if (hits <= failures) res.writeHead(503, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code: 'UNAVAILABLE', message: 'restarting', retryable: true } }));
    else res.writeHead(201, { 'content-type': 'application/json' }).end(then);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  resources.add(() => new Promise((resolve) => server.close(() => resolve())));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits: () => hits };
}

describe('NodeClient', () => {
  it('an unreachable service is a retryable UNAVAILABLE; a refusal is the service\'s own error, not retryable', async () => {
    const fake = await startShellPolicy(resources);
    const { url, close } = await startService(resources, fake.url, { token: 't' });
    const client = new NodeClient({ serviceUrl: url, token: 'wrong' });
    resources.add(() => client.close());
    const refused = await client.register(registration).catch((error: unknown) => error);
    expect(RolloutError.isInstance(refused) && { code: refused.code, retryable: isRetryable(refused) }).toEqual({ code: 'UNAUTHORIZED', retryable: false });

    const right = new NodeClient({ serviceUrl: `${url}/`, token: 't' });
    resources.add(() => right.close());
    expect(await right.register(registration)).toMatchObject({ node_id: 'c1', heartbeat_ms: 250, node_timeout_ms: 3_000 });
    const unknown = await right.heartbeat('nobody', []).catch((error: unknown) => error);
    expect(RolloutError.isInstance(unknown) && unknown.code).toBe('NOT_FOUND');

    await close();
    const gone = await right.heartbeat('c1', []).catch((error: unknown) => error);
    expect(RolloutError.isInstance(gone) && { code: gone.code, retryable: isRetryable(gone) }).toEqual({ code: 'UNAVAILABLE', retryable: true });
  });

  it('withRetry calls again through 5xx answers until one succeeds, and not after a 4xx', async () => {
    const answer = JSON.stringify({ node_id: 'c1', credential: 'secret', lease_ms: 1, heartbeat_ms: 2, node_timeout_ms: 3 });
    const server = await flaky(3, answer);
    const client = new NodeClient({ serviceUrl: server.url });
    resources.add(() => client.close());
    expect(await withRetry(() => client.register(registration), { minMs: 1, maxMs: 5 })).toEqual({ node_id: 'c1', credential: 'secret', lease_ms: 1, heartbeat_ms: 2, node_timeout_ms: 3 });
    expect(server.hits()).toBe(4);

    let calls = 0;
    const refused = await withRetry(async () => {
      calls++;
      throw new RolloutError({ code: 'UNPROCESSABLE', message: 'no' });
    }).catch((error: unknown) => error);
    expect(RolloutError.isInstance(refused) && refused.code).toBe('UNPROCESSABLE');
    expect(calls).toBe(1);

    const stop = new AbortController();
    const stopped = withRetry(
      async () => {
        throw new RolloutError({ code: 'UNAVAILABLE', message: 'down', retryable: true });
      },
      { signal: stop.signal, minMs: 1, maxMs: 5 },
    );
    stop.abort();
    await expect(stopped).rejects.toMatchObject({ code: 'UNAVAILABLE' });
  });

  it('an answer that is not the protocol\'s is an INTERNAL error that says so, not a crash', async () => {
    const server = await flaky(0, '{"hello": "world"}');
    const client = new NodeClient({ serviceUrl: server.url });
    resources.add(() => client.close());
    await expect(client.register(registration)).rejects.toMatchObject({ code: 'INTERNAL', message: expect.stringMatching(/not what this node expects/) });
  });
});
