import type { RolloutResult, RolloutTask, TurnRecord, TurnRewardWeights } from '../protocol/rollout.ts';
import type { z } from 'zod';
import { assignGroupCredit } from './rewards/group.ts';
import { assignSampleCredit, scoreTurns } from './rewards/assign.ts';
import { normalizeAdvantages } from './rewards/normalize.ts';
import { resolveCredit } from './rewards/settings.ts';

// Turn-level credit lives in rewards/; these are the service's two entry points and the
// functions this file held before.

/** A finished sample's own credit (see assignSampleCredit), from its task's settings. */
export function assignTaskSampleCredit(result: RolloutResult, task: RolloutTask): void {
  assignSampleCredit(result, resolveCredit(task), task.n);
}

/** A complete group's credit: shaping, returns, advantages (see assignGroupCredit). */
export function assignTaskGroupCredit(group: readonly RolloutResult[], task: RolloutTask): Promise<void> {
  return assignGroupCredit(group, resolveCredit(task));
}

/** Scores turns with the legacy weights and gamma (see resolveCredit for the mapping); no shaping. */
export function assignTurnRewards(turns: TurnRecord[], outcome: number, weights?: z.output<typeof TurnRewardWeights>, gamma?: number): void {
  scoreTurns(turns, outcome, resolveCredit({ ...(weights ? { turn_rewards: weights } : {}), ...(gamma === undefined ? {} : { gamma }) }), 0);
}

/** Advantages over a group with returns pooled over every turn (normalizeAdvantages, 'group'). */
export function normalizeGroup(results: RolloutResult[]): void {
  normalizeAdvantages(results, 'group');
}
