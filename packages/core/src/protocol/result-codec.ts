import { isLegacyResult, toCurrentResult, withWeightFields } from './legacy-result.ts';
import type { RolloutResult, TurnRecord } from './rollout.ts';

// How a result is stored, and sent by a node: with each token id once. A turn's prompt is the
// conversation so far, so a result holds the conversation once per turn, and its NeMo Gym
// `response` repeats every turn's ids on its output items: a 20-turn rollout with contexts to 26k
// tokens is 3.2 MB of JSON (`pnpm bench rollouts`), 0.36 MB with each id once, and writing it
// whole was the service's largest cost per turn. Stored, a turn's prompt is the part of the
// previous turn's prompt it starts with (a length) and the ids after it; a response item's ids
// name the turn that has them. Reading gives back the result as it was (JSON-equal).
//
// Versions: 2 is today's (snake_case results). 1 is the same encoding of the camelCase results
// of rollserve before issue 24, and bodies without the ENCODING key are results whole, in either
// form: both of those are read into today's form (see legacy-result.ts).

const ENCODING = '$tokens';
const VERSION = 2;

/** A prompt stored as the first `keep` ids of the previous turn's prompt, then `add`. */
export interface PromptDelta {
  keep: number;
  add: number[];
}

/** A response item's ids, stored as the turn that has the same ones. */
interface TurnRef {
  $turn: number;
}

/** A response item's id fields (NeMo Gym's names) and the turn's fields with the same ids. */
const RESPONSE_FIELDS = [
  ['prompt_token_ids', 'prompt_token_ids'],
  ['generation_token_ids', 'generation_token_ids'],
  ['generation_log_probs', 'generation_logprobs'],
] as const;

/** The turn's field names in version 1 (camelCase results). */
const LEGACY_TURN_FIELDS: Record<(typeof RESPONSE_FIELDS)[number][1], string> = {
  prompt_token_ids: 'promptTokenIds',
  generation_token_ids: 'generationTokenIds',
  generation_logprobs: 'generationLogprobs',
};

function sameNumbers(a: readonly number[], b: readonly number[]): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** `prompt` as the part of `previous` it starts with and the ids after it; null when they share no prefix (or either is missing). */
export function promptDelta(previous: readonly number[] | null | undefined, prompt: readonly number[] | null): PromptDelta | null {
  const keep = prompt && previous ? commonPrefix(previous, prompt) : 0;
  return keep > 0 ? { keep, add: prompt!.slice(keep) } : null;
}

/** A prompt whole again from the previous prompt and its delta. */
export const fromDelta = (previous: readonly number[], delta: PromptDelta): number[] => previous.slice(0, delta.keep).concat(delta.add);

/** The turn (from `from` on) whose ids of this kind are the same as `ids`, else -1. */
function turnWith(turns: readonly TurnRecord[], field: 'prompt_token_ids' | 'generation_token_ids' | 'generation_logprobs', ids: readonly number[], from: number): number {
  for (let k = from; k < turns.length; k++) {
    const own = turns[k]![field];
    if (own && sameNumbers(own, ids)) return k;
  }
  return -1;
}

/** The form a result is stored in (serialise it with JSON.stringify). */
export function encodeResult(result: RolloutResult): unknown {
  const turns = result.turns;
  if (turns.length === 0) return result;
  const storedTurns = turns.map((turn, t) => {
    const delta = promptDelta(turns[t - 1]?.prompt_token_ids, turn.prompt_token_ids);
    return delta ? { ...turn, prompt_token_ids: delta } : turn;
  });
  let response = result.response;
  const output = (response as { output?: unknown } | null)?.output;
  if (Array.isArray(output)) {
    let cursor = 0;
    const storedOutput = output.map((item: Record<string, unknown>) => {
      if (item === null || typeof item !== 'object' || !Array.isArray(item.prompt_token_ids)) return item;
      const k = turnWith(turns, 'prompt_token_ids', item.prompt_token_ids as number[], cursor);
      if (k < 0) return item;
      cursor = k;
      const stored: Record<string, unknown> = { ...item };
      for (const [wire, own] of RESPONSE_FIELDS) {
        const ids = item[wire];
        const mine = turns[k]![own];
        if (Array.isArray(ids) && mine && sameNumbers(mine, ids as number[])) stored[wire] = { $turn: k } satisfies TurnRef;
      }
      return stored;
    });
    response = { ...response, output: storedOutput };
  }
  return { ...result, turns: storedTurns, response, [ENCODING]: VERSION };
}

const isRef = (value: unknown): value is TurnRef => typeof value === 'object' && value !== null && !Array.isArray(value) && '$turn' in value;

const isObject = (value: unknown): value is Record<string, unknown> => typeof value === 'object' && value !== null && !Array.isArray(value);

/**
 * A result as it was committed, from its stored (or sent) form, freshly parsed (it is completed in
 * place). A value without the encoding's key is given back as it is (in today's form); a
 * malformed encoding fails with an Error saying where (in the names of its version).
 */
export function decodeResult(stored: unknown): RolloutResult {
  if (!isObject(stored) || stored[ENCODING] === undefined) return isLegacyResult(stored) ? toCurrentResult(stored) : withWeightFields(stored as RolloutResult);
  const version = stored[ENCODING];
  if (version !== VERSION && version !== 1) throw new Error(`token encoding ${JSON.stringify(version)} is not one this version of rollserve reads (1, ${VERSION})`);
  const field = (own: (typeof RESPONSE_FIELDS)[number][1]) => (version === 1 ? LEGACY_TURN_FIELDS[own] : own);
  const promptField = field('prompt_token_ids');
  const { [ENCODING]: _version, ...result } = stored;
  const turns = result.turns;
  if (!Array.isArray(turns)) throw new Error('turns: expected an array');
  let previous: unknown = null;
  turns.forEach((turn: unknown, t) => {
    if (!isObject(turn)) throw new Error(`turns[${t}]: expected an object`);
    const prompt = turn[promptField];
    if (isObject(prompt)) {
      const { keep, add } = prompt as Partial<PromptDelta>;
      if (!Array.isArray(previous) || !Number.isInteger(keep) || keep! < 0 || keep! > previous.length || !Array.isArray(add)) {
        throw new Error(`turns[${t}].${promptField}: expected {keep, add} with keep at most the previous prompt's length and add an array`);
      }
      turn[promptField] = fromDelta(previous, { keep: keep!, add });
    }
    previous = turn[promptField];
  });
  const output = isObject(result.response) ? result.response.output : undefined;
  if (Array.isArray(output)) {
    output.forEach((item: unknown, i) => {
      if (!isObject(item)) return;
      for (const [wire, own] of RESPONSE_FIELDS) {
        const value = item[wire];
        if (!isRef(value)) continue;
        const k = value.$turn;
        if (!Number.isInteger(k) || (k as number) < 0 || (k as number) >= turns.length) throw new Error(`response.output[${i}].${wire}: no turn ${JSON.stringify(k)}`);
        item[wire] = (turns[k as number] as Record<string, unknown>)[field(own)];
      }
    });
  }
  return version === 1 ? toCurrentResult(result) : withWeightFields(result as unknown as RolloutResult);
}
