import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import {
  call,
  cookieHeader,
  counterEnvironment,
  referenceCases,
  replayRollout,
} from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// NeMo Gym's example_session_state_mgmt flow through the core's session handling.
let app: ResourcesServer;
let server: RunningServer;

beforeAll(async () => {
  app = createResourcesServer(counterEnvironment, { instanceName: 'example_session_state_mgmt' });
  server = await serveFetch(app);
});
afterAll(async () => {
  await server.close();
  await app.close();
});

describe('stateful tools (example_session_state_mgmt)', () => {
  it('replays every recorded rollout to the Python server\'s rewards and tool outputs', async () => {
    const cases = referenceCases('example_session_state_mgmt');
    expect(cases).toHaveLength(5);
    for (const { row, recorded, reference } of cases) {
      const result = await replayRollout(server.url, row, recorded.response);
      expect(result.seed.status).toBe(200);
      expect(result.toolOutputs).toEqual(reference.tool_outputs);
      expect(result.tools.every((t) => t.setCookies.length === 1)).toBe(true);
      expect((result.verify.json as { reward: number }).reward).toBe(reference.reward);
      expect(Object.keys(result.verify.json as object).sort()).toEqual(['response', 'responses_create_params', 'reward']);
    }
  });

  it('keeps parallel sessions apart and loses the state when the cookie is dropped', async () => {
    const [a, b] = await Promise.all([
      call(server.url, 'POST', '/seed_session', { initial_count: 10 }),
      call(server.url, 'POST', '/seed_session', { initial_count: 100 }),
    ]);
    const ca = cookieHeader(a.setCookies);
    const cb = cookieHeader(b.setCookies);
    expect(ca).not.toBe(cb);
    await Promise.all(
      Array.from({ length: 20 }, (_, i) => call(server.url, 'POST', '/increment_counter', { count: 1 }, { cookie: i % 2 ? ca : cb })),
    );
    expect((await call(server.url, 'POST', '/get_counter_value', {}, { cookie: ca })).json).toEqual({ count: 20 });
    expect((await call(server.url, 'POST', '/get_counter_value', {}, { cookie: cb })).json).toEqual({ count: 110 });
    // No cookie: a new session, as the Python server gives.
    const fresh = await call(server.url, 'POST', '/get_counter_value', {});
    expect(fresh.json).toEqual({ count: 0 });
    expect(cookieHeader(fresh.setCookies)).not.toBe(ca);
    // verify with a's cookie reads a's counter and frees it.
    const body = { responses_create_params: { input: 'x' }, response: { output: [] }, expected_count: 20 };
    expect((await call(server.url, 'POST', '/verify', body, { cookie: ca })).json).toMatchObject({ reward: 1 });
    expect((await call(server.url, 'POST', '/verify', body, { cookie: ca })).json).toMatchObject({ reward: 0 });
  });

  it('validates seed and tool bodies as the Python models do', async () => {
    const seed = await call(server.url, 'POST', '/seed_session', { initial_count: 'three' });
    expect(seed.status).toBe(422);
    expect((seed.json as { detail: Array<{ loc: unknown[] }> }).detail[0]!.loc).toEqual(['body', 'initial_count']);
    const missing = await call(server.url, 'POST', '/increment_counter', {});
    expect(missing.status).toBe(422);
    expect(missing.json).toEqual({ detail: [{ type: 'missing', loc: ['body', 'count'], msg: 'Field required', input: {} }] });
    expect(missing.setCookies).toHaveLength(1);
  });
});
