import { describe, expect, it } from 'vitest';
import { buildResponse } from '../runner/messages.ts';
import type { RolloutResult, TurnRecord } from './rollout.ts';
import { toCurrentResult, toLegacyResult } from './legacy-result.ts';
import { decodeResult, encodeResult } from './result-codec.ts';

const ids = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (i * 7919 + seed * 104729) % 151_000);

function turn(index: number, prompt_token_ids: number[] | null, generation_token_ids: number[] | null, extra: Partial<TurnRecord> = {}): TurnRecord {
  return {
    index,
    prompt_token_ids,
    generation_token_ids,
    generation_logprobs: generation_token_ids && generation_token_ids.map((id) => -((id % 97) / 10)),
    finish_reason: 'tool_calls',
    text: `turn ${index}`,
    reasoning: null,
    tool_calls: [{ id: `call_${index}`, name: 'read', arguments: '{"path":"a"}', output: 'x'.repeat(50), status: 'ok', execution: { exit_code: 0, timed_out: false, exception: null }, code: null, duration_ms: 1 }],
    llm_latency_ms: 3,
    backend: 'b1',
    weight_version: null,
    code: null,
    status: 'ok',
    malformed: null,
    rewards: { format: null, tool: null, outcome: null, shaping: null },
    reward: 0,
    return: 0,
    normalized_return: null,
    ...extra,
  };
}

/** A result the way the agent loop makes one: each prompt is the last prompt, its generation and a tool's output. */
function multiTurn(turnCount: number, { drift = false }: { drift?: boolean } = {}): RolloutResult {
  const turns: TurnRecord[] = [];
  let prompt = ids(300, 1);
  for (let t = 0; t < turnCount; t++) {
    const generation = ids(40 + t, t + 2);
    turns.push(turn(t, prompt, generation));
    // the next prompt: this one, the generation, then the tool's output (re-tokenised differently in the middle with drift)
    const next = [...prompt, ...generation, ...ids(200, t + 50)];
    if (drift && t === 2) next[150] = 7;
    prompt = next;
  }
  const result: RolloutResult = {
    id: 'r1', task_id: 't1', sample_index: 0, env: 'swe', state: 'done', reward: 1, reward_components: null, verify_extras: {}, critical_error: null,
    filter: false, error: null, advantage: null, credit: null,
    timing: { init: { queued_ms: 0, active_ms: 1 }, run: { queued_ms: 0, active_ms: 2 }, eval: { queued_ms: 0, active_ms: 3 }, total_ms: 6 },
    response: null, messages: [{ role: 'user', content: 'fix it' }], turns, weight_version_min: null, weight_version_max: null, stale: false, finished_at: '2026-01-01T00:00:00.000Z',
  };
  result.response = buildResponse({ id: 'r1', model: 'm', turns, tools: [], usage: { input: 1, output: 2 } });
  return result;
}

/** Through the store's serialisation and back. */
const roundTrip = (result: RolloutResult) => decodeResult(JSON.parse(JSON.stringify(encodeResult(result))));
const plain = (value: unknown) => JSON.parse(JSON.stringify(value)) as unknown;

