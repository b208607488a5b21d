import { commonPrefix } from './result-codec.ts';
import type { TurnRecord } from './types.ts';

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
  readonly #deltas: Array<{ keep: number; add: number[] } | null> = [];
  /** The latest turn's prompt (the one the next is compared with). */
  #latest: number[] | null = null;

  /** A new turn, its prompt whole; the turn before it gives up its own if it can be rebuilt. */
  add(turn: TurnRecord): void {
    const prompt = turn.promptTokenIds;
    const previous = this.#latest;
    const keep = prompt && previous ? commonPrefix(previous, prompt) : 0;
    this.#deltas.push(keep > 0 ? { keep, add: prompt!.slice(keep) } : null);
    const before = this.#turns.length - 1;
    // the turn before can be rebuilt from the one before it: drop its ids
    if (before > 0 && this.#deltas[before] !== null) this.#turns[before]!.promptTokenIds = null;
    this.#turns.push(turn);
    this.#latest = prompt;
  }

  /** Every turn's prompt whole again (the records are the ones given to `add`). */
  restore(): void {
    let previous: number[] | null = null;
    this.#turns.forEach((turn, t) => {
      const delta = this.#deltas[t];
      if (turn.promptTokenIds === null && delta && previous) turn.promptTokenIds = previous.slice(0, delta.keep).concat(delta.add);
      previous = turn.promptTokenIds;
    });
  }
}
