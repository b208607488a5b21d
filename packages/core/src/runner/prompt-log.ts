import { fromDelta, promptDelta, type PromptDelta } from '../protocol/result-codec.ts';
import type { TurnRecord } from '../protocol/rollout.ts';

/**
 * The prompts of a rollout in flight, each token id held once. A turn's prompt is the
 * conversation so far, so keeping every turn's whole prompt holds the conversation once per turn
 * (a 20-turn rollout with contexts to 26k tokens: ~2 MB of ids, for each rollout in flight). Here
 * a turn's prompt, once the next one has come, is dropped from its record and kept as the part of
 * the previous prompt it starts with and the ids after it; `restore()` puts every prompt back
 * whole, in the same records, when the loop ends. The first prompt, the latest, and a prompt that
 * shares no prefix with the one before stay as they came.
 */
export class PromptLog {
  readonly #turns: TurnRecord[] = [];
  /** Per turn: how to rebuild its prompt from the previous one, or null when it is held whole. */
  readonly #deltas: Array<PromptDelta | null> = [];

  /** A new turn, its prompt whole; the turn before it gives up its own if it can be rebuilt. */
  add(turn: TurnRecord): void {
    const previous = this.#turns.at(-1);
    // (the latest turn still holds its prompt: it is the one the new prompt is compared with)
    const delta = promptDelta(previous?.prompt_token_ids, turn.prompt_token_ids);
    if (previous && this.#deltas.at(-1)) previous.prompt_token_ids = null;
    this.#turns.push(turn);
    this.#deltas.push(delta);
  }

  /** Every turn's prompt whole again (the records are the ones given to `add`). */
  restore(): void {
    this.#turns.forEach((turn, t) => {
      const delta = this.#deltas[t];
      const previous = this.#turns[t - 1]?.prompt_token_ids;
      if (turn.prompt_token_ids === null && delta && previous) turn.prompt_token_ids = fromDelta(previous, delta);
    });
  }
}
