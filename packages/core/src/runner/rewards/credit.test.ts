import { describe, expect, it } from 'vitest';
import { CreditConfig, type CreditSettings, type RolloutResult, type ToolCallRecord, type TurnRecord } from '../../protocol/rollout.ts';
import { assignSampleCredit } from './assign.ts';
import { assignGroupCredit } from './group.ts';
import { resolveCredit } from './settings.ts';
import type { CodeSimilarity } from './similarity.ts';

// Hand-computed groups. Defaults: γ = 0.9, format penalty 0.1, weights format 1 / tool 0 /
// outcome 1 / shaping 1, α = 0.5, lexical similarity (cosine of token 1- and 2-gram counts).

type Call = { name?: string; status?: ToolCallRecord['status']; code?: string | null };

function turn(index: number, calls: Call[] = [], text: string | null = null): TurnRecord {
  return {
    index,
    prompt_token_ids: null,
    generation_token_ids: null,
    weight_version: null,
    generation_logprobs: null,
    finish_reason: 'stop',
    text,
    reasoning: null,
    tool_calls: calls.map((c, i) => ({
      id: `c${i}`,
      name: c.name ?? 'bash',
      arguments: '{}',
      output: '',
      status: c.status ?? 'ok',
      execution: null,
      code: c.code ?? null,
      duration_ms: 1,
    })),
    llm_latency_ms: 1,
    backend: null,
    code: calls.some((c) => c.code) ? calls.flatMap((c) => (c.code ? [c.code] : [])).join('\n') : null,
    status: 'none',
    malformed: null,
    rewards: { format: null, tool: null, outcome: null, shaping: null },
    reward: 0,
    return: 0,
    normalized_return: null,
  };
}

function result(id: string, reward: number, turns: TurnRecord[], filter = false): RolloutResult {
  return { id, task_id: 't', sample_index: 0, reward, filter, advantage: null, credit: null, turns } as unknown as RolloutResult;
}

/** A trajectory that ran `code` with bash, then answered. */
const ranThenAnswered = (id: string, reward: number, code: string) => result(id, reward, [turn(0, [{ code }]), turn(1, [], 'the answer')]);

async function credit(group: RolloutResult[], settings: CreditSettings = CreditConfig.parse({}), similarity?: CodeSimilarity): Promise<void> {
  for (const r of group) assignSampleCredit(r, settings, group.length);
  await assignGroupCredit(group, settings, ...(similarity ? [similarity] : []));
}

const returns = (r: RolloutResult) => r.turns.map((t) => t.return);
const advantages = (r: RolloutResult) => r.turns.map((t) => t.normalized_return);

describe('turn rewards and returns', () => {
  it('penalises each malformed turn by 0.1 and discounts returns by 0.9', async () => {
    const r = result('m', 1, [
      turn(0, [{ status: 'invalid_arguments', code: null }]), // arguments not JSON / not fitting the schema
      turn(1), // neither a tool call nor an answer, not the last turn
      turn(2, [], 'let me try <tool_call>{"name": "bash", "arguments": {'), // a tool call the parser could not read
      turn(3, [{ name: 'nope', status: 'unknown_tool' }]),
      turn(4, [], 'the answer'),
    ]);
    await credit([r]);
    expect(r.turns.map((t) => t.status)).toEqual(['malformed', 'malformed', 'malformed', 'malformed', 'none']);
    expect(r.turns.map((t) => t.malformed)).toEqual([
      'invalid arguments for "bash"',
      'no tool call and no answer',
      'a tool call that is not valid JSON',
      'unknown tool "nope"',
      null,
    ]);
    expect(r.turns.map((t) => t.rewards.format)).toEqual([-0.1, -0.1, -0.1, -0.1, 0]);
    expect(r.turns.map((t) => t.rewards.outcome)).toEqual([0, 0, 0, 0, 1]);
    // r = [-0.1, -0.1, -0.1, -0.1, 1]
    // G4 = 1; G3 = -0.1 + 0.9·1 = 0.8; G2 = -0.1 + 0.9·0.8 = 0.62; G1 = -0.1 + 0.9·0.62 = 0.458;
    // G0 = -0.1 + 0.9·0.458 = 0.3122
    const expected = [0.3122, 0.458, 0.62, 0.8, 1];
    returns(r).forEach((g, i) => expect(g).toBeCloseTo(expected[i]!, 10));
    // a group of one: no advantages
    expect(advantages(r)).toEqual([null, null, null, null, null]);
    expect(r.credit!.components).toMatchObject({ format: { weight: 1, params: { penalty: 0.1, bonus: 0 } }, tool: { weight: 0 }, shaping: { params: { alpha: 0.5, similarity: 'lexical' } } });
  });

  it('keeps the tool component, weighted 0 by default, and structured statuses', async () => {
    const r = result('t', 0, [turn(0, [{ status: 'ok' }, { status: 'error' }]), turn(1, [{ status: 'timeout' }]), turn(2, [], 'done')]);
    await credit([r]);
    expect(r.turns.map((t) => t.rewards.tool)).toEqual([0.5, 0, 1]);
    expect(r.turns.map((t) => t.status)).toEqual(['error', 'timeout', 'none']);
    expect(r.turns.map((t) => t.reward)).toEqual([0, 0, 0]);
  });
});

