import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { afterEach, describe, expect, it } from 'vitest';
import { startFakePolicy, type FakePolicy, type FakePolicyOptions } from '../../../testing/src/fake-policy/index.ts';
import { RolloutError } from '../errors.ts';
import { LlmBackendPool, type LlmBackendPoolOptions, type LlmRequestEvent } from './backend-pool.ts';
import type { LlmChatMessage } from './types.ts';

const policies: FakePolicy[] = [];
const pools: LlmBackendPool[] = [];
const holes: ChildProcess[] = [];

const SYN_HOLE = `
import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(0)
port = s.getsockname()[1]
queued = []
for _ in range(3):
    c = socket.socket(); c.setblocking(False)
    try: c.connect(('127.0.0.1', port))
    except BlockingIOError: pass
    queued.append(c)
time.sleep(0.2)
print(port, flush=True)
sys.stdin.read()
`;

afterEach(async () => {
  for (const hole of holes.splice(0)) {
    hole.stdin!.end(); // it exits when its stdin closes
    if (hole.exitCode === null) await once(hole, 'exit');
  }
  await Promise.all(pools.splice(0).map((p) => p.close()));
  await Promise.all(policies.splice(0).map((p) => p.close()));
});

async function fake(options: FakePolicyOptions = {}): Promise<FakePolicy> {
  const policy = await startFakePolicy({ script: (_request, ctx) => `reply ${ctx.turn}`, ...options });
  policies.push(policy);
  return policy;
}

function pool(options: LlmBackendPoolOptions = {}): LlmBackendPool {
  const created = new LlmBackendPool({ backoffInitialMs: 50, backoffMaxMs: 200, ...options });
  pools.push(created);
  return created;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(condition: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!condition()) {
    if (performance.now() > deadline) throw new Error('condition not met in time');
    await sleep(10);
  }
}

/** A rollout's conversation: each `turn()` is one model call with the messages grown as the agent loop grows them. */
function conversation(backends: LlmBackendPool, rolloutId: string) {
  const messages: LlmChatMessage[] = [{ role: 'user', content: `task ${rolloutId}` }];
  let turns = 0;
  return {
    async turn(): Promise<string> {
      const result = await backends.chat(rolloutId, { messages: [...messages] });
      expect(result.message.content).toBe(`reply ${turns}`);
      turns += 1;
      messages.push({ role: 'assistant', content: result.message.content }, { role: 'user', content: 'go on' });
      return result.backendId;
    },
  };
}

async function converse(backends: LlmBackendPool, rolloutId: string, turns: number): Promise<string[]> {
  const rollout = conversation(backends, rolloutId);
  const used: string[] = [];
  for (let turn = 0; turn < turns; turn++) used.push(await rollout.turn());
  return used;
}

async function failure(promise: Promise<unknown>): Promise<RolloutError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(RolloutError.isInstance(error)).toBe(true);
  return error as RolloutError;
}

