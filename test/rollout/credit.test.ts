import { defineEnvironment, defineTool } from '@rollserve/core';
import { createRolloutApi, trainingView, type RolloutResult, type RolloutService, type TrainingView } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { type FakePolicy, type FakeReply, startFakePolicy, startTestRolloutService } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';

// GTPO end to end: groups through the rollout service with the scripted policy, the numbers
// worked out by hand (γ 0.9, format penalty 0.1, α 0.5).

/** A tool that "runs" code: exit code 1 when the code says `fail`. Structured outcome, text for the model. */
const execute = defineTool({
  description: 'Run code',
  parameters: z.object({ code: z.string() }),
  text: (value: { output: string }) => value.output,
  execution: (value: { exitCode: number }) => ({ exitCode: value.exitCode, timedOut: false, exception: null }),
  handler: ({ code }) => ({ output: `ran ${code.length} chars`, exitCode: code.includes('fail') ? 1 : 0 }),
});

const coder = defineEnvironment({
  name: 'coder',
  domain: 'coding',
  row: z.object({}),
  tools: { execute },
  verify: (_row, response) => ({ reward: JSON.stringify((response as { output: unknown[] }).output.at(-1)).includes('right') ? 1 : 0 }),
});

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

const run = (code: string): FakeReply => ({ toolCalls: [{ name: 'execute', arguments: { code } }] });

/** Sample 0 succeeds after running `x = 1`; 1 fails after the same code; 2 sends broken arguments, runs `y = 2`, fails. */
const scripts: Record<string, FakeReply[]> = {
  '0': [run('x = 1'), 'right'],
  '1': [run('x = 1'), 'wrong'],
  '2': [{ toolCalls: [{ name: 'execute', arguments: '{"code": ' }] }, run('y = 2'), 'wrong'],
};

async function setup(options: { embeddingFaults?: { status: number } } = {}): Promise<{ svc: RolloutService; fake: FakePolicy }> {
  const fake = await startFakePolicy({
    script: (_request, ctx) => scripts[ctx.conversation.split(':').at(-1)!]![ctx.turn]!,
    ...(options.embeddingFaults ? { embeddingFaults: options.embeddingFaults } : {}),
  });
  const { service: svc, close } = await startTestRolloutService({ environments: [coder], backends: [fake.url] });
  cleanups.push(async () => {
    await close();
    await fake.close();
  });
  return { svc, fake };
}

async function group(svc: RolloutService, id: string, credit?: Record<string, unknown>): Promise<RolloutResult[]> {
  const [task] = await svc.submit([{ id, env: 'coder', row: { responses_create_params: { input: 'write code' } }, policy: { model: 'fake-policy' }, n: 3, ...(credit ? { credit } : {}) }]);
  return Promise.all(task!.rolloutIds.map((r) => svc.wait(r)));
}