describe('stored results', () => {
  it('give back what was stored, with each token id written once', () => {
    const result = multiTurn(20);
    expect(roundTrip(result)).toEqual(plain(result));
    const full = JSON.stringify(result).length;
    const stored = JSON.stringify(encodeResult(result)).length;
    // the ids of 20 prompts and their 20 copies in the response, against each id once
    expect(stored).toBeLessThan(full / 8);
    const decoded = roundTrip(result);
    // the response's ids are the turn's own again, as the agent loop made them
    const items = (decoded.response as { output: Array<Record<string, unknown>> }).output.filter((item) => item.prompt_token_ids);
    expect(items).toHaveLength(20);
    expect(items[5]!.prompt_token_ids).toBe(decoded.turns[5]!.prompt_token_ids);
  });

  it('keep a prompt that differs from the last one inside it (re-tokenisation drift), prompts without ids, and turns of their own', () => {
    const drifted = multiTurn(6, { drift: true });
    expect(roundTrip(drifted)).toEqual(plain(drifted));
    const holes = multiTurn(5);
    holes.turns[1]!.prompt_token_ids = null;
    holes.turns[2]!.generation_token_ids = null;
    holes.turns[2]!.generation_logprobs = null;
    holes.turns[3]!.prompt_token_ids = [];
    holes.response = buildResponse({ id: 'r1', model: 'm', turns: holes.turns, tools: [], usage: { input: 1, output: 2 } });
    expect(roundTrip(holes)).toEqual(plain(holes));
    // a response whose ids are not any turn's (edited, or from elsewhere) is kept as it is
    const edited = multiTurn(4);
    const item = (edited.response as { output: Array<Record<string, unknown>> }).output.find((i) => i.generation_token_ids)!;
    item.generation_token_ids = [1, 2, 3];
    item.prompt_token_ids = [...(item.prompt_token_ids as number[]), 9];
    expect(roundTrip(edited)).toEqual(plain(edited));
  });

  it('read results stored before the encoding as they are, and refuse an encoding they do not know', () => {
    const old = multiTurn(3);
    expect(decodeResult(plain(old))).toEqual(plain(old));
    const noTurns = { ...multiTurn(1), turns: [], response: null };
    expect(roundTrip(noTurns)).toEqual(plain(noTurns));
    expect(encodeResult(old)).toMatchObject({ $tokens: 2 });
    expect(() => decodeResult({ ...(encodeResult(old) as object), $tokens: 3 })).toThrow(/token encoding 3/);
  });
});

// Results as rollserve before issue 24 stored them (and its nodes commit them): camelCase inside,
// written out by hand as a database of then holds them, keys in the order its runner made them.
const oldTurns = () => [
  {
    index: 0, promptTokenIds: [1, 2, 3], generationTokenIds: [4, 5], generationLogprobs: [-0.5, -0.25], finishReason: 'tool_calls', text: 'look first', reasoning: null,
    toolCalls: [{ id: 'c0', name: 'bash', arguments: '{"command":"ls"}', output: 'a.txt', status: 'ok', execution: { exitCode: 0, timedOut: false, exception: null }, code: 'ls', durationMs: 12 }],
    llmLatencyMs: 30, backend: 'b1', code: 'ls', status: 'ok', malformed: null, rewards: { format: 0, tool: 1, outcome: 0, shaping: 0 }, reward: 0, return: 0.9, normalizedReturn: 0.5,
  },
  {
    index: 1, promptTokenIds: [1, 2, 3, 4, 5, 6, 7], generationTokenIds: [8], generationLogprobs: [-1], finishReason: 'stop', text: '\\boxed{1}', reasoning: 'so',
    toolCalls: [], llmLatencyMs: 20, backend: 'b1', code: null, status: 'none', malformed: null, rewards: { format: 0, tool: 1, outcome: 1, shaping: 0 }, reward: 1, return: 1, normalizedReturn: null,
  },
];
const oldItems = () => [
  { type: 'function_call', call_id: 'c0', name: 'bash', arguments: '{"command":"ls"}', prompt_token_ids: [1, 2, 3], generation_token_ids: [4, 5], generation_log_probs: [-0.5, -0.25] },
  { type: 'function_call_output', call_id: 'c0', output: 'a.txt' },
  { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: '\\boxed{1}' }], prompt_token_ids: [1, 2, 3, 4, 5, 6, 7], generation_token_ids: [8], generation_log_probs: [-1] },
];
const credit = { gamma: 0.9, normalize: 'group', components: { format: { weight: 1, params: { penalty: 0.1, bonus: 0 } } }, shaping: null, stats: null, error: null };
const oldResult = () => ({
  id: 'old:0', taskId: 'old', sampleIndex: 0, env: 'math', state: 'done', reward: 1, rewardComponents: { accuracy: 1 }, verifyExtras: { extractedAnswer: '1' }, criticalError: null,
  error: null, response: { id: 'resp_old:0', output: oldItems() }, messages: [{ role: 'user', content: 'one?' }], turns: oldTurns(),
  filter: false, advantage: 0.5, credit, timing: { init: { queuedMs: 1, activeMs: 2 }, run: { queuedMs: 3, activeMs: 4 }, eval: { queuedMs: 5, activeMs: 6 }, totalMs: 21 },
  metadata: { sourceRow: 7 }, finishedAt: '2026-01-01T00:00:00.000Z',
});

