import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { defineEnvironment } from '@rollserve/core';
import { warmUp } from '@rollserve/core/internal';
import { RolloutTask, startRolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { call, startFakePolicy, workspaceRoot, type FakePolicy } from '@rollserve/testing';
import { request } from 'undici';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';

// The start-up warm-up (startRolloutServer's `warmUp`, `rollserve start --warm-up`): rollouts run
// through twins of the service, one after the other, before it listens. It must touch neither the
// service's store nor its policy backends, must leave nothing behind (no listening socket, no temp
// directory), and must hand the environments' setups to the service, which closes them once. Real parts: the math
// environment and its grader's worker pool, SQLite stores, HTTP on loopback, a fake policy.

/** An environment that counts its setups and closes; reward 1 for an answer of 8. */
function countedEnvironment() {
  const counts = { setups: 0, closes: 0 };
  const env = defineEnvironment({
    name: 'counted',
    domain: 'other',
    row: z.object({}),
    setup: () => ({ id: ++counts.setups }),
    close: () => void counts.closes++,
    verify: (_row, response) => ({ reward: JSON.stringify(response.output).includes('\\\\boxed{8}') ? 1 : 0 }),
  });
  return { env, counts };
}

const mathRows = async () =>
  (await readFile(join(workspaceRoot(), 'environments', 'math', 'data', 'warm-up.jsonl'), 'utf8'))
    .split('\n')
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line) as Record<string, unknown>);

const warmUpDirs = async () => (await readdir(tmpdir())).filter((name) => name.startsWith('rollserve-warm-up-'));
const listening = () => process.getActiveResourcesInfo().filter((kind) => kind === 'TCPServerWrap').length;

/** One math rollout through the service's HTTP API; its reward. */
async function mathRollout(url: string, id: string): Promise<number> {
  const submitted = await call(url, 'POST', '/v1/rollouts', {
    id,
    env: 'math',
    row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' },
    policy: { model: 'fake-policy' },
  });
  expect(submitted.status).toBe(202);
  const stream = await request(`${url}/v1/rollouts/stream?ids=${id}`);
  const [result] = (await stream.body.text()).split('\n').filter((line) => line.trim()).map((line) => JSON.parse(line) as { reward: number });
  return result!.reward;
}

