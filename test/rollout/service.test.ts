import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defineEnvironment, defineTool } from '@rollserve/core';
import { openStore, type RolloutService, type RolloutResult, type RolloutTaskInput } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { counterEnvironment, type FakePolicy, type FakeReply, renderPrompt, startFakePolicy, startTestRolloutService, toyTokenizer } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

async function policy(script: Parameters<typeof startFakePolicy>[0]): Promise<FakePolicy> {
  const fake = await startFakePolicy(script);
  cleanups.push(() => fake.close());
  return fake;
}

async function service(options: Partial<Parameters<typeof RolloutService.create>[0]> & { backends: string[] }): Promise<RolloutService> {
  const { service: created, close } = await startTestRolloutService({ environments: [math, counterEnvironment], ...options });
  cleanups.push(close);
  return created;
}

const mathTask = (id: string, question: string, expected: string, n = 1): RolloutTaskInput => ({
  id,
  env: 'math',
  row: { responses_create_params: { input: [{ role: 'user', content: question }] }, question, expected_answer: expected },
  policy: { model: 'fake-policy', sampling: { temperature: 1 } },
  n,
});

describe('rollout service: math with the fake policy', () => {
  it('runs single-turn math rollouts to the expected rewards, with token ids and logprobs', async () => {
    const answers: Record<string, string> = { 'What is 3+5?': '\\boxed{8}', 'What is half of 1?': 'It is \\boxed{\\frac{1}{2}}', 'What is 2*3?': '\\boxed{5}' };
    const fake = await policy({ script: (request) => answers[String((request.messages[0] as { content: string }).content)] ?? 'no idea' });
    const svc = await service({ backends: [fake.url] });
    const submitted = await svc.submit([
      mathTask('t-add', 'What is 3+5?', '8'),
      mathTask('t-half', 'What is half of 1?', '0.5'),
      mathTask('t-mul', 'What is 2*3?', '6'),
    ]);
    expect(submitted.map((s) => s.rolloutIds)).toEqual([['t-add'], ['t-half'], ['t-mul']]);
    const results = await Promise.all(['t-add', 't-half', 't-mul'].map((id) => svc.wait(id)));
    expect(results.map((r) => r.reward)).toEqual([1, 1, 0]);
    expect(results.map((r) => r.verify_extras.extracted_answer)).toEqual(['8', '1/2', '5']);
    const [add] = results;
    expect(add!.critical_error).toBeNull();
    expect(add!.filter).toBe(false);
    expect(add!.turns).toHaveLength(1);
    const turn = add!.turns[0]!;
    expect(turn.generation_token_ids).toEqual(toyTokenizer.encode('\\boxed{8}'));
    expect(turn.generation_logprobs).toHaveLength(turn.generation_token_ids!.length);
    expect(turn.prompt_token_ids!.length).toBeGreaterThan(0);
    const last = (add!.response!.output as Array<Record<string, unknown>>).at(-1)!;
    expect(last.generation_token_ids).toEqual(turn.generation_token_ids);
    expect(add!.messages.at(-1)).toMatchObject({ role: 'assistant', content: '\\boxed{8}' });
    // The service asked for token ids and logprobs, as vLLM needs to be asked.
    expect(fake.requests[0]).toMatchObject({ logprobs: true, return_token_ids: true, temperature: 1 });
  });

  it('normalises a GRPO group and keeps each sample on one backend', async () => {
    let k = 0;
    const fake = await policy({ script: () => (k++ % 2 === 0 ? '\\boxed{8}' : '\\boxed{7}'), scriptScope: 'global' });
    const svc = await service({ backends: [fake.url] });
    const [task] = await svc.submit([mathTask('group', 'What is 3+5?', '8', 4)]);
    expect(task!.rolloutIds).toEqual(['group:0', 'group:1', 'group:2', 'group:3']);
    const results = await Promise.all(task!.rolloutIds.map((id) => svc.wait(id)));
    expect(results.map((r) => r.reward).sort()).toEqual([0, 0, 1, 1]);
    for (const r of results) expect(r.advantage).toBeCloseTo(r.reward === 1 ? 1 : -1, 4);
  });

  it('is idempotent for caller ids and refuses a different body under a known id', async () => {
    const fake = await policy({ script: () => '\\boxed{8}' });
    const svc = await service({ backends: [fake.url] });
    await svc.submit([mathTask('same', 'What is 3+5?', '8')]);
    await svc.wait('same');
    const again = await svc.submit([mathTask('same', 'What is 3+5?', '8')]);
    expect(again[0]!.existing).toBe(true);
    expect(fake.requests).toHaveLength(1);
    await expect(svc.submit([mathTask('same', 'What is 3+6?', '9')])).rejects.toMatchObject({ code: 'CONFLICT' });
    await expect(svc.submit([{ ...mathTask('x', 'q', '1'), env: 'nope' }])).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(svc.submit([{ ...mathTask('y', 'q', '1'), row: { responses_create_params: { input: 'q' } } }])).rejects.toMatchObject({ code: 'UNPROCESSABLE' });
    // The seed fields are checked at submission too, not left to fail in INIT.
    const counterRow = { responses_create_params: { input: 'q' }, expected_count: 1 };
    await expect(svc.submit([{ id: 'z', env: 'counter', row: counterRow, policy: { model: 'fake-policy' } }])).rejects.toThrow(/initial_count/);
  });
});