/** The same result today: snake_case rollserve keys in the schema's order; user data (verify extras, response, metadata, credit) as it was. */
const todays = {
  id: 'old:0', task_id: 'old', sample_index: 0, env: 'math', state: 'done', reward: 1, reward_components: { accuracy: 1 }, verify_extras: { extractedAnswer: '1' }, critical_error: null,
  filter: false, error: null, advantage: 0.5, credit,
  timing: { init: { queued_ms: 1, active_ms: 2 }, run: { queued_ms: 3, active_ms: 4 }, eval: { queued_ms: 5, active_ms: 6 }, total_ms: 21 },
  response: { id: 'resp_old:0', output: oldItems() }, messages: [{ role: 'user', content: 'one?' }],
  turns: [
    {
      index: 0, prompt_token_ids: [1, 2, 3], generation_token_ids: [4, 5], generation_logprobs: [-0.5, -0.25], finish_reason: 'tool_calls', text: 'look first', reasoning: null,
      tool_calls: [{ id: 'c0', name: 'bash', arguments: '{"command":"ls"}', output: 'a.txt', status: 'ok', execution: { exit_code: 0, timed_out: false, exception: null }, code: 'ls', duration_ms: 12 }],
      llm_latency_ms: 30, backend: 'b1', weight_version: null, code: 'ls', status: 'ok', malformed: null, rewards: { format: 0, tool: 1, outcome: 0, shaping: 0 }, reward: 0, return: 0.9, normalized_return: 0.5,
    },
    {
      index: 1, prompt_token_ids: [1, 2, 3, 4, 5, 6, 7], generation_token_ids: [8], generation_logprobs: [-1], finish_reason: 'stop', text: '\\boxed{1}', reasoning: 'so',
      tool_calls: [], llm_latency_ms: 20, backend: 'b1', weight_version: null, code: null, status: 'none', malformed: null, rewards: { format: 0, tool: 1, outcome: 1, shaping: 0 }, reward: 1, return: 1, normalized_return: null,
    },
  ],
  // (from before weight versions: null, not stale)
  weight_version_min: null, weight_version_max: null, stale: false,
  metadata: { sourceRow: 7 },
  finished_at: '2026-01-01T00:00:00.000Z',
};

describe('results stored by rollserve before issue 24 (camelCase)', () => {
  it('read back in today\'s form, keys in the order the API sends them, from a body stored whole', () => {
    // (JSON text compared: the keys' order counts)
    expect(JSON.stringify(decodeResult(plain(oldResult())))).toBe(JSON.stringify(todays));
    // keys rollserve does not know were never sent: they go
    const extra = oldResult();
    (extra.turns[0] as Record<string, unknown>).scratch = 1;
    expect(JSON.stringify(decodeResult(plain({ ...extra, internalOnly: true })))).toBe(JSON.stringify(todays));
  });

  it('read back in today\'s form from a body stored with each token id once ($tokens: 1)', () => {
    const stored = oldResult() as Record<string, unknown>;
    const turns = stored.turns as Array<Record<string, unknown>>;
    turns[1]!.promptTokenIds = { keep: 3, add: [4, 5, 6, 7] };
    const output = (stored.response as { output: Array<Record<string, unknown>> }).output;
    Object.assign(output[0]!, { prompt_token_ids: { $turn: 0 }, generation_token_ids: { $turn: 0 }, generation_log_probs: { $turn: 0 } });
    Object.assign(output[2]!, { prompt_token_ids: { $turn: 1 }, generation_token_ids: { $turn: 1 }, generation_log_probs: { $turn: 1 } });
    stored.$tokens = 1;
    expect(JSON.stringify(decodeResult(plain(stored)))).toBe(JSON.stringify(todays));
    // a malformed one is named in its own version's terms
    turns[1]!.promptTokenIds = { keep: 99, add: [] };
    expect(() => decodeResult(plain(stored))).toThrow(/turns\[1\]\.promptTokenIds/);
  });

  it('are written in that form for an older service, and that form reads back as it was', () => {
    const result = plain(todays) as RolloutResult;
    expect(toLegacyResult(result)).toEqual(plain(oldResult()));
    expect(JSON.stringify(toCurrentResult(toLegacyResult(result)))).toBe(JSON.stringify(todays));
    const current = multiTurn(4);
    expect(decodeResult(plain(toLegacyResult(current)))).toEqual(plain(current));
  });
});