describe('the start-up warm-up', () => {
  let dir: string;
  let fake: FakePolicy;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rollserve-warm-up-test-'));
    fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
  });
  afterEach(async () => {
    await fake.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('runs its rollouts on a store and a policy of its own, leaves nothing behind, and hands the setups to the service', async () => {
    const { env: counted, counts } = countedEnvironment();
    const dirsBefore = await warmUpDirs();
    const listeningBefore = listening();
    const server = await startRolloutServer({
      environments: [math, counted],
      store: `sqlite://${join(dir, 'store.db')}`,
      llmBackends: [fake.url],
      warmUp: { rollouts: 60, rows: { math: await mathRows(), counted: [{ responses_create_params: { input: 'Say 8.' } }] }, batch: 25 },
    });
    try {
      expect(server.warmUp).toMatchObject({ rollouts: 60, states: { done: 60 } });
      // the policy's backends and the store never heard of it
      expect(fake.requests).toHaveLength(0);
      expect((await call(server.url, 'GET', '/v1/status')).json).toMatchObject({ rollouts: { total: 0 } });
      // its twin, stand-in policy and store are gone: one more listening socket (the service's), no temp directory
      expect(listening()).toBe(listeningBefore + 1);
      expect(await warmUpDirs()).toEqual(dirsBefore);
      // the environments were set up once, for the twin, and are the service's now
      expect(counts).toEqual({ setups: 1, closes: 0 });
      expect(await mathRollout(server.url, 'served')).toBe(1);
      expect(fake.requests).toHaveLength(1);
      expect(counts.setups).toBe(1);
    } finally {
      await server.close();
    }
    expect(counts).toEqual({ setups: 1, closes: 1 });
  });

  it('serves without it when it fails (rows the environment refuses), and still closes the setups it started', async () => {
    const { env: counted, counts } = countedEnvironment();
    const listeningBefore = listening();
    const server = await startRolloutServer({
      environments: [math, counted],
      store: `sqlite://${join(dir, 'store.db')}`,
      llmBackends: [fake.url],
      warmUp: { rollouts: 10, rows: { counted: [{ responses_create_params: { input: 'Say 8.' } }], math: [{ question: 'no responses_create_params' }] } },
    });
    try {
      expect(server.warmUp).toBeUndefined();
      expect(listening()).toBe(listeningBefore + 1);
      expect(await mathRollout(server.url, 'served')).toBe(1);
      expect((await call(server.url, 'GET', '/v1/status')).json).toMatchObject({ rollouts: { total: 1 } });
    } finally {
      await server.close();
    }
    expect(counts.closes).toBe(counts.setups);
  });

  it('runs a fifth of its rollouts through a first twin, closed before a second twin runs the rest (firstTwin 0: one twin)', async () => {
    const { env: counted } = countedEnvironment();
    const rows = { counted: [{ responses_create_params: { input: 'Say 8.' } }] };
    const dirsBefore = await warmUpDirs();
    const twinsOf = async (options: { rollouts: number; firstTwin?: number }) => {
      const events: string[] = [];
      const report = await warmUp({ ...options, rows, batch: 7 }, async ({ store, llm }) => {
        const twin = await startRolloutServer({ environments: [counted], store, llmBackends: [llm], runLocally: 'always' });
        events.push(`open ${basename(store)}`);
        return {
          url: twin.url,
          close: async () => {
            const { json } = await call(twin.url, 'GET', '/v1/status');
            await twin.close();
            events.push(`close after ${(json as { rollouts: { total: number } }).rollouts.total}`);
          },
        };
      });
      return { events, report };
    };
    const two = await twinsOf({ rollouts: 20 });
    expect(two.report).toMatchObject({ rollouts: 20, states: { done: 20 } });
    expect(two.events).toEqual(['open warm-up-1.db', 'close after 4', 'open warm-up-2.db', 'close after 16']);
    const one = await twinsOf({ rollouts: 20, firstTwin: 0 });
    expect(one.events).toEqual(['open warm-up-1.db', 'close after 20']);
    expect(await warmUpDirs()).toEqual(dirsBefore);
  });

  it('gives each batch one environment, each twin its share of every environment, and tells the worker threads it starts (ROLLSERVE_WARMING_UP) while it runs', async () => {
    const verified: string[] = [];
    const seenInSetup: Array<string | undefined> = [];
    const recording = (name: string) =>
      defineEnvironment({
        name,
        domain: 'other',
        row: z.object({}),
        setup: () => void seenInSetup.push(process.env.ROLLSERVE_WARMING_UP),
        verify: () => {
          verified.push(name);
          return { reward: 1 };
        },
      });
    const environments = [recording('a'), recording('b')];
    const row = { responses_create_params: { input: 'Say 8.' } };
    const before = process.env.ROLLSERVE_WARMING_UP;
    const report = await warmUp({ rollouts: 20, firstTwin: 4, batch: 7, rows: { a: [row], b: [row] } }, async ({ store, llm }) => {
      const twin = await startRolloutServer({ environments, store, llmBackends: [llm] });
      return { url: twin.url, close: () => twin.close() };
    });
    expect(report).toMatchObject({ rollouts: 20, states: { done: 20 } });
    // batches run one after the other: a's 2 and b's 2 (the first twin), then a's 8 (7 + 1) and b's 8
    const runs = verified.reduce<Array<[string, number]>>((acc, env) => (acc.at(-1)?.[0] === env ? (acc.at(-1)![1]++, acc) : [...acc, [env, 1]]), []);
    expect(runs).toEqual([
      ['a', 2],
      ['b', 2],
      ['a', 8],
      ['b', 8],
    ]);
    expect(seenInSetup.length).toBeGreaterThan(0);
    expect(seenInSetup.every((value) => value === '1')).toBe(true);
    expect(process.env.ROLLSERVE_WARMING_UP).toBe(before);
  });

  it("gives its twins the service's options but for its token, journal and store: a token, runLocally 'never' and a retention still warm up", async () => {
    const { env: counted } = countedEnvironment();
    // a journal of rollserve before the store, one task in it: the service's, imported into its store
    const journal = join(dir, 'journal.jsonl');
    const old = RolloutTask.parse({ id: 'old', env: 'counted', row: { responses_create_params: { input: 'Say 8.' } }, policy: { model: 'fake-policy' } });
    await writeFile(journal, `${JSON.stringify({ type: 'task', taskId: 'old', task: old, rolloutIds: ['old'], at: new Date().toISOString() })}\n`);
    const server = await startRolloutServer({
      environments: [counted],
      store: `sqlite://${join(dir, 'store.db')}`,
      importJournal: journal,
      llmBackends: [fake.url],
      token: 'secret',
      runLocally: 'never',
      retention: { keepLast: 5 },
      warmUp: { rollouts: 12, rows: { counted: [{ responses_create_params: { input: 'Say 8.' } }] } },
    });
    try {
      expect(server.warmUp).toMatchObject({ rollouts: 12, states: { done: 12 } });
      expect(fake.requests).toHaveLength(0);
      // the service's store holds the journal's task and nothing of the warm-up
      const status = await request(`${server.url}/v1/status`, { headers: { authorization: 'Bearer secret' } });
      expect(((await status.body.json()) as { rollouts: { total: number } }).rollouts.total).toBe(1);
    } finally {
      await server.close();
    }
  });

  it('is off with 0 rollouts: nothing runs before the first rollout', async () => {
    const { env: counted, counts } = countedEnvironment();
    const server = await startRolloutServer({
      environments: [math, counted],
      store: `sqlite://${join(dir, 'store.db')}`,
      llmBackends: [fake.url],
      warmUp: { rollouts: 0, rows: { counted: [{ responses_create_params: { input: 'Say 8.' } }] } },
    });
    try {
      expect(server.warmUp).toBeUndefined();
      expect(counts.setups).toBe(0);
    } finally {
      await server.close();
    }
    expect(counts).toEqual({ setups: 0, closes: 0 });
  });
});