describe('LlmBackendPool', () => {
  it('sticks a rollout to one backend for all its turns', async () => {
    const [a, b] = [await fake(), await fake()];
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'b', baseUrl: b.url }] });
    const used = await Promise.all(['r1', 'r2', 'r3', 'r4'].map((id) => converse(backends, id, 3)));
    for (const turns of used) expect(new Set(turns).size).toBe(1);
    expect(used.map((turns) => turns[0]).sort()).toEqual(['a', 'a', 'b', 'b']);
    // Each backend saw whole conversations, keyed by the rollout header.
    for (const policy of [a, b]) {
      const conversations = new Map<string, number>();
      for (const call of policy.calls) conversations.set(call.conversation, (conversations.get(call.conversation) ?? 0) + 1);
      expect([...conversations.values()]).toEqual([3, 3]);
    }
  });

  it('gives a new rollout the backend with fewest rollouts in flight, ties in turn', async () => {
    const policies = [await fake(), await fake(), await fake()];
    const backends = pool({ backends: policies.map((p, i) => ({ id: `b${i}`, baseUrl: p.url })) });
    const first = await Promise.all(['r1', 'r2', 'r3'].map(async (id) => (await backends.acquire(id)).id));
    expect(first).toEqual(['b0', 'b1', 'b2']);
    expect((await backends.acquire('r4')).id).toBe('b0');
    backends.release('r2');
    expect((await backends.acquire('r5')).id).toBe('b1');
    expect((await backends.acquire('r1')).id).toBe('b0');
    expect(backends.backendOf('r5')).toBe('b1');
    backends.release('r1');
    backends.release('r4');
    // b0 now has none in flight.
    expect((await backends.acquire('r6')).id).toBe('b0');
    expect(backends.list().map((s) => [s.id, s.rollouts_in_flight])).toEqual([
      ['b0', 1],
      ['b1', 1],
      ['b2', 1],
    ]);
    const r7 = await backends.chat('r7', { messages: [{ role: 'user', content: 'hi' }] });
    expect(r7.backendId).toBe('b1');
  });

  it('survives a backend killed mid-run: its rollouts move on, and it is used again after it comes back', async () => {
    const [a, b] = [await fake(), await fake()];
    const events: LlmRequestEvent[] = [];
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'b', baseUrl: b.url }], onRequest: (e) => events.push(e) });
    const rollouts = ['r1', 'r2', 'r3', 'r4'].map((id) => conversation(backends, id));
    expect(await Promise.all(rollouts.map((r) => r.turn()))).toEqual(['a', 'b', 'a', 'b']);

    // Turn 1: a's requests hang, and a dies while they are in flight.
    a.setFaults({ latencyMs: 60_000 });
    const second = Promise.all(rollouts.map((r) => r.turn()));
    await until(() => a.requests.length === 4);
    await a.kill();
    expect(await second).toEqual(['b', 'b', 'b', 'b']);
    expect(await Promise.all(rollouts.map((r) => r.turn()))).toEqual(['b', 'b', 'b', 'b']);
    expect(backends.get('a')).toMatchObject({ healthy: false, connect_failures: 2 });
    expect(events.filter((e) => e.backendId === 'a' && e.outcome === 'connect')).toHaveLength(2);
    expect(backends.get('b')).toMatchObject({ rollouts_in_flight: 4, requests: 10 });

    a.setFaults({});
    await a.restart();
    await until(() => backends.get('a')!.healthy);
    expect(a.modelListCalls).toBeGreaterThanOrEqual(1);
    const fresh = conversation(backends, 'r5');
    expect([await fresh.turn(), await fresh.turn()]).toEqual(['a', 'a']);
  });

  it('sends a request that fails to connect to another backend', async () => {
    const dead = await fake();
    await dead.kill();
    const live = await fake();
    const backends = pool({ backends: [{ id: 'dead', baseUrl: dead.url }, { id: 'live', baseUrl: live.url }], backoffInitialMs: 60_000 });
    expect(await backends.acquire('r1')).toMatchObject({ id: 'dead' });
    const result = await backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] });
    expect(result.backendId).toBe('live');
    expect(backends.backendOf('r1')).toBe('live');
    expect(backends.get('dead')).toMatchObject({ healthy: false, connect_failures: 1, requests: 1 });
    expect(backends.get('dead')!.next_probe_in_ms).not.toBeNull();
    // Out of rotation: new rollouts avoid it even though it has fewer rollouts.
    expect((await backends.acquire('r2')).id).toBe('live');
  });

  it('sends a request again when the connection drops before an answer', async () => {
    const flaky = await fake({ script: [{ dropConnection: true }] });
    const live = await fake();
    const backends = pool({ backends: [{ id: 'flaky', baseUrl: flaky.url }, { id: 'live', baseUrl: live.url }] });
    const result = await backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] });
    expect(result.backendId).toBe('live');
    expect(flaky.requests).toHaveLength(1);
  });

  it('puts a backend back when a request in flight there answers after it was taken out', async () => {
    const a = await fake({
      script: (request) => {
        const text = String((request.messages[0] as { content: string }).content);
        return text === 'drop' ? { dropConnection: true } : { content: 'reply 0', latencyMs: text === 'slow' ? 300 : 0 };
      },
    });
    const b = await fake();
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'b', baseUrl: b.url }], backoffInitialMs: 60_000 });
    expect([(await backends.acquire('r1')).id, (await backends.acquire('r2')).id, (await backends.acquire('r3')).id]).toEqual(['a', 'b', 'a']);
    const slow = backends.chat('r1', { messages: [{ role: 'user', content: 'slow' }] });
    await until(() => a.requests.length === 1);
    const moved = await backends.chat('r3', { messages: [{ role: 'user', content: 'drop' }] });
    expect(moved.backendId).toBe('b');
    expect(backends.get('a')).toMatchObject({ healthy: false });
    expect((await slow).backendId).toBe('a');
    expect(backends.get('a')).toMatchObject({ healthy: true, next_probe_in_ms: null });
  });

  it('does not retry an HTTP 400 and keeps the backend healthy', async () => {
    const a = await fake({ status: 400, errorMessage: 'max_tokens too large' });
    const b = await fake();
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'b', baseUrl: b.url }] });
    const error = await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }));
    expect(error).toMatchObject({ code: 'LLM_BACKEND', kind: 'http', httpStatus: 400, retryable: false });
    expect(b.requests).toHaveLength(0);
    expect(backends.get('a')).toMatchObject({ healthy: true, requests: 1, failures: 1, connect_failures: 0 });
  });

  it('gives up after maxAttempts sends when a backend keeps dropping connections', async () => {
    const dropping = await fake({ script: () => ({ dropConnection: true }) });
    const backends = pool({ backends: [{ id: 'd', baseUrl: dropping.url }], maxAttempts: 3, backoffInitialMs: 10 });
    // Each drop takes the backend out; its probe (GET /models) answers, so it comes back for the next send.
    const error = await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }));
    expect(error).toMatchObject({ code: 'LLM_BACKEND', kind: 'connect', retryable: true });
    expect(dropping.requests).toHaveLength(3);
    expect(dropping.modelListCalls).toBeGreaterThanOrEqual(2);
  });

  it('waits for a backend that answered before when none is healthy, and continues when it comes back', async () => {
    const a = await fake();
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }] });
    await backends.chat('r0', { messages: [{ role: 'user', content: 'hi' }] });
    await a.kill();
    const pending = backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] });
    await until(() => backends.get('a')!.healthy === false);
    await sleep(150);
    await a.restart();
    const result = await pending;
    expect(result.backendId).toBe('a');
    expect(backends.get('a')!.healthy).toBe(true);
  });

  it('fails at once, naming the URL and the cause, when a backend that never answered refuses connections', async () => {
    const closed = await fake();
    const url = closed.url;
    await closed.close(); // nothing listens on its port now
    const backends = pool({ backends: [{ id: 'dead', baseUrl: url }], backoffInitialMs: 60_000 });
    const error = await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }));
    expect(error).toMatchObject({ code: 'LLM_BACKEND', kind: 'unavailable', retryable: true });
    expect(error.message).toBe(`policy backend ${url} unreachable: connect ECONNREFUSED 127.0.0.1:${closed.port}`);
    expect(backends.get('dead')).toMatchObject({ healthy: false, requests: 1, unreachable: `connect ECONNREFUSED 127.0.0.1:${closed.port}` });
    // the next rollout is told the same without another try
    const next = await failure(backends.chat('r2', { messages: [{ role: 'user', content: 'hi' }] }));
    expect(next.message).toBe(error.message);
    expect(backends.get('dead')!.requests).toBe(1);
    // with a live backend beside it, calls go there instead
    const live = await fake();
    backends.add({ id: 'live', baseUrl: live.url });
    expect((await backends.chat('r3', { messages: [{ role: 'user', content: 'hi' }] })).backendId).toBe('live');
  });

  it('fails at once when a host that never answered does not complete the TCP handshake', async () => {
    // A socket that listens but never accepts, its queue full: further handshakes get no answer.
    const hole = spawn('python3', ['-c', SYN_HOLE], { stdio: ['pipe', 'pipe', 'inherit'] });
    holes.push(hole);
    const [line] = (await once(hole.stdout!, 'data')) as [Buffer];
    const url = `http://127.0.0.1:${Number(line.toString())}/v1`;
    const backends = pool({ backends: [{ id: 'hole', baseUrl: url }], connectTimeoutMs: 300 });
    const error = await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }));
    expect(error).toMatchObject({ code: 'LLM_BACKEND', kind: 'unavailable' });
    expect(error.message).toBe(`policy backend ${url} unreachable: connect timeout: no TCP handshake within 300 ms`);
  });

  it('puts a backend that was unreachable back once its probe answers', async () => {
    const policy = await fake();
    await policy.kill();
    const backends = pool({ backends: [{ id: 'late', baseUrl: policy.url }] });
    expect((await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }))).message).toContain('unreachable: connect ECONNREFUSED');
    await policy.restart();
    await until(() => backends.get('late')!.healthy);
    expect(backends.get('late')).toMatchObject({ unreachable: null });
    expect((await backends.chat('r2', { messages: [{ role: 'user', content: 'hi' }] })).backendId).toBe('late');
  });

  it('bounds the wait for a healthy backend by waitForBackendMs and by the signal', async () => {
    const backends = pool({ waitForBackendMs: 200 });
    const error = await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }));
    expect(error).toMatchObject({ code: 'LLM_BACKEND', kind: 'unavailable', retryable: true });

    const patient = pool({ waitForBackendMs: 60_000 });
    const controller = new AbortController();
    const pending = failure(patient.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }, { signal: controller.signal }));
    await sleep(50);
    controller.abort();
    expect(await pending).toMatchObject({ code: 'CANCELLED' });
  });

  it('serves a call that was waiting as soon as a backend is added', async () => {
    const backends = pool();
    const pending = backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] });
    await sleep(50);
    const a = await fake();
    expect(backends.add({ baseUrl: a.url })).toMatchObject({ id: `127.0.0.1:${a.port}`, healthy: true });
    expect((await pending).backendId).toBe(`127.0.0.1:${a.port}`);
  });

  it('applies the request time limit without retrying or taking the backend out', async () => {
    const a = await fake({ hang: true });
    const b = await fake();
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'b', baseUrl: b.url }], requestTimeoutMs: 100 });
    const error = await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }));
    expect(error).toMatchObject({ kind: 'timeout', retryable: true });
    expect(b.requests).toHaveLength(0);
    expect(backends.get('a')).toMatchObject({ healthy: true, failures: 1 });
    const overridden = await failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }, { timeoutMs: 20 }));
    expect(overridden).toMatchObject({ kind: 'timeout' });
  });

  it('lets a removed backend finish its request in flight; the rollout moves on its next turn', async () => {
    const a = await fake({ latencyMs: 200 });
    const b = await fake();
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'b', baseUrl: b.url }] });
    // Remove 'a' while the rollout's first turn is in flight there.
    const turns: string[] = [];
    const messages: LlmChatMessage[] = [{ role: 'user', content: 'task r2' }];
    const first = backends.chat('r2', { messages });
    await until(() => a.requests.some((body) => JSON.stringify(body.messages).includes('task r2')));
    expect(backends.remove('a')).toBe(true);
    turns.push((await first).backendId);
    messages.push({ role: 'assistant', content: 'x' }, { role: 'user', content: 'go on' });
    turns.push((await backends.chat('r2', { messages })).backendId);
    expect(turns).toEqual(['a', 'b']);
    expect(backends.remove('a')).toBe(false);
  });

  it('keeps at most maxConcurrency requests in flight to a backend', async () => {
    let inFlight = 0;
    let peak = 0;
    const a = await fake({
      script: async () => {
        inFlight += 1;
        peak = Math.max(peak, inFlight);
        await sleep(50);
        inFlight -= 1;
        return 'ok';
      },
    });
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url, maxConcurrency: 2 }] });
    await Promise.all(['r1', 'r2', 'r3', 'r4', 'r5'].map((id) => backends.chat(id, { messages: [{ role: 'user', content: id }] })));
    expect(peak).toBe(2);
    expect(backends.get('a')).toMatchObject({ requests: 5, requests_in_flight: 0, max_concurrency: 2 });
    expect(backends.get('a')!.latency_ms.mean).toBeGreaterThan(0);
  });

  it('does not count a cancelled call against the backend', async () => {
    const a = await fake({ hang: true });
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }] });
    const controller = new AbortController();
    const pending = failure(backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] }, { signal: controller.signal }));
    await until(() => a.requests.length === 1);
    controller.abort();
    expect(await pending).toMatchObject({ code: 'CANCELLED' });
    expect(backends.get('a')).toMatchObject({ healthy: true, failures: 0, requests_in_flight: 0 });
  });

  it('validates backends: duplicate ids, bad URLs', () => {
    const backends = pool();
    backends.add({ id: 'a', baseUrl: 'http://127.0.0.1:1/v1' });
    expect(() => backends.add({ id: 'a', baseUrl: 'http://127.0.0.1:2/v1' })).toThrow(expect.objectContaining({ code: 'CONFLICT' }));
    expect(() => backends.add({ baseUrl: 'not a url' })).toThrow(expect.objectContaining({ code: 'BAD_REQUEST' }));
    expect(() => backends.add({ baseUrl: 'http://h:1', maxConcurrency: 0 })).toThrow(expect.objectContaining({ code: 'BAD_REQUEST' }));
  });

  it('close() fails waiting calls and leaves no timers or sockets behind', async () => {
    const resources = () => {
      const counts: Record<string, number> = {};
      for (const name of process.getActiveResourcesInfo()) counts[name] = (counts[name] ?? 0) + 1;
      return counts;
    };
    const before = resources();
    const a = await startFakePolicy();
    const dead = await startFakePolicy();
    await dead.kill();
    const backends = new LlmBackendPool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'dead', baseUrl: dead.url }], backoffInitialMs: 60_000 });
    await backends.chat('r1', { messages: [{ role: 'user', content: 'hi' }] });
    await backends.chat('r2', { messages: [{ role: 'user', content: 'hi' }] });
    expect(backends.get('dead')!.healthy).toBe(false); // a probe timer is pending
    await a.kill();
    const waiting = failure(backends.chat('r3', { messages: [{ role: 'user', content: 'hi' }] }));
    await until(() => backends.list().every((s) => !s.healthy));
    await backends.close();
    expect(await waiting).toMatchObject({ kind: 'unavailable' });
    await a.close();
    await dead.close();
    await sleep(20);
    const after = resources();
    expect(after.Timeout ?? 0).toBeLessThanOrEqual(before.Timeout ?? 0);
    expect(after.TCPSocketWrap ?? 0).toBeLessThanOrEqual(before.TCPSocketWrap ?? 0);
    expect(after.TCPServerWrap ?? 0).toBeLessThanOrEqual(before.TCPServerWrap ?? 0);
  });
});

