import type { CreditRecord, RolloutResult, TurnRecord } from './rollout.ts';

/** One turn as a trainer reads it: where its generation sits in the response, what it did, its credit. */
export interface TrainingTurn {
  index: number;
  /**
   * [start, end) of the turn's generated tokens in `response_ids`; null without token ids. Under a
   * `max_response_tokens` cap it is clipped to the cap: a turn wholly past it has [cap, cap].
   */
  generation_span: [number, number] | null;
  /** Why the model stopped this turn's generation, as the backend said it ("stop", "length", "tool_calls"); null when unknown. */
  finish_reason: string | null;
  code: string | null;
  status: TurnRecord['status'];
  malformed: string | null;
  tool_calls: Array<{ name: string; status: string; execution: TurnRecord['tool_calls'][number]['execution'] }>;
  rewards: TurnRecord['rewards'];
  reward: number;
  return: number;
  /** The turn's advantage (its normalised return); null until the group is complete, or without one. */
  advantage: number | null;
  /** The weight version that generated the turn (its logprobs are that version's); null when none was announced. */
  weight_version: number | null;
}

/**
 * A rollout ready for a loss: the first prompt, then one response sequence where each turn's
 * generation (mask 1, its logprobs) is followed by the tool outputs and chat-template tokens that
 * the next turn's prompt added (mask 0, logprob 0). `response_turn` gives each token's turn: a
 * generated token's own, a context token the turn whose prompt it opens.
 */
export interface TrainingView {
  id: string;
  task_id: string;
  sample_index: number;
  reward: number;
  /** GRPO's sample advantage (n > 1). */
  advantage: number | null;
  /** Infrastructure failure: do not train on it. */
  filter: boolean;
  prompt_ids: number[] | null;
  response_ids: number[] | null;
  response_mask: number[] | null;
  response_logprobs: number[] | null;
  response_turn: number[] | null;
  /**
   * Why the sequence fields are null: a turn without token ids, or re-tokenisation drift (a turn's
   * prompt does not start with the previous prompt plus its generation).
   */
  sequence_error: string | null;
  /** The last turn's `finish_reason` ("length": the last generation hit `max_tokens`); null without turns. */
  finish_reason: string | null;
  /**
   * The response did not end where the model ended it: cut by the view's `max_response_tokens`, or
   * the last generation stopped on "length". What verl's overlong filtering and SkyRL's
   * `apply_overlong_filtering` (no EOS at the end) look for.
   */
  truncated: boolean;
  turns: TrainingTurn[];
  credit: CreditRecord | null;
  /** The oldest and newest weight version of its turns (null when none has one). */
  weight_version_min: number | null;
  weight_version_max: number | null;
  /** Judged stale by a staleness bound (its task's, or the stream's): too many versions behind the newest. */
  stale: boolean;
}

/** Whether `sequence` starts with `first` then `second` (compared in place: a copy of both per turn made the view quadratic in a rollout's length). */
function startsWith(sequence: readonly number[], first: readonly number[], second: readonly number[]): boolean {
  if (first.length + second.length > sequence.length) return false;
  for (let i = 0; i < first.length; i++) if (sequence[i] !== first[i]) return false;
  for (let i = 0; i < second.length; i++) if (sequence[first.length + i] !== second[i]) return false;
  return true;
}

/** How `sequence_error` begins when a turn's prompt was re-tokenised differently (chat mode). */
export const DRIFT_ERROR_PREFIX = 're-tokenisation drift';

/**
 * Whether a turn's prompt does not extend the previous turn's prompt and generation (what makes the
 * training view's `sequence_error` a drift), checked in place, for counting as results commit.
 */
export function hasDrift(result: Pick<RolloutResult, 'turns'>): boolean {
  const turns = result.turns;
  for (let t = 1; t < turns.length; t++) {
    const previous = turns[t - 1]!;
    const turn = turns[t]!;
    if (previous.prompt_token_ids === null || previous.generation_token_ids === null || turn.prompt_token_ids === null || turn.generation_token_ids === null) return false;
    if (!startsWith(turn.prompt_token_ids, previous.prompt_token_ids, previous.generation_token_ids)) return true;
  }
  return false;
}

