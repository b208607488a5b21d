import type { CreditRecord, RolloutResult } from '../../protocol/rollout.ts';

/** Added to the std so that a group of equal returns gives advantages of 0, not NaN. */
export const STD_EPSILON = 1e-6;

/** Mean and population standard deviation (÷ N). */
export function meanStd(values: readonly number[]): { mean: number; std: number } {
  const mean = values.reduce((a, b) => a + b, 0) / values.length;
  const variance = values.reduce((a, b) => a + (b - mean) ** 2, 0) / values.length;
  return { mean, std: Math.sqrt(variance) };
}

/**
 * Advantages over a task's group, in place. Each turn's `normalized_return` is
 * (G - mean) / (std + ε), the statistics taken over every turn of the group's trajectories
 * ('group') or over the turns with the same index ('turn'); each sample's `advantage` is GRPO's,
 * (reward - mean) / (std + ε) over the samples' verify rewards. Filtered samples (infrastructure
 * failures) take no part and get null. Needs two kept samples; returns the statistics used.
 */
export function normalizeAdvantages(group: readonly RolloutResult[], mode: 'group' | 'turn'): CreditRecord['stats'] {
  const kept = group.filter((r) => !r.filter);
  if (group.length < 2 || kept.length < 2) return null;
  const rewards = meanStd(kept.map((r) => r.reward));
  const stats: NonNullable<CreditRecord['stats']> = [];
  const byTurn = new Map<number | null, { mean: number; std: number }>();
  if (mode === 'group') {
    const returns = kept.flatMap((r) => r.turns.map((t) => t.return));
    if (returns.length > 0) {
      const s = meanStd(returns);
      byTurn.set(null, s);
      stats.push({ turn: null, count: returns.length, ...s });
    }
  } else {
    const longest = Math.max(...kept.map((r) => r.turns.length));
    for (let t = 0; t < longest; t++) {
      const returns = kept.flatMap((r) => (t < r.turns.length ? [r.turns[t]!.return] : []));
      const s = meanStd(returns);
      byTurn.set(t, s);
      stats.push({ turn: t, count: returns.length, ...s });
    }
  }
  for (const result of group) {
    if (result.filter) {
      for (const turn of result.turns) turn.normalized_return = null;
      continue;
    }
    result.advantage = (result.reward - rewards.mean) / (rewards.std + STD_EPSILON);
    result.turns.forEach((turn, t) => {
      const s = byTurn.get(mode === 'group' ? null : t)!;
      turn.normalized_return = (turn.return - s.mean) / (s.std + STD_EPSILON);
    });
  }
  return stats;
}
