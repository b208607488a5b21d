import { RolloutError } from '../../errors.ts';
import type { CreditSettings, RolloutResult } from '../../protocol/rollout.ts';
import { creditRecord, scoreTurns } from './assign.ts';
import { normalizeAdvantages } from './normalize.ts';
import { shapeGroup, type ShapingEntry } from './shaping.ts';
import { similarityFor, type CodeSimilarity } from './similarity.ts';

/**
 * Group credit, once every sample of a task is in: shaping, then each trajectory's turns scored
 * again with it, then advantages. Never throws: when shaping fails (an embeddings endpoint down)
 * each result says why in `credit.error`, its shaping component stays null and no advantage is
 * given (normalized_return null); GRPO's sample `advantage` of the verify reward is still given.
 */
export async function assignGroupCredit(group: readonly RolloutResult[], settings: CreditSettings, similarity: CodeSimilarity = similarityFor(settings.shaping.similarity)): Promise<void> {
  let shaping: Map<RolloutResult, ShapingEntry> | undefined;
  let error: string | null = null;
  try {
    shaping = await shapeGroup(group, settings.shaping, similarity);
  } catch (caught) {
    error = `shaping failed, so no advantages were computed: ${RolloutError.from(caught).message}`;
  }
  for (const result of group) {
    result.credit ??= creditRecord(settings);
    const entry = shaping?.get(result);
    if (entry) scoreTurns(result.turns, result.reward, settings, entry.value);
    result.credit.shaping = entry ?? null;
    result.credit.error = error;
  }
  if (error !== null) {
    for (const result of group) for (const turn of result.turns) turn.normalized_return = null;
    const kept = group.filter((r) => !r.filter);
    // the sample advantage needs no shaping: GRPO's, over the verify rewards
    normalizeOutcomeOnly(group, kept);
    return;
  }
  const stats = normalizeAdvantages(group, settings.normalize);
  for (const result of group) result.credit!.stats = result.filter ? null : stats;
}

function normalizeOutcomeOnly(group: readonly RolloutResult[], kept: readonly RolloutResult[]): void {
  if (group.length < 2 || kept.length < 2) return;
  const mean = kept.reduce((a, r) => a + r.reward, 0) / kept.length;
  const std = Math.sqrt(kept.reduce((a, r) => a + (r.reward - mean) ** 2, 0) / kept.length);
  for (const result of kept) result.advantage = (result.reward - mean) / (std + 1e-6);
}
