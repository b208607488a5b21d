import { describe, expect, it } from 'vitest';
import type { RolloutResult } from '../protocol/rollout.ts';
import { groupOutcome } from './dynamic-sampling.ts';

const sample = (reward: number, options: { filter?: boolean; firstReturn?: number } = {}) =>
  ({ reward, filter: options.filter ?? false, turns: options.firstReturn === undefined ? [] : [{ return: options.firstReturn }] }) as unknown as RolloutResult;

describe('groupOutcome (DAPO: keep a group whose metric is not the same for all its samples)', () => {
  it('keeps a spread, drops all-equal', () => {
    expect(groupOutcome([sample(1), sample(0), sample(0)], 'reward')).toBe('kept');
    expect(groupOutcome([sample(1), sample(1)], 'reward')).toBe('all_equal');
    expect(groupOutcome([sample(0.1), sample(0.1), sample(0.1)], 'reward')).toBe('all_equal');
  });

  it('compares only the samples not filtered: fewer than two left is filtered', () => {
    expect(groupOutcome([sample(1), sample(0, { filter: true }), sample(1)], 'reward')).toBe('all_equal');
    expect(groupOutcome([sample(1), sample(0, { filter: true }), sample(0)], 'reward')).toBe('kept');
    expect(groupOutcome([sample(1), sample(0, { filter: true })], 'reward')).toBe('filtered');
    expect(groupOutcome([sample(0, { filter: true }), sample(0, { filter: true })], 'reward')).toBe('filtered');
  });

  it('keeps a group of one, as verl does, unless its sample is filtered', () => {
    expect(groupOutcome([sample(1)], 'reward')).toBe('kept');
    expect(groupOutcome([sample(0, { filter: true })], 'reward')).toBe('filtered');
  });

  it("'return' compares the first turn's return (shaping and format included)", () => {
    expect(groupOutcome([sample(1, { firstReturn: 1 }), sample(1, { firstReturn: 0.9 })], 'return')).toBe('kept');
    expect(groupOutcome([sample(1, { firstReturn: 1 }), sample(0, { firstReturn: 1 })], 'return')).toBe('all_equal');
  });
});
