import { describe, expect, it } from 'vitest';
import { PromptLog } from './prompt-log.ts';
import type { TurnRecord } from '../protocol/rollout.ts';

const turn = (index: number, prompt_token_ids: number[] | null) => ({ index, prompt_token_ids }) as TurnRecord;
const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

describe('PromptLog', () => {
  it('holds each id once while the loop runs and gives every prompt back whole, in the same records', () => {
    const prompts = [
      range(0, 100),
      [...range(0, 100), ...range(500, 30)], // extends the first
      [...range(0, 100), ...range(500, 30), ...range(900, 40)], // extends the second
      [...range(0, 60), 7, ...range(61, 39), ...range(500, 30), ...range(900, 40), 1], // drift inside the first prompt
      null, // the policy gave no ids
      range(2_000, 10), // shares nothing with the one before
      [...range(2_000, 10), 3],
    ];
    const expected = prompts.map((p) => p && [...p]);
    const log = new PromptLog();
    const turns: TurnRecord[] = [];
    prompts.forEach((prompt, i) => {
      turns.push(turn(i, prompt));
      log.add(turns[i]!);
    });
    // dropped: the prompts rebuilt from the one before, except the latest; kept: the first, the
    // latest, the one without ids, and the one sharing no prefix
    expect(turns.map((t) => t.prompt_token_ids === null)).toEqual([false, true, true, true, true, false, false]);
    log.restore();
    expect(turns.map((t) => t.prompt_token_ids)).toEqual(expected);
  });

  it('leaves a single turn, and turns without ids, as they are', () => {
    const log = new PromptLog();
    const only = turn(0, [1, 2, 3]);
    log.add(only);
    log.restore();
    expect(only.prompt_token_ids).toEqual([1, 2, 3]);
    const empty = new PromptLog();
    const none = [turn(0, null), turn(1, null), turn(2, null)];
    none.forEach((t) => empty.add(t));
    empty.restore();
    expect(none.map((t) => t.prompt_token_ids)).toEqual([null, null, null]);
  });
});