describe('turn-level credit through the rollout service', () => {
  it('scores a mixed group: format penalty, shaping only on failures, pooled advantages, and a training view', async () => {
    const { svc } = await setup();
    const [s, f1, f2] = await group(svc, 'mix');
    expect([s!.reward, f1!.reward, f2!.reward]).toEqual([1, 0, 0]);
    // structured tool outcomes; the executed code per turn
    expect(f2!.turns.map((t) => t.status)).toEqual(['malformed', 'ok', 'none']);
    expect(f2!.turns[1]!.tool_calls[0]!.execution).toEqual({ exit_code: 0, timed_out: false, exception: null });
    expect(f2!.turns.map((t) => t.code)).toEqual([null, 'y = 2', null]);
    // shaping (lexical): f1's code is s's → cos 1 → 0.5; f2's "y = 2" shares only the 1-gram "="
    // with "x = 1" (5 features each) → cos 0.2 → 0.1; s gets none.
    expect(s!.credit!.shaping!.value).toBe(0);
    expect(f1!.credit!.shaping!.value).toBeCloseTo(0.5, 10);
    expect(f2!.credit!.shaping!.value).toBeCloseTo(0.1, 10);
    // rewards: s [0, 1]; f1 [0, 0.5]; f2 [-0.1, 0, 0.1]
    // returns: s [0.9, 1]; f1 [0.45, 0.5]; f2 [-0.1 + 0.9·0.09 = -0.019, 0 + 0.9·0.1 = 0.09, 0.1]
    const expectedReturns = [[0.9, 1], [0.45, 0.5], [-0.019, 0.09, 0.1]];
    [s, f1, f2].forEach((r, k) => r!.turns.forEach((t, i) => expect(t.return).toBeCloseTo(expectedReturns[k]![i]!, 10)));
    // pooled over 7 turns: mean 3.021/7 = 0.431571; Σ(G - mean)² = 0.219429 + 0.323112 + 0.000340
    // + 0.004681 + 0.203027 + 0.116671 + 0.109937 = 0.977148 (…/7 = 0.139593), std = 0.373628
    const expectedAdvantages = [[1.25373, 1.52138], [0.04932, 0.18315], [-1.20594, -0.9142, -0.88744]];
    [s, f1, f2].forEach((r, k) => r!.turns.forEach((t, i) => expect(t.normalized_return).toBeCloseTo(expectedAdvantages[k]![i]!, 4)));
    expect(s!.credit!.error).toBeNull();

    // The training view: the first prompt, then generations (mask 1) and the context between (mask 0).
    const api = createRolloutApi(svc);
    const response = await api.request('/v1/rollouts/mix:2?view=training');
    expect(response.status).toBe(200);
    const view = (await response.json()) as TrainingView;
    expect(view.sequence_error).toBeNull();
    // its tool calls' executions in the results' casing (issue 27: they kept exitCode/timedOut)
    expect(view.turns[1]!.tool_calls[0]!.execution).toEqual({ exit_code: 0, timed_out: false, exception: null });
    expect(view.prompt_ids).toEqual(f2!.turns[0]!.prompt_token_ids);
    const n = view.response_ids!.length;
    expect([view.response_mask!.length, view.response_logprobs!.length, view.response_turn!.length]).toEqual([n, n, n]);
    for (const turn of f2!.turns) {
      const [start, end] = view.turns[turn.index]!.generation_span!;
      expect(view.response_ids!.slice(start, end)).toEqual(turn.generation_token_ids);
      expect(view.response_mask!.slice(start, end).every((m) => m === 1)).toBe(true);
      expect(view.response_logprobs!.slice(start, end)).toEqual(turn.generation_logprobs);
      expect(view.response_turn!.slice(start, end).every((t) => t === turn.index)).toBe(true);
    }
    // every token after the first prompt is in some turn's prompt or generation: prompt + response = last prompt + last generation
    const last = f2!.turns.at(-1)!;
    expect([...view.prompt_ids!, ...view.response_ids!]).toEqual([...last.prompt_token_ids!, ...last.generation_token_ids!]);
    const generated = f2!.turns.reduce((a, t) => a + t.generation_token_ids!.length, 0);
    expect(view.response_mask!.filter((m) => m === 1)).toHaveLength(generated);
    expect(view.turns.map((t) => [t.status, t.advantage])).toEqual(f2!.turns.map((t) => [t.status, t.normalized_return]));
    expect(view.turns[0]!.rewards.format).toBeCloseTo(-0.1, 10);
    expect(view.credit!.components.format).toEqual({ weight: 1, params: { penalty: 0.1, bonus: 0 } });
    expect((await api.request('/v1/rollouts/mix:2?view=nope')).status).toBe(400);
  });

  it('shapes with an OpenAI-compatible embeddings endpoint', async () => {
    const { svc, fake } = await setup();
    const [s, f1, f2] = await group(svc, 'emb', { shaping: { similarity: { url: fake.url, model: 'fake-policy' } } });
    expect(fake.embeddingRequests).toHaveLength(1);
    expect(s!.credit!.shaping!.value).toBe(0);
    // the same code embeds the same: cos 1 → α·1
    expect(f1!.credit!.shaping!.similarity).toBeCloseTo(1, 10);
    expect(f1!.credit!.shaping!.value).toBeCloseTo(0.5, 10);
    // hashed bags {y, =, 2} and {x, =, 1} share "=": cos 1/3
    expect(f2!.credit!.shaping!.similarity).toBeCloseTo(1 / 3, 10);
    expect(f2!.credit!.components.shaping!.params).toEqual({ alpha: 0.5, similarity: { url: fake.url, model: 'fake-policy' }, success_threshold: 1, clamp: true });
  });

  it('says so in the result, with no advantages, when the embeddings endpoint is down', async () => {
    const { svc, fake } = await setup({ embeddingFaults: { status: 503 } });
    const closed = await startFakePolicy();
    await closed.close(); // a port nothing listens on any more
    for (const [id, url, cause] of [
      ['down', fake.url, /answered HTTP 503/],
      ['refused', closed.url, /unreachable/],
    ] as const) {
      const results = await group(svc, id, { shaping: { similarity: { url, model: 'fake-policy' } } });
      for (const r of results) {
        expect(r.credit!.error).toMatch(/^shaping failed, so no advantages were computed: embeddings endpoint http/);
        expect(r.credit!.error).toMatch(cause);
        expect(r.credit!.shaping).toBeNull();
        expect(r.turns.every((t) => t.normalized_return === null)).toBe(true);
      }
      // the failures' shaping is unknown (null), not a number; the success's is 0
      expect(results[1]!.turns.at(-1)!.rewards.shaping).toBeNull();
      expect(results[0]!.turns.at(-1)!.rewards.shaping).toBe(0);
    }
  });
});