describe('rollout service: tools, turns and limits', () => {
  const counterTask = (id: string, extra: Partial<RolloutTaskInput> = {}): RolloutTaskInput => ({
    id,
    env: 'counter',
    row: { responses_create_params: { input: 'add 2 then 3' }, initial_count: 1, expected_count: 6 },
    policy: { model: 'fake-policy' },
    ...extra,
  });

  it('runs a multi-turn tool loop; malformed arguments and unknown tools reach the model as errors', async () => {
    const script: FakeReply[] = [
      { toolCalls: [{ name: 'increment_counter', arguments: '{"count": 2' }] },
      { toolCalls: [{ name: 'no_such_tool', arguments: {} }, { name: 'increment_counter', arguments: { count: 'two' } }] },
      { toolCalls: [{ name: 'increment_counter', arguments: { count: 2 } }, { name: 'increment_counter', arguments: { count: 3 } }] },
      { toolCalls: [{ name: 'get_counter_value', arguments: {} }] },
      'The count is 6.',
    ];
    const fake = await policy({ script });
    const svc = await service({ backends: [fake.url] });
    await svc.submit([counterTask('tools', { gamma: 0.5, turn_rewards: { format: 0.1, tool: 0.1, outcome: 1 } })]);
    const result = await svc.wait('tools');
    expect(result.critical_error).toBeNull();
    expect(result.reward).toBe(1);
    expect(result.turns).toHaveLength(5);
    expect(result.turns.map((t) => t.tool_calls.map((c) => c.status))).toEqual([
      ['invalid_arguments'],
      ['unknown_tool', 'invalid_arguments'],
      ['ok', 'ok'],
      ['ok'],
      [],
    ]);
    expect(result.turns[0]!.tool_calls[0]!.output).toContain('Invalid tool call arguments');
    expect(result.turns[1]!.tool_calls[0]!.output).toBe('{"detail":"Not Found"}');
    expect(JSON.parse(result.turns[1]!.tool_calls[1]!.output).detail[0]).toMatchObject({ loc: ['body', 'count'], type: 'int_parsing', msg: 'Input should be a valid integer, unable to parse string as an integer' });
    expect(result.turns[3]!.tool_calls[0]!.output).toBe('{"count":6}');
    // The model saw each tool output as a tool message on its next call.
    const fourth = fake.requests[3]!.messages as Array<{ role: string; content: string }>;
    expect(fourth.filter((m) => m.role === 'tool').map((m) => m.content).slice(-2)).toEqual(['{"success":true}', '{"success":true}']);
    // Turn rewards: format/tool per turn, outcome on the last; returns discounted by 0.5. The
    // legacy turn_rewards.format (0.1) is the format component's value on a well-formed turn.
    expect(result.turns.map((t) => t.rewards.format)).toEqual([0, 0, 0.1, 0.1, 0.1]);
    expect(result.turns.map((t) => t.status)).toEqual(['malformed', 'malformed', 'ok', 'ok', 'none']);
    expect(result.turns[4]!.reward).toBeCloseTo(1.2);
    expect(result.turns[3]!.return).toBeCloseTo(0.2 + 0.5 * 1.2);
    const types = (result.response!.output as Array<{ type: string }>).map((o) => o.type);
    expect(types.filter((t) => t === 'function_call')).toHaveLength(6);
    expect(types.at(-1)).toBe('message');
  });

  it('gives every turn back its whole prompt, as the policy tokenised it, re-tokenisation drift included', async () => {
    // (a rollout in flight holds each prompt id once; the prompts are whole again when its loop ends)
    const fake = await policy({ drifting: true, script: (_request, ctx) => (ctx.turn < 5 ? { toolCalls: [{ name: 'increment_counter', arguments: { count: 1 } }] } : 'The count is 6.') });
    const svc = await service({ backends: [fake.url] });
    await svc.submit([counterTask('prompts')]);
    const result = await svc.wait('prompts');
    expect(result.turns).toHaveLength(6);
    expect(result.reward).toBe(1);
    const tokenised = fake.requests.map((r) => toyTokenizer.encode(renderPrompt(r.messages, r.tools as unknown[] | undefined)));
    expect(result.turns.map((t) => t.prompt_token_ids)).toEqual(tokenised);
    const items = (result.response!.output as Array<Record<string, unknown>>).filter((item) => 'prompt_token_ids' in item);
    expect(items.map((item) => item.prompt_token_ids)).toEqual(tokenised);
  });

  it('offers the environment\'s tools unless it offers only what rows declare', async () => {
    const fake = await policy({ script: () => 'done' });
    const declaredOnly = defineEnvironment({ ...counterEnvironment, name: 'declared-only', offerTools: 'declared' });
    const svc = await service({ backends: [fake.url], environments: [counterEnvironment, declaredOnly] });
    const declared = [{ type: 'function', name: 'get_counter_value', parameters: { type: 'object', properties: {} } }];
    await svc.submit([
      counterTask('all'),
      { ...counterTask('none'), env: 'declared-only' },
      { ...counterTask('some'), env: 'declared-only', row: { responses_create_params: { input: 'x', tools: declared }, initial_count: 1, expected_count: 1 } },
    ]);
    await Promise.all(['all', 'none', 'some'].map((id) => svc.wait(id)));
    const offered = (input: string) =>
      ((fake.requests.find((r) => JSON.stringify(r.messages).includes(input))?.tools ?? []) as Array<{ function: { name: string } }>).map((t) => t.function.name);
    expect(offered('add 2 then 3')).toEqual(expect.arrayContaining(['increment_counter', 'get_counter_value']));
    expect(fake.requests.filter((r) => r.tools === undefined)).toHaveLength(1);
    expect(offered('"x"')).toEqual(['get_counter_value']);
  });

  it('ends cleanly on the turn limit and on a length stop', async () => {
    const loop = await policy({ script: () => ({ toolCalls: [{ name: 'get_counter_value', arguments: {} }] }) });
    const svc = await service({ backends: [loop.url] });
    await svc.submit([counterTask('turns', { limits: { max_turns: 3 } })]);
    const limited = await svc.wait('turns');
    expect(limited.critical_error).toBeNull();
    expect(limited.turns).toHaveLength(3);
    expect(limited.reward).toBe(0);

    const cut = await policy({ script: [{ content: 'a very long answer that goes on', finishReason: 'length', toolCalls: [{ name: 'increment_counter', arguments: { count: 5 } }] }] });
    const svc2 = await service({ backends: [cut.url] });
    await svc2.submit([counterTask('length')]);
    const truncated = await svc2.wait('length');
    expect(truncated.critical_error).toBeNull();
    expect(truncated.turns).toHaveLength(1);
    expect(truncated.turns[0]!.tool_calls).toEqual([]); // a cut generation's tool calls are not run
    expect(truncated.response!.incomplete_details).toEqual({ reason: 'max_output_tokens' });
  });

  it('times out on stage time, flags the sample and frees its session', async () => {
    const slow = await policy({ script: () => ({ content: 'late', latencyMs: 5_000 }) });
    const svc = await service({ backends: [slow.url] });
    await svc.submit([counterTask('slow', { limits: { time_limit_s: 0.5 } })]);
    const result = await svc.wait('slow');
    expect(result.critical_error).toBe('timeout');
    expect(result.filter).toBe(true);
    expect(result.state).toBe('failed');
    expect(svc.status().live_sessions).toBe(0);
  });

  it('cancels during RUN: the job leaves its stage and its session resources are freed', async () => {
    const freed: string[] = [];
    const holder = defineEnvironment({
      name: 'holder',
      domain: 'other',
      row: z.object({}),
      tools: {
        hold: defineTool({
          description: 'takes a resource and holds it',
          parameters: z.object({}),
          handler: (_a, ctx) => {
            ctx.session.onClose(() => void freed.push(ctx.session.id));
            return { held: true };
          },
        }),
      },
      verify: () => ({ reward: 1 }),
    });
    const fake = await policy({ script: [{ toolCalls: [{ name: 'hold', arguments: {} }] }, { content: 'never', hang: true }] });
    const svc = await service({ backends: [fake.url], environments: [holder] });
    await svc.submit([{ id: 'c', env: 'holder', row: { responses_create_params: { input: 'go' } }, policy: { model: 'fake-policy' } }]);
    while (fake.requests.length < 2) await new Promise((r) => setTimeout(r, 10));
    expect((await svc.get('c'))!.state).toBe('run');
    await svc.cancel('c');
    const result = await svc.wait('c');
    expect(result.state).toBe('cancelled');
    expect(result.critical_error).toBe('cancelled');
    expect(freed).toEqual(['c']);
    expect(svc.status().live_sessions).toBe(0);
    expect(svc.status().stages.run.active).toBe(0);
  });
});