describe('group credit (GTPO)', () => {
  it('all fail: no shaping, every return 0, every advantage 0', async () => {
    const group = [ranThenAnswered('a', 0, 'x = 1'), ranThenAnswered('b', 0, 'y = 2')];
    await credit(group);
    for (const r of group) {
      expect(r.credit!.shaping).toEqual({ value: 0, similarity: null, successes: 0 });
      expect(r.turns.map((t) => t.rewards.shaping)).toEqual([0, 0]);
      expect(returns(r)).toEqual([0, 0]);
      // mean 0, std 0: (0 - 0) / (0 + 1e-6) = 0
      expect(advantages(r)).toEqual([0, 0]);
      expect(r.advantage).toBe(0);
    }
  });

  it('all pass: no shaping; advantages pooled over every turn, or per turn index', async () => {
    const build = () => [ranThenAnswered('a', 1, 'x = 1'), result('b', 1, [turn(0, [], 'the answer')])];
    const pooled = build();
    await credit(pooled);
    // a: r = [0, 1], G = [0.9, 1]; b: G = [1]. Pooled: mean 2.9/3 = 0.96667,
    // var = (0.0666…² + 2·0.0333…²)/3 = 0.0022222, std = 0.0471405:
    // (0.9 - 0.96667)/0.0471405 = -√2, (1 - 0.96667)/0.0471405 = 1/√2.
    expect(returns(pooled[0]!)).toEqual([0.9, 1]);
    expect(pooled[0]!.turns[0]!.normalized_return).toBeCloseTo(-Math.SQRT2, 4);
    expect(pooled[0]!.turns[1]!.normalized_return).toBeCloseTo(Math.SQRT1_2, 4);
    expect(pooled[1]!.turns[0]!.normalized_return).toBeCloseTo(Math.SQRT1_2, 4);
    expect(pooled[0]!.credit!.shaping).toEqual({ value: 0, similarity: null, successes: 2 });
    expect(pooled[0]!.credit!.stats).toHaveLength(1);

    const perTurn = build();
    await credit(perTurn, CreditConfig.parse({ normalize: 'turn' }));
    // turn 0: [0.9, 1], mean 0.95, std 0.05 → -1, +1; turn 1: [1] alone → 0
    expect(perTurn[0]!.turns[0]!.normalized_return).toBeCloseTo(-1, 4);
    expect(perTurn[1]!.turns[0]!.normalized_return).toBeCloseTo(1, 4);
    expect(perTurn[0]!.turns[1]!.normalized_return).toBe(0);
    expect(perTurn[0]!.credit!.stats!.map((s) => s.turn)).toEqual([0, 1]);
  });

  it('mixed: shaping only on failures, from the lexical similarity of their code to the successes', async () => {
    const s = ranThenAnswered('s', 1, 'x = 1');
    const f1 = ranThenAnswered('f1', 0, 'x = 1');
    const f2 = ranThenAnswered('f2', 0, 'y = 2');
    const group = [s, f1, f2];
    await credit(group);
    // "x = 1": 1-grams x, =, 1 and 2-grams "x =", "= 1"; "y = 2" shares only the 1-gram "=":
    // cos(x = 1, x = 1) = 1; cos(y = 2, x = 1) = 1/(√5·√5) = 0.2.
    expect(s.credit!.shaping).toEqual({ value: 0, similarity: null, successes: 1 });
    expect(f1.credit!.shaping).toEqual({ value: expect.closeTo(0.5, 10), similarity: expect.closeTo(1, 10), successes: 1 });
    expect(f2.credit!.shaping!.similarity).toBeCloseTo(0.2, 10);
    expect(f2.credit!.shaping!.value).toBeCloseTo(0.1, 10);
    // shaping is the last turn's
    expect(f1.turns.map((t) => t.rewards.shaping)).toEqual([0, expect.closeTo(0.5, 10)]);
    expect(s.turns.map((t) => t.rewards.shaping)).toEqual([0, 0]);
    // returns: s [0.9, 1], f1 [0.45, 0.5], f2 [0.09, 0.1]
    expect(returns(s)).toEqual([0.9, 1]);
    expect(returns(f1)).toEqual([expect.closeTo(0.45, 10), expect.closeTo(0.5, 10)]);
    returns(f2).forEach((g, i) => expect(g).toBeCloseTo([0.09, 0.1][i]!, 10));
    // pooled over 6 turns: mean 3.04/6 = 0.506667; squared deviations 0.154711 + 0.243378 +
    // 0.003211 + 0.000044 + 0.173611 + 0.165378 = 0.740333, /6 = 0.123389, std = 0.351268
    const expected = [
      [1.11975, 1.40444],
      [-0.16132, -0.01898],
      [-1.18618, -1.15771],
    ];
    group.forEach((r, k) => advantages(r).forEach((a, t) => expect(a).toBeCloseTo(expected[k]![t]!, 4)));
    // GRPO sample advantage over [1, 0, 0]: mean 1/3, std √(2/9) = 0.471405
    expect(s.advantage).toBeCloseTo(Math.SQRT2, 4);
    expect(f1.advantage).toBeCloseTo(-Math.SQRT1_2, 4);
  });

  it('leaves filtered (infrastructure-failed) samples out of shaping and of the statistics', async () => {
    const oneTurn = (id: string, reward: number, filter = false) => result(id, reward, [turn(0, [{ code: 'echo hi' }])], filter);
    const s = oneTurn('s', 1);
    const f = oneTurn('f', 0);
    const x = oneTurn('x', 0, true);
    await credit([s, f, x]);
    // f's code is s's: similarity 1, shaping 0.5. Kept returns: s 1, f 0.5 → mean 0.75, std 0.25.
    // (With x's 0 they would be mean 0.5, std 0.408.)
    expect(f.credit!.shaping!.value).toBeCloseTo(0.5, 10);
    expect(x.credit!.shaping).toEqual({ value: 0, similarity: null, successes: 1 });
    expect(s.turns[0]!.normalized_return).toBeCloseTo(1, 4);
    expect(f.turns[0]!.normalized_return).toBeCloseTo(-1, 4);
    expect(x.turns[0]!.normalized_return).toBeNull();
    expect(x.advantage).toBeNull();
    expect(s.credit!.stats).toEqual([{ turn: null, count: 2, mean: expect.closeTo(0.75, 10), std: expect.closeTo(0.25, 10) }]);
  });

  it('gives a group of one the shaping its turns say: 0, with its own success counted (issue 27: it said null)', async () => {
    const alone = ranThenAnswered('a', 1, 'x = 1');
    const failed = ranThenAnswered('b', 0, 'x = 1');
    for (const r of [alone, failed]) assignSampleCredit(r, CreditConfig.parse({}), 1);
    expect(alone.credit!.shaping).toEqual({ value: 0, similarity: null, successes: 1 });
    expect(failed.credit!.shaping).toEqual({ value: 0, similarity: null, successes: 0 });
    expect(failed.turns.at(-1)!.rewards.shaping).toBe(0);
  });

  it('records a clear error and gives no advantages when the similarity fails', async () => {
    const down: CodeSimilarity = {
      matrix: () => Promise.reject(new Error('embeddings endpoint http://127.0.0.1:9/v1/embeddings: unreachable (ECONNREFUSED)')),
    };
    const s = ranThenAnswered('s', 1, 'x = 1');
    const f = ranThenAnswered('f', 0, 'x = 1');
    await credit([s, f], CreditConfig.parse({}), down);
    for (const r of [s, f]) {
      expect(r.credit!.error).toMatch(/^shaping failed, so no advantages were computed: .*ECONNREFUSED/);
      expect(r.credit!.shaping).toBeNull();
      expect(advantages(r)).toEqual([null, null]);
    }
    // the failure's shaping is unknown, not 0
    expect(f.turns[1]!.rewards.shaping).toBeNull();
    // GRPO's sample advantage needs no shaping: ±1 over [1, 0]
    expect(s.advantage).toBeCloseTo(1, 4);
  });

  it('clamps a negative similarity to no shaping by default (a bonus, never a penalty); clamp: false keeps the sign', async () => {
    // embeddings can give a negative cosine; the lexical similarity cannot
    const opposed: CodeSimilarity = { matrix: async (failures, successes) => failures.map(() => successes.map(() => -0.6)) };
    const run = async (settings: CreditSettings) => {
      const s = ranThenAnswered('s', 1, 'x = 1');
      const f = ranThenAnswered('f', 0, 'y = 2');
      await credit([s, f], settings, opposed);
      return f;
    };
    const clamped = await run(CreditConfig.parse({}));
    expect(clamped.credit!.shaping).toEqual({ value: 0, similarity: expect.closeTo(-0.6, 10), successes: 1 });
    expect(clamped.turns.at(-1)!.rewards.shaping).toBe(0);
    expect(clamped.credit!.components.shaping).toMatchObject({ params: { clamp: true } });
    const signed = await run(CreditConfig.parse({ shaping: { clamp: false } }));
    expect(signed.credit!.shaping!.value).toBeCloseTo(-0.3, 10);
    expect(signed.turns.at(-1)!.rewards.shaping).toBeCloseTo(-0.3, 10);
    expect(signed.credit!.components.shaping).toMatchObject({ params: { clamp: false } });
    // a positive similarity is the same either way
    const alike: CodeSimilarity = { matrix: async (failures, successes) => failures.map(() => successes.map(() => 0.4)) };
    for (const clamp of [true, false]) {
      const s = ranThenAnswered('s', 1, 'x = 1');
      const f = ranThenAnswered('f', 0, 'x = 2');
      await credit([s, f], CreditConfig.parse({ shaping: { clamp } }), alike);
      expect(f.credit!.shaping!.value).toBeCloseTo(0.2, 10);
    }
  });
});

