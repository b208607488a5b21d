import { describe, expect, it } from 'vitest';
import { trainingView } from './training-view.ts';
import type { RolloutResult, TurnRecord } from './rollout.ts';

const turn = (index: number, prompt: number[] | null, generated: number[] | null): TurnRecord =>
  ({
    index,
    prompt_token_ids: prompt,
    generation_token_ids: generated,
    generation_logprobs: generated?.map((id) => -id / 100) ?? null,
    tool_calls: [],
    code: null,
    status: 'none',
    malformed: null,
    rewards: { format: 0, tool: 1, outcome: index === 1 ? 1 : 0, shaping: 0 },
    reward: index === 1 ? 1 : 0,
    return: index === 1 ? 1 : 0.9,
    normalized_return: null,
  }) as unknown as TurnRecord;

const result = (turns: TurnRecord[]) => ({ id: 'r', task_id: 't', sample_index: 0, reward: 1, advantage: null, filter: false, credit: null, turns }) as unknown as RolloutResult;

describe('training view', () => {
  it('lays out prompt, generations (mask 1) and the context between them (mask 0)', () => {
    // turn 0: prompt [1 2], generates [3 4]; turn 1: prompt [1 2 3 4 5 6] (5 6 = tool output), generates [7]
    const view = trainingView(result([turn(0, [1, 2], [3, 4]), turn(1, [1, 2, 3, 4, 5, 6], [7])]));
    expect(view.prompt_ids).toEqual([1, 2]);
    expect(view.response_ids).toEqual([3, 4, 5, 6, 7]);
    expect(view.response_mask).toEqual([1, 1, 0, 0, 1]);
    expect(view.response_logprobs).toEqual([-0.03, -0.04, 0, 0, -0.07]);
    expect(view.response_turn).toEqual([0, 0, 1, 1, 1]);
    expect(view.turns.map((t) => t.generation_span)).toEqual([
      [0, 2],
      [4, 5],
    ]);
    expect(view.turns.map((t) => t.return)).toEqual([0.9, 1]);
  });

  it('flags re-tokenisation drift and missing token ids instead of a wrong sequence', () => {
    const drift = trainingView(result([turn(0, [1, 2], [3, 4]), turn(1, [1, 2, 9, 4, 5], [7])]));
    expect(drift.sequence_error).toMatch(/drift: turn 1/);
    expect(drift.response_ids).toBeNull();
    expect(drift.turns[1]!.generation_span).toBeNull();
    expect(trainingView(result([turn(0, null, null)])).sequence_error).toMatch(/no token ids/);
  });

  it('carries each turn\'s finish reason and cuts the response at max_response_tokens, spans clipped', () => {
    const turns = [turn(0, [1, 2], [3, 4]), turn(1, [1, 2, 3, 4, 5, 6], [7, 8])];
    turns[0]!.finish_reason = 'tool_calls';
    turns[1]!.finish_reason = 'stop';
    const whole = trainingView(result(turns));
    expect(whole.turns.map((t) => t.finish_reason)).toEqual(['tool_calls', 'stop']);
    expect(whole).toMatchObject({ finish_reason: 'stop', truncated: false });
    // a cap the response fits in changes nothing
    expect(trainingView(result(turns), { maxResponseTokens: 6 })).toEqual(whole);
    const cut = trainingView(result(turns), { maxResponseTokens: 3 });
    expect(cut).toMatchObject({ truncated: true, finish_reason: 'stop', prompt_ids: [1, 2] });
    expect(cut.response_ids).toEqual([3, 4, 5]);
    expect(cut.response_mask).toEqual([1, 1, 0]);
    expect(cut.response_logprobs).toEqual([-0.03, -0.04, 0]);
    expect(cut.response_turn).toEqual([0, 0, 1]);
    expect(cut.turns.map((t) => t.generation_span)).toEqual([
      [0, 2],
      [3, 3],
    ]);
    expect(trainingView(result(turns), { maxResponseTokens: 1 }).turns.map((t) => t.generation_span)).toEqual([
      [0, 1],
      [1, 1],
    ]);
    // the last generation cut by max_tokens is truncated without a cap
    turns[1]!.finish_reason = 'length';
    expect(trainingView(result(turns))).toMatchObject({ finish_reason: 'length', truncated: true });
  });
});