describe('rollout service: reliability', () => {
  it('survives a backend that dies mid-run: its rollouts finish on the other one', async () => {
    const script = (request: { messages: unknown[] }) =>
      (request.messages as unknown[]).length < 3 ? { toolCalls: [{ name: 'get_counter_value', arguments: {} }], latencyMs: 30 } : { content: 'done', latencyMs: 30 };
    const a = await policy({ script });
    const b = await policy({ script });
    const svc = await service({ backends: [a.url, b.url] });
    const tasks = Array.from({ length: 12 }, (_, i) => ({
      id: `r${i}`,
      env: 'counter',
      row: { responses_create_params: { input: `task ${i}` }, initial_count: 0, expected_count: 0 },
      policy: { model: 'fake-policy' },
    }));
    await svc.submit(tasks);
    while (a.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
    await a.kill();
    const results = await Promise.all(tasks.map((t) => svc.wait(t.id)));
    expect(results.every((r) => r.critical_error === null)).toBe(true);
    expect(results.every((r) => r.reward === 1)).toBe(true);
    expect(b.requests.length).toBeGreaterThan(0);
  });

  it('fills every group, even when its samples finish together, and stores the group\'s credit', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-store-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const store = `sqlite://${join(dir, 'store.db')}`;
    const fake = await policy({ script: () => 'done' });
    const tasks: RolloutTaskInput[] = Array.from({ length: 12 }, (_, i) => ({
      id: `g${i}`,
      env: 'counter',
      row: { responses_create_params: { input: `group ${i}` }, initial_count: i, expected_count: i },
      policy: { model: 'fake-policy' },
      n: 8,
    }));
    const svc = await service({ backends: [fake.url], environments: [counterEnvironment], store });
    const submitted = await svc.submit(tasks);
    const results = await Promise.all(submitted.flatMap((t) => t.rolloutIds).map((id) => svc.wait(id)));
    expect(results).toHaveLength(96);
    // the results as stored (read by another connection): each with its group's credit
    const reader = await openStore(store);
    cleanups.push(() => reader.close());
    const stored = (await reader.listResults({ limit: 1_000 })).items;
    expect(stored).toHaveLength(96);
    expect(stored.filter((r) => r.advantage === null).map((r) => r.id)).toEqual([]);
    expect((await svc.result('g3:5'))?.advantage).not.toBeNull();
  });

  it('loses nothing and duplicates nothing across a restart mid-batch', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-store-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const store = `sqlite://${join(dir, 'store.db')}`;
    // The counter's verify is instant, so the policy's latency alone paces the batch.
    const fake = await policy({ script: () => ({ content: 'done', latencyMs: 40 }) });
    const tasks: RolloutTaskInput[] = Array.from({ length: 30 }, (_, i) => ({
      id: `j${i}`,
      env: 'counter',
      row: { responses_create_params: { input: `job ${i}` }, initial_count: i, expected_count: i },
      policy: { model: 'fake-policy' },
    }));

    const { service: first, close: restart } = await startTestRolloutService({ environments: [counterEnvironment], backends: [fake.url], store, pools: { run: 4 } });
    await first.submit(tasks);
    while (first.status().rollouts.done < 8) await new Promise((r) => setTimeout(r, 10));
    await restart(); // the restart: in-flight work is dropped, not stored
    const reader = await openStore(store);
    const doneBefore = new Set((await reader.listResults({ limit: 1_000 })).items.map((r) => r.id));
    expect(await reader.counts()).toMatchObject({ leased: 0 }); // what it ran itself went back to the queue
    await reader.close();
    expect(doneBefore.size).toBeGreaterThanOrEqual(8);
    expect(doneBefore.size).toBeLessThan(30);
    const callsBefore = fake.requests.length;

    const second = await service({ backends: [fake.url], environments: [counterEnvironment], store });
    // Known ids answer from the store; the rest run again, by themselves.
    const again = await second.submit(tasks);
    expect(again.every((t) => t.existing)).toBe(true);
    const results: RolloutResult[] = await Promise.all(tasks.map((t) => second.wait(t.id!)));
    expect(results.every((r) => r.reward === 1 && r.state === 'done')).toBe(true);
    for (const id of doneBefore) expect((await second.result(id))?.finished_at).toBe(results.find((r) => r.id === id)!.finished_at);
    expect(await second.store.counts()).toEqual({ queued: 0, leased: 0, done: 30, failed: 0, cancelled: 0 });
    expect(fake.requests.length - callsBefore).toBe(30 - doneBefore.size); // each id ran to completion once
  });

  it('cancels in serial mode once: a running rollout and one waiting for its slot', async () => {
    const fake = await policy({ script: () => ({ content: 'late', hang: true }) });
    const svc = await service({ backends: [fake.url], pipeline: 'serial', pools: { run: 1 } });
    const seen: string[] = [];
    svc.onResult((r) => seen.push(r.id));
    const task = (id: string): RolloutTaskInput => ({ id, env: 'counter', row: { responses_create_params: { input: id }, initial_count: 0, expected_count: 0 }, policy: { model: 'fake-policy' } });
    await svc.submit([task('running'), task('waiting')]);
    while (fake.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
    await svc.cancel('waiting');
    await svc.cancel('running');
    const results = await Promise.all([svc.wait('running'), svc.wait('waiting')]);
    expect(results.map((r) => r.state)).toEqual(['cancelled', 'cancelled']);
    await new Promise((r) => setTimeout(r, 50));
    expect(seen.sort()).toEqual(['running', 'waiting']);
    expect(svc.status().rollouts).toMatchObject({ cancelled: 2, in_flight: 0 });
    expect(svc.status().stages.run.pool).toBe(1);
    expect(fake.requests).toHaveLength(1); // the waiting one never reached the policy
  });

  it('keeps INIT and RUN flowing while EVAL is slow', async () => {
    // The slow verify holds the only EVAL slot until the test has seen the others get past RUN.
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const slowEval = defineEnvironment({
      name: 'slow-eval',
      domain: 'other',
      row: z.object({ slow: z.boolean() }),
      verify: async (row) => {
        if (row.slow) await gate;
        return { reward: 1 };
      },
    });
    const fake = await policy({ script: () => 'answer' });
    const svc = await service({ backends: [fake.url], environments: [slowEval], pools: { eval: 1 } });
    cleanups.push(async () => release());
    const task = (id: string, slow: boolean): RolloutTaskInput => ({ id, env: 'slow-eval', row: { responses_create_params: { input: id }, slow }, policy: { model: 'fake-policy' } });
    await svc.submit([task('slow', true)]);
    while (!(await svc.get('slow'))!.active || (await svc.get('slow'))!.state !== 'eval') await new Promise((r) => setTimeout(r, 5));
    const fast = Array.from({ length: 20 }, (_, i) => task(`fast${i}`, false));
    await svc.submit(fast);
    // Every fast job gets through INIT and RUN while the slow one holds the only EVAL slot.
    while ((await Promise.all(fast.map((t) => svc.get(t.id!)))).some((v) => v!.state !== 'eval')) await new Promise((r) => setTimeout(r, 5));
    expect(await svc.get('slow')).toMatchObject({ state: 'eval', active: true });
    expect(svc.status().stages.eval).toMatchObject({ active: 1, queued: 20 });
    expect(svc.status().stages.init.active + svc.status().stages.run.active).toBe(0);
    // the slow verify goes on a while after every fast job is queued for EVAL: each of them waits
    // at least that long in EVAL's queue (a lower bound, whatever the load; their INIT and RUN
    // waits, which the load sets, are not compared)
    const HOLD_MS = 100;
    await new Promise((r) => setTimeout(r, HOLD_MS));
    release();
    const results = await Promise.all(fast.map((t) => svc.wait(t.id!)));
    expect(results.every((r) => r.reward === 1)).toBe(true);
    expect(Math.min(...results.map((r) => r.timing.eval.queued_ms))).toBeGreaterThanOrEqual(HOLD_MS - 5);
  });

});

