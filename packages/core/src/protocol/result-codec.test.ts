import { describe, expect, it } from 'vitest';
import { buildResponse } from '../runner/messages.ts';
import type { RolloutResult, TurnRecord } from './rollout.ts';
import { decodeResult, encodeResult } from './result-codec.ts';

const ids = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (i * 7919 + seed * 104729) % 151_000);

function turn(index: number, promptTokenIds: number[] | null, generationTokenIds: number[] | null, extra: Partial<TurnRecord> = {}): TurnRecord {
  return {
    index,
    promptTokenIds,
    generationTokenIds,
    generationLogprobs: generationTokenIds && generationTokenIds.map((id) => -((id % 97) / 10)),
    finishReason: 'tool_calls',
    text: `turn ${index}`,
    reasoning: null,
    toolCalls: [{ id: `call_${index}`, name: 'read', arguments: '{"path":"a"}', output: 'x'.repeat(50), status: 'ok', durationMs: 1, execution: null, code: null }],
    llmLatencyMs: 3,
    backend: 'b1',
    code: null,
    status: 'ok',
    malformed: null,
    rewards: { format: null, tool: null, outcome: null, shaping: null },
    reward: 0,
    return: 0,
    normalizedReturn: null,
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
    id: 'r1', taskId: 't1', sampleIndex: 0, env: 'swe', state: 'done', reward: 1, rewardComponents: null, verifyExtras: {}, criticalError: null,
    filter: false, error: null, advantage: null, credit: null,
    timing: { init: { queuedMs: 0, activeMs: 1 }, run: { queuedMs: 0, activeMs: 2 }, eval: { queuedMs: 0, activeMs: 3 }, totalMs: 6 },
    response: null, messages: [{ role: 'user', content: 'fix it' }], turns, finishedAt: '2026-01-01T00:00:00.000Z',
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
    expect(items[5]!.prompt_token_ids).toBe(decoded.turns[5]!.promptTokenIds);
  });

  it('keep a prompt that differs from the last one inside it (re-tokenisation drift), prompts without ids, and turns of their own', () => {
    const drifted = multiTurn(6, { drift: true });
    expect(roundTrip(drifted)).toEqual(plain(drifted));
    const holes = multiTurn(5);
    holes.turns[1]!.promptTokenIds = null;
    holes.turns[2]!.generationTokenIds = null;
    holes.turns[2]!.generationLogprobs = null;
    holes.turns[3]!.promptTokenIds = [];
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
    expect(() => decodeResult({ ...(encodeResult(old) as object), $tokens: 2 })).toThrow(/token encoding 2/);
  });
});
