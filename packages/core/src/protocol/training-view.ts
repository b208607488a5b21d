import type { CreditRecord, RolloutResult, TurnRecord } from './rollout.ts';

/** One turn as a trainer reads it: where its generation sits in the response, what it did, its credit. */
export interface TrainingTurn {
  index: number;
  /** [start, end) of the turn's generated tokens in `response_ids`; null without token ids. */
  generation_span: [number, number] | null;
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

/** The training view of a finished rollout. */
export function trainingView(result: RolloutResult): TrainingView {
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
        sequenceError = `re-tokenisation drift: turn ${turn.index}'s prompt does not start with turn ${turn.index - 1}'s prompt and generation`;
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
    turns: turns.map((turn, i) => ({
      index: turn.index,
      generation_span: ok ? spans[i]! : null,
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