describe('GTPO details through the rollout service (issue 27)', () => {
  const mathWithCode = (input: string) => ({
    responses_create_params: {
      input: [{ role: 'user', content: input }],
      tools: [{ type: 'function', name: 'execute_python', parameters: { type: 'object', properties: { code: { type: 'string' } }, required: ['code'] } }],
    },
    expected_result: '4',
    expected_code_contains: '',
  });
  const python = (code: string): FakeReply => ({ toolCalls: [{ name: 'execute_python', arguments: { code } }] });

  it("records math_with_code's time-out as 'timeout' and a raise with its exception's name, the policy reading math_with_code's answers", async () => {
    const fake = await startFakePolicy({ script: [python('import time\ntime.sleep(30)'), python('1/0'), python('print(2+2)'), '\\boxed{4}'] });
    const { service: svc, close } = await startTestRolloutService({ environments: [math], backends: [fake.url], environmentConfigs: { math: { max_execution_time: 1 } } });
    cleanups.push(async () => {
      await close();
      await fake.close();
    });
    const [task] = await svc.submit([{ id: 'mwc-outcomes', env: 'math', row: mathWithCode('What is 2+2?'), policy: { model: 'fake-policy' } }]);
    const result = await svc.wait(task!.rolloutIds[0]!);
    expect(result).toMatchObject({ state: 'done', reward: 1 });
    const calls = result.turns.flatMap((t) => t.tool_calls);
    expect(calls.map((c) => [c.status, c.execution])).toEqual([
      ['timeout', { exit_code: null, timed_out: true, exception: null }],
      ['error', { exit_code: null, timed_out: false, exception: 'ZeroDivisionError: division by zero' }],
      ['ok', { exit_code: null, timed_out: false, exception: null }],
    ]);
    expect(result.turns.map((t) => t.status)).toEqual(['timeout', 'error', 'ok', 'none']);
    // what the policy read is math_with_code's response, unchanged
    expect(JSON.parse(calls[0]!.output)).toEqual({ success: false, stdout: '', stderr: '', error_message: 'code timed-out', result: null });
    expect(JSON.parse(calls[1]!.output)).toEqual({ success: false, stdout: '', stderr: '', error_message: 'division by zero', result: null });
    // the training view carries the same structured outcomes
    const view = trainingView(result);
    expect(view.turns[0]!.tool_calls[0]).toMatchObject({ status: 'timeout', execution: { timed_out: true } });
    expect(view.turns[1]!.tool_calls[0]).toMatchObject({ status: 'error', execution: { exception: 'ZeroDivisionError: division by zero' } });
  }, 120_000);

  it('keeps the turns a filtered sample made before its policy error', async () => {
    const fake = await startFakePolicy({ script: [run('x = 1'), { status: 400, errorMessage: 'prompt too long for this test' }] });
    const { service: svc, close } = await startTestRolloutService({ environments: [coder], backends: [fake.url] });
    cleanups.push(async () => {
      await close();
      await fake.close();
    });
    const [task] = await svc.submit([{ id: 'policy-error-at-turn-1', env: 'coder', row: { responses_create_params: { input: 'write code' } }, policy: { model: 'fake-policy' } }]);
    const result = await svc.wait(task!.rolloutIds[0]!);
    expect(result).toMatchObject({ state: 'failed', critical_error: 'run', filter: true, error: { code: 'LLM_BACKEND' } });
    expect(result.error!.message).toMatch(/prompt too long for this test/);
    // turn 0 (its call of `execute`) is kept, with its token ids; the failed turn 1 made nothing
    expect(result.turns).toHaveLength(1);
    expect(result.turns[0]!.tool_calls.map((c) => [c.name, c.status])).toEqual([['execute', 'ok']]);
    expect(result.turns[0]!.generation_token_ids!.length).toBeGreaterThan(0);
    expect(result.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'tool']);
    expect(result.response).not.toBeNull();
    // filtered: no advantages, no part in shaping
    expect(result.advantage).toBeNull();
    expect(result.turns[0]!.normalized_return).toBeNull();
  }, 120_000);
});
