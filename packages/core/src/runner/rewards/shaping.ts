import type { CreditSettings, RolloutResult } from '../../protocol/rollout.ts';
import { trajectoryCode } from './assign.ts';
import type { CodeSimilarity } from './similarity.ts';

export interface ShapingEntry {
  /** α × similarity for a failed trajectory of a group with a success, else 0. */
  value: number;
  /** Mean cosine similarity of its code to each successful trajectory's code; null when not computed. */
  similarity: number | null;
  successes: number;
}

/**
 * GTPO's self-supervised shaping over a complete group: when at least one kept trajectory
 * succeeded (verify reward ≥ success_threshold), each failed one gets
 * α · (1/|S|) Σ_{s∈S} cos(code_f, code_s), its code being every turn's executed code joined, at
 * least 0 unless `clamp` is off (`similarity` keeps the mean as computed).
 * Successful trajectories, filtered ones and groups without a success get 0. Throws when the
 * similarity fails (an embeddings endpoint down): no number rather than a wrong one.
 */
export async function shapeGroup(
  group: readonly RolloutResult[],
  shaping: CreditSettings['shaping'],
  similarity: CodeSimilarity,
): Promise<Map<RolloutResult, ShapingEntry>> {
  const kept = group.filter((r) => !r.filter);
  const successes = kept.filter((r) => r.reward >= shaping.success_threshold);
  const failures = kept.filter((r) => r.reward < shaping.success_threshold);
  const entries = new Map<RolloutResult, ShapingEntry>();
  for (const result of group) entries.set(result, { value: 0, similarity: null, successes: successes.length });
  if (successes.length === 0 || failures.length === 0 || shaping.alpha === 0) return entries;
  const matrix = await similarity.matrix(
    failures.map((r) => trajectoryCode(r.turns)),
    successes.map((r) => trajectoryCode(r.turns)),
  );
  failures.forEach((result, i) => {
    const row = matrix[i]!;
    const mean = row.reduce((a, b) => a + b, 0) / row.length;
    entries.set(result, { value: shaping.alpha * (shaping.clamp ? Math.max(0, mean) : mean), similarity: mean, successes: successes.length });
  });
  return entries;
}