describe('rollout service: accepting a batch', () => {
  const task = (id: string, count = 0): RolloutTaskInput => ({
    id,
    env: 'counter',
    row: { responses_create_params: { input: id }, initial_count: count, expected_count: count },
    policy: { model: 'fake-policy' },
  });

  it('accepts a batch whole or not at all', async () => {
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url] });
    await svc.submit([task('taken', 1)]);
    await expect(svc.submit([task('new1'), task('taken', 2), task('new2')])).rejects.toMatchObject({ code: 'CONFLICT' });
    expect(await svc.get('new1')).toBeUndefined();
    expect(await svc.get('new2')).toBeUndefined();
    // the same id twice in one batch: one task, answered as known the second time
    const twice = await svc.submit([task('dup'), task('dup')]);
    expect(twice.map((t) => t.existing)).toEqual([false, true]);
    expect((await svc.wait('dup')).state).toBe('done');
    expect(svc.status().rollouts.total).toBe(2);
  });

  it('starts the same id once when two submits race', async () => {
    const fake = await policy({ script: () => 'done' });
    const svc = await service({ backends: [fake.url] });
    const [a, b] = await Promise.all([svc.submit([task('race')]), svc.submit([task('race')])]);
    expect([a[0]!.existing, b[0]!.existing]).toEqual([false, true]);
    await svc.wait('race');
    expect(fake.requests).toHaveLength(1);
  });

  it('cancels a rollout that has not started yet', async () => {
    const fake = await policy({ script: () => ({ content: 'late', hang: true }) });
    const svc = await service({ backends: [fake.url] });
    await svc.submit([task('first'), task('second')]);
    expect((await svc.get('second'))!.state).toBe('queued'); // accepted, its work not begun
    await svc.cancel('second');
    expect((await svc.wait('second')).state).toBe('cancelled');
    while (fake.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
    await svc.cancel('first');
    expect((await svc.wait('first')).state).toBe('cancelled');
    expect(fake.requests).toHaveLength(1); // the cancelled one never reached the policy
  });

  it('stores the batch before answering: closed right after, a restart runs all of it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-store-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const store = `sqlite://${join(dir, 'store.db')}`;
    const fake = await policy({ script: () => 'done' });
    const tasks = Array.from({ length: 200 }, (_, i) => task(`b${i}`, i));
    const { service: first, close } = await startTestRolloutService({ environments: [counterEnvironment], backends: [fake.url], store });
    await first.submit(tasks);
    await close(); // before the batch's work began: nothing of it is lost
    const reader = await openStore(store);
    const counts = await reader.counts();
    await reader.close();
    expect(counts.queued + counts.done).toBe(200);
    const done = counts.done;

    const second = await service({ backends: [fake.url], environments: [counterEnvironment], store });
    const results = await Promise.all(tasks.map((t) => second.wait(t.id!)));
    expect(results.every((r) => r.state === 'done' && r.reward === 1)).toBe(true);
    expect(await second.store.counts()).toEqual({ queued: 0, leased: 0, done: 200, failed: 0, cancelled: 0 });
    expect(fake.requests.length).toBe(200 - done); // each ran once
  });
});