export interface TrainingViewOptions {
  /**
   * Cuts the response sequence (ids, mask, logprobs, turns) to its first `maxResponseTokens` tokens
   * and marks the view `truncated` when it was longer (verl's `max_response_length`).
   */
  maxResponseTokens?: number;
  /** Zeroes the response mask of a `truncated` view (overlong filtering: SkyRL, DAPO). */
  maskTruncated?: boolean;
}

/** The training view of a finished rollout. */
export function trainingView(result: RolloutResult, options: TrainingViewOptions = {}): TrainingView {
  const turns = result.turns;
  const spans: Array<[number, number] | null> = turns.map(() => null);
  let sequenceError: string | null = null;
  let prompt: number[] | null = null;
  const ids: number[] = [];
  const mask: number[] = [];
  const logprobs: number[] = [];
  const turnOf: number[] = [];
  if (turns.length === 0) sequenceError = 'the rollout has no turns';
  for (const turn of turns) {
    if (sequenceError !== null) break;
    const promptIds = turn.prompt_token_ids;
    const generated = turn.generation_token_ids;
    if (promptIds === null || generated === null) {
      sequenceError = `turn ${turn.index} has no token ids (the policy did not return them)`;
      break;
    }
    if (prompt === null) {
      prompt = [...promptIds];
    } else {
      if (!startsWith(promptIds, prompt, ids)) {
        sequenceError = `${DRIFT_ERROR_PREFIX}: turn ${turn.index}'s prompt does not start with turn ${turn.index - 1}'s prompt and generation`;
        break;
      }
      for (const id of promptIds.slice(prompt.length + ids.length)) {
        ids.push(id);
        mask.push(0);
        logprobs.push(0);
        turnOf.push(turn.index);
      }
    }
    spans[turn.index] = [ids.length, ids.length + generated.length];
    generated.forEach((id, k) => {
      ids.push(id);
      mask.push(1);
      logprobs.push(turn.generation_logprobs?.[k] ?? 0);
      turnOf.push(turn.index);
    });
  }
  const ok = sequenceError === null;
  const cap = options.maxResponseTokens;
  // the cut applies to whatever sequence there is: without one only the last turn's finish reason can say
  const cut = ok && cap !== undefined && ids.length > cap;
  if (cut) {
    ids.length = cap;
    mask.length = cap;
    logprobs.length = cap;
    turnOf.length = cap;
    for (const [i, span] of spans.entries()) if (span) spans[i] = [Math.min(span[0], cap), Math.min(span[1], cap)];
  }
  const finishReason = turns.at(-1)?.finish_reason ?? null;
  const truncated = cut || finishReason === 'length';
  if (truncated && options.maskTruncated) mask.fill(0);
  return {
    id: result.id,
    task_id: result.task_id,
    sample_index: result.sample_index,
    reward: result.reward,
    advantage: result.advantage,
    filter: result.filter,
    prompt_ids: ok ? prompt : null,
    response_ids: ok ? ids : null,
    response_mask: ok ? mask : null,
    response_logprobs: ok ? logprobs : null,
    response_turn: ok ? turnOf : null,
    sequence_error: sequenceError,
    finish_reason: finishReason,
    truncated,
    turns: turns.map((turn, i) => ({
      index: turn.index,
      generation_span: ok ? spans[i]! : null,
      finish_reason: turn.finish_reason ?? null,
      code: turn.code ?? null,
      status: turn.status,
      malformed: turn.malformed ?? null,
      tool_calls: turn.tool_calls.map((c) => ({ name: c.name, status: c.status, execution: c.execution ?? null })),
      rewards: turn.rewards,
      reward: turn.reward,
      return: turn.return,
      advantage: turn.normalized_return,
      weight_version: turn.weight_version ?? null,
    })),
    credit: result.credit ?? null,
    weight_version_min: result.weight_version_min ?? null,
    weight_version_max: result.weight_version_max ?? null,
    stale: result.stale ?? false,
  };
}
