import { describe, expect, it } from 'vitest';
import type { RolloutResult, ToolCallRecord, TurnRecord } from '../../protocol/rollout.ts';
import { scoreTurns } from './assign.ts';
import { normalizeAdvantages } from './normalize.ts';
import { resolveCredit } from './settings.ts';

function turn(index: number, statuses: ToolCallRecord['status'][]): TurnRecord {
  return {
    index,
    prompt_token_ids: null,
    generation_token_ids: null,
    weight_version: null,
    generation_logprobs: null,
    finish_reason: 'stop',
    text: null,
    reasoning: null,
    tool_calls: statuses.map((status, i) => ({ id: `c${i}`, name: 'bash', arguments: '{}', output: '', status, execution: null, code: null, duration_ms: 1 })),
    llm_latency_ms: 1,
    backend: null,
    code: null,
    status: 'none',
    malformed: null,
    rewards: { format: 0, tool: 0, outcome: 0, shaping: 0 },
    reward: 0,
    return: 0,
    normalized_return: null,
  };
}

// Tasks with the legacy turn_rewards and gamma (see resolveCredit), scored as before rewards/.
describe('turn rewards (legacy turn_rewards and gamma)', () => {
  it('scores format, tool success and outcome per turn and discounts returns', () => {
    const turns = [turn(0, ['ok', 'error']), turn(1, ['invalid_arguments']), turn(2, [])];
    scoreTurns(turns, 1, resolveCredit({ turn_rewards: { format: 0.1, tool: 0.2, outcome: 1 }, gamma: 0.5 }), 0);
    // the legacy format weight is the component's value on a well-formed turn
    expect(turns.map((t) => t.rewards)).toEqual([
      { format: 0.1, tool: 0.5, outcome: 0, shaping: 0 },
      { format: 0, tool: 0, outcome: 0, shaping: 0 },
      { format: 0.1, tool: 1, outcome: 1, shaping: 0 },
    ]);
    // rewards: 0.1 + 0.1 = 0.2; 0; 0.1 + 0.2 + 1 = 1.3
    expect(turns[2]!.reward).toBeCloseTo(1.3);
    expect(turns[2]!.return).toBeCloseTo(1.3);
    expect(turns[1]!.return).toBeCloseTo(0 + 0.5 * 1.3);
    expect(turns[0]!.return).toBeCloseTo(0.2 + 0.5 * 0.65);
  });

  it('gives only the outcome with the default weights', () => {
    const turns = [turn(0, ['ok']), turn(1, [])];
    scoreTurns(turns, 0.75, resolveCredit({ turn_rewards: { format: 0, tool: 0, outcome: 1 }, gamma: 1 }), 0);
    expect(turns.map((t) => t.status)).toEqual(['ok', 'none']);
    expect(turns.map((t) => t.return)).toEqual([0.75, 0.75]);
    expect(turns.map((t) => t.reward)).toEqual([0, 0.75]);
  });
});

describe('group normalisation', () => {
  const result = (reward: number, filter = false): RolloutResult =>
    ({ reward, filter, advantage: null, turns: [{ ...turn(0, []), return: reward }] }) as unknown as RolloutResult;

  it('normalises rewards and returns over the group, leaving filtered samples out', () => {
    const group = [result(1), result(0), result(1), result(0), result(0, true)];
    normalizeAdvantages(group, 'group');
    expect(group[0]!.advantage).toBeCloseTo(1, 4);
    expect(group[1]!.advantage).toBeCloseTo(-1, 4);
    expect(group[4]!.advantage).toBeNull();
    expect(group[0]!.turns[0]!.normalized_return).toBeCloseTo(1, 4);
  });

  it('leaves a single sample alone', () => {
    const group = [result(1)];
    normalizeAdvantages(group, 'group');
    expect(group[0]!.advantage).toBeNull();
  });
});