describe('credit settings', () => {
  it('maps the legacy gamma and turn_rewards, and takes GTPO defaults without either', () => {
    expect(resolveCredit({})).toMatchObject({ gamma: 0.9, format_penalty: 0.1, format_bonus: 0, normalize: 'group', shaping: { alpha: 0.5, similarity: 'lexical' } });
    expect(resolveCredit({ gamma: 0.5, turn_rewards: { format: 0.1, tool: 0.2, outcome: 1 } })).toMatchObject({
      gamma: 0.5,
      format_penalty: 0,
      format_bonus: 0.1,
      weights: { format: 1, tool: 0.2, outcome: 1 },
      shaping: { alpha: 0 },
    });
    expect(resolveCredit({ credit: CreditConfig.parse({ gamma: 0.5 }), gamma: 1 }).gamma).toBe(0.5);
  });

  it('refuses unknown fields', () => {
    expect(CreditConfig.safeParse({ gama: 0.9 }).success).toBe(false);
    expect(CreditConfig.safeParse({ shaping: { alpha: 0.5, similarty: 'lexical' } }).success).toBe(false);
    expect(CreditConfig.safeParse({ weights: { formatt: 1 } }).success).toBe(false);
    expect(CreditConfig.parse({ shaping: { similarity: { url: 'http://h:8000/v1', model: 'e5' } } }).shaping.similarity).toEqual({ url: 'http://h:8000/v1', model: 'e5', timeout_s: 30 });
  });
});