describe('routes handed to others (a node calling a backend itself)', () => {
  it('tryAcquire sticks by fewest rollouts without waiting, counts the rollout until release, and answers nothing while no backend is healthy', async () => {
    const [a, b] = [await fake(), await fake()];
    const backends = pool({ backends: [{ id: 'a', baseUrl: a.url }, { id: 'b', baseUrl: b.url }] });
    const first = backends.tryAcquire('r1')!.id;
    const second = backends.tryAcquire('r2')!.id;
    expect(new Set([first, second])).toEqual(new Set(['a', 'b']));
    expect(backends.tryAcquire('r1')!.id).toBe(first); // sticky
    expect(backends.requestHeaders('r1')).toEqual({ 'x-rollout-id': 'r1' });
    expect(backends.list().map((s) => s.rollouts_in_flight)).toEqual([1, 1]);
    // a node says `first` gave it no response, but the pool's own probe gets an answer: the node's
    // network, not the backend's, so it stays in rotation and the rollout on it
    await backends.failed(first, 'no response');
    expect(backends.get(first)).toMatchObject({ healthy: true });
    expect(backends.tryAcquire('r1')!.id).toBe(first);
    // `first` is down: the probe confirms it, out of rotation, and its rollout moves on its next acquire
    const fakes = { a, b };
    await fakes[first as 'a' | 'b'].kill();
    await backends.failed(first, 'no response');
    expect(backends.get(first)).toMatchObject({ healthy: false, last_error: 'no response' });
    expect(backends.tryAcquire('r1')!.id).toBe(second);
    expect(backends.list().find((s) => s.id === second)!.rollouts_in_flight).toBe(2);
    await fakes[second as 'a' | 'b'].kill();
    // reports that come together share one probe
    await Promise.all([backends.failed(second, 'no response'), backends.failed(second, 'no response')]);
    expect(backends.get(second)).toMatchObject({ healthy: false, failures: 1 });
    expect(backends.tryAcquire('r3')).toBeUndefined();
    for (const id of ['r1', 'r2', 'r3']) backends.release(id);
    expect(backends.list().map((s) => s.rollouts_in_flight)).toEqual([0, 0]);
    // back up: the probes put them back
    await Promise.all([a.restart(), b.restart()]);
    await until(() => backends.list().every((s) => s.healthy));
  });
});
