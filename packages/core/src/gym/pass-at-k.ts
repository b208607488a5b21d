import type { VerifyEntry } from '../spec/environment.ts';
import { comb, compareCodePoints, maxOf, numeric, pyHashKey, pyStr, pySum, pyTruthy, trueDivide } from './metrics-python.ts';

// NeMo Gym's pass@k family (nemo_gym/reward_profile.py: compute_pass_majority_metrics,
// add_avg_sample_std_dev, compute_subset_metrics, highest_k_metrics), what environments' `metrics`
// and `keyMetrics` hooks build on. Every number is computed in the order Python computes it (see
// metrics-python.ts).

/** How a rollout is scored for pass@k: NeMo Gym's `score_fn` and `answer_key`. */
export interface PassMajorityOptions {
  /**
   * Named scores of one verify entry: numbers, or bools counted as 0/1. Any other value (null, a
   * missing field) leaves that score out for the entry, where Python would fail. Binary scores
   * (all 0/1 within a task) get combinatorial pass@k, others max-of-k.
   * @default (entry) => ({ accuracy: entry.reward })
   * @example (entry) => ({ accuracy: entry.reward, symbolic_accuracy: entry.library_reward })
   */
  score?: (entry: VerifyEntry) => Record<string, unknown>;
  /**
   * The extras field holding the extracted answer. Enables `majority@k` and adds the binary score
   * `no_answer` (1 when the field is null or missing).
   * @example 'extracted_answer'
   */
  answerKey?: string;
}

interface ScoredTasks {
  /** scores[task][rollout] = { name: value } */
  scores: Array<Array<Map<string, number>>>;
  answers: unknown[][];
  names: string[];
  maxK: number;
}

const defaultScore = (entry: VerifyEntry): Record<string, unknown> => ({ accuracy: entry.reward });

function scoreTasks(tasks: readonly (readonly VerifyEntry[])[], options: PassMajorityOptions): ScoredTasks {
  const score = options.score ?? defaultScore;
  const { answerKey } = options;
  const names = new Set<string>();
  const answers: unknown[][] = [];
  const scores = tasks.map((rollouts) => {
    const taskAnswers: unknown[] = [];
    answers.push(taskAnswers);
    return rollouts.map((entry) => {
      const scored = new Map<string, number>();
      for (const [name, value] of Object.entries(score(entry))) {
        const n = numeric(value);
        if (n !== undefined) scored.set(name, n);
      }
      if (answerKey !== undefined) {
        const answer = entry[answerKey] ?? null;
        taskAnswers.push(answer);
        scored.set('no_answer', answer === null ? 1 : 0);
      }
      for (const name of scored.keys()) names.add(name);
      return scored;
    });
  });
  return {
    scores,
    answers,
    names: [...names].sort(compareCodePoints),
    maxK: maxOf([0, ...tasks.map((rollouts) => rollouts.length)]),
  };
}

function valuesOf(rollouts: ReadonlyArray<Map<string, number>>, name: string): number[] {
  return rollouts.filter((s) => s.has(name)).map((s) => s.get(name)!);
}

/** Python's `sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)`, square-rooted. */
function sampleStd(values: readonly number[]): number {
  const mean = pySum(values) / values.length;
  return Math.sqrt(pySum(values.map((x) => (x - mean) * (x - mean))) / (values.length - 1));
}

/** `100.0 * sum(values) / len(values)` */
function percentMean(values: readonly number[]): number {
  return (100 * pySum(values)) / values.length;
}

/**
 * NeMo Gym's `compute_pass_majority_metrics`: for k = 1..(most rollouts of any task) and every
 * score name, `pass@{k}/<name>` (binary: 1 - C(n_incorrect, k)/C(n, k); otherwise max of the first
 * k), `pass@1[avg-of-{k}]/<name>` and, with `answerKey`, `majority@{k}/<name>`; then
 * `per_sample_aggregate` and, for k ≥ 2, `pass@1[avg-of-{k}]/<name>/std_dev_across_runs` and
 * `.../std_err_across_runs`. Values are percentages. Empty `tasks` gives `{}`.
 *
 * @example
 * // tasks[i] holds the verify entries of task i (what the `metrics` hook receives)
 * computePassMajorityMetrics(
 *   [[{ reward: 1, extracted_answer: 'A' }, { reward: 0, extracted_answer: 'B' }]],
 *   { score: (r) => ({ accuracy: r.reward }), answerKey: 'extracted_answer' },
 * );
 * // → { 'pass@1/accuracy': 50, 'pass@1[avg-of-1]/accuracy': 100, 'majority@1/accuracy': 100,
 * //     'pass@1/no_answer': 0, ..., 'pass@2/accuracy': 100, 'pass@1[avg-of-2]/accuracy': 50,
 * //     'majority@2/accuracy': 50, ..., per_sample_aggregate: { accuracy: [100, 0], no_answer: [0, 0] },
 * //     'pass@1[avg-of-2]/accuracy/std_dev_across_runs': 70.71…, ... }
 */
export function computePassMajorityMetrics(
  tasks: readonly (readonly VerifyEntry[])[],
  options: PassMajorityOptions = {},
): Record<string, unknown> {
  if (tasks.length === 0) return {};
  const { scores, answers, names, maxK } = scoreTasks(tasks, options);
  const metrics: Record<string, unknown> = {};

  for (let k = 1; k <= maxK; k++) {
    for (const name of names) {
      const passValues = scores.flatMap((taskScores) => passAtK(valuesOf(taskScores, name), k) ?? []);
      if (passValues.length > 0) metrics[`pass@${k}/${name}`] = percentMean(passValues);

      const avgValues: number[] = [];
      for (const taskScores of scores) {
        const vals = valuesOf(taskScores.slice(0, k), name);
        if (vals.length > 0) avgValues.push(pySum(vals) / vals.length);
      }
      if (avgValues.length > 0) metrics[`pass@1[avg-of-${k}]/${name}`] = percentMean(avgValues);

      if (options.answerKey !== undefined) {
        const majorityValues = scores.map((taskScores, t) => majorityVote(taskScores, answers[t]!, name, k));
        if (majorityValues.length > 0) metrics[`majority@${k}/${name}`] = percentMean(majorityValues);
      }
    }
  }

  const perSample = perSampleAggregate(scores, names, maxK);
  metrics.per_sample_aggregate = Object.fromEntries([...perSample].filter(([, runs]) => runs.length > 0));

  for (let k = 2; k <= maxK; k++) {
    for (const name of names) {
      const runAverages = (perSample.get(name) ?? []).slice(0, k);
      if (runAverages.length < 2) continue;
      const std = sampleStd(runAverages);
      metrics[`pass@1[avg-of-${k}]/${name}/std_dev_across_runs`] = std;
      metrics[`pass@1[avg-of-${k}]/${name}/std_err_across_runs`] = std / Math.sqrt(runAverages.length);
    }
  }
  return metrics;
}

/**
 * One task's pass@k of a score (its values in rollout order): binary scores 1 - C(n_incorrect, k)/C(n, k),
 * others the max of the first k; none with fewer than k values.
 */
function passAtK(vals: readonly number[], k: number): number | undefined {
  if (vals.length === 0 || k > vals.length) return undefined;
  if (vals.every((v) => v === 0 || v === 1)) {
    const incorrect = vals.filter((v) => v === 0).length;
    return incorrect < k ? 1 : 1 - trueDivide(comb(incorrect, k), comb(vals.length, k));
  }
  return maxOf(vals.slice(0, k));
}

/** per_sample_aggregate[name][i]: pass@1 of rollout i across the tasks that have it. */
function perSampleAggregate(scores: ScoredTasks['scores'], names: readonly string[], maxK: number): Map<string, number[]> {
  const perSample = new Map<string, number[]>(names.map((name) => [name, []]));
  for (let run = 0; run < maxK; run++) {
    for (const name of names) {
      const runScores = scores.flatMap((taskScores) => {
        const s = taskScores[run];
        return s?.has(name) ? [s.get(name)!] : [];
      });
      if (runScores.length > 0) perSample.get(name)!.push(percentMean(runScores));
    }
  }
  return perSample;
}

/**
 * One task's majority@k: count the (answer, score) pairs of the first k rollouts that have an
 * answer, and average the scores of the pairs tied for the highest count (0 without answers).
 */
function majorityVote(
  taskScores: ReadonlyArray<Map<string, number>>,
  taskAnswers: readonly unknown[],
  name: string,
  k: number,
): number {
  const counter = new Map<string, { score: number; count: number }>();
  for (let i = 0; i < Math.min(k, taskScores.length); i++) {
    const answer = taskAnswers[i];
    const s = taskScores[i]!;
    if (answer === null || !s.has(name)) continue;
    const score = s.get(name)!;
    const key = `${pyHashKey(answer)}\u0000${pyHashKey(score)}`;
    const slot = counter.get(key);
    if (slot) slot.count++;
    else counter.set(key, { score, count: 1 });
  }
  if (counter.size === 0) return 0;
  const maxCount = maxOf([...counter.values()].map((slot) => slot.count));
  const tied = [...counter.values()].filter((slot) => slot.count === maxCount).map((slot) => slot.score);
  return pySum(tied) / tied.length;
}

/**
 * NeMo Gym's `add_avg_sample_std_dev`: adds `pass@1[avg-of-{k}]/<name>/avg_sample_std_dev` for
 * k ≥ 2, the mean over tasks of the per-task sample std (ddof 1) of the first k scores. Pass the
 * same options as to `computePassMajorityMetrics` (with `answerKey`, `no_answer` is included).
 * Changes `metrics` in place and returns it.
 *
 * @example
 * const options = { score: (r) => ({ accuracy: Number(r.reward > 0) }), answerKey: 'extracted_model_code' };
 * const metrics = addAvgSampleStdDev(tasks, computePassMajorityMetrics(tasks, options), options);
 * // metrics['pass@1[avg-of-2]/accuracy/avg_sample_std_dev'] → 0.3535… for tasks [[1, 0], [1, 1]]
 */
export function addAvgSampleStdDev(
  tasks: readonly (readonly VerifyEntry[])[],
  metrics: Record<string, unknown>,
  options: PassMajorityOptions = {},
): Record<string, unknown> {
  const { scores, names, maxK } = scoreTasks(tasks, options);
  for (let k = 2; k <= maxK; k++) {
    for (const name of names) {
      const sampleStdDevs: number[] = [];
      for (const taskScores of scores) {
        const vals = valuesOf(taskScores.slice(0, k), name);
        if (vals.length >= 2) sampleStdDevs.push(sampleStd(vals));
      }
      if (sampleStdDevs.length > 0) {
        metrics[`pass@1[avg-of-${k}]/${name}/avg_sample_std_dev`] = pySum(sampleStdDevs) / sampleStdDevs.length;
      }
    }
  }
  return metrics;
}

/**
 * NeMo Gym's `compute_subset_metrics`: groups the tasks by the value of `key` in their first
 * entry (tasks where it is missing or falsy are left out) and returns `computePassMajorityMetrics`
 * of each group, prefixed with `<value>/`, without `per_sample_aggregate`.
 *
 * @example
 * computeSubsetMetrics(tasks, 'difficulty', { score: (r) => ({ accuracy: Number(r.reward > 0) }) });
 * // → { 'easy/pass@1/accuracy': 100, 'easy/pass@1[avg-of-1]/accuracy': 100, 'hard/pass@1/accuracy': 0, ... }
 */
export function computeSubsetMetrics(
  tasks: readonly (readonly VerifyEntry[])[],
  key: string,
  options: PassMajorityOptions = {},
): Record<string, unknown> {
  const subsets = new Map<string, { name: string; tasks: (readonly VerifyEntry[])[] }>();
  for (const rollouts of tasks) {
    const value = rollouts[0]?.[key];
    if (!pyTruthy(value)) continue;
    const id = pyHashKey(value);
    const subset = subsets.get(id) ?? { name: pyStr(value), tasks: [] };
    subset.tasks.push(rollouts);
    subsets.set(id, subset);
  }
  const metrics: Record<string, unknown> = {};
  for (const { name, tasks: subsetTasks } of subsets.values()) {
    for (const [metric, value] of Object.entries(computePassMajorityMetrics(subsetTasks, options))) {
      if (metric !== 'per_sample_aggregate') metrics[`${name}/${metric}`] = value;
    }
  }
  return metrics;
}

/** Which score names `highestKMetrics` keeps. */
export interface HighestKOptions {
  /** Keep only these score names (the part after `<pattern>/`). @example ['accuracy'] */
  scoreNames?: readonly string[];
  /** Drop these score names, after `scoreNames`. @example ['no_answer'] */
  excludeNames?: readonly string[];
}

const STAT_SUFFIXES = ['std_dev_across_runs', 'std_err_across_runs', 'avg_sample_std_dev'];

/**
 * NeMo Gym's `highest_k_metrics`: the entries of `metrics` matching `<pattern>/<score name>` at
 * the highest k, where `{k}` in the pattern stands for the number. The std/err/avg-sample stat
 * entries are always skipped.
 *
 * @example
 * highestKMetrics(agentMetrics, 'pass@{k}', { excludeNames: ['no_answer'] });
 * // → { 'pass@4/accuracy': 75 }      (also: 'pass@1[avg-of-{k}]', 'majority@{k}', 'easy/pass@{k}')
 */
export function highestKMetrics(
  metrics: Record<string, unknown>,
  pattern: string,
  options: HighestKOptions = {},
): Record<string, unknown> {
  const escaped = pattern.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&').replaceAll('\\{k\\}', '(\\d+)');
  const regex = new RegExp(`^${escaped}/(.+)$`);
  const matches: Array<[k: number, key: string]> = [];
  for (const key of Object.keys(metrics)) {
    const match = regex.exec(key);
    if (!match) continue;
    const scoreName = match[2]!;
    if (STAT_SUFFIXES.some((suffix) => scoreName.endsWith(suffix))) continue;
    if (options.scoreNames && !options.scoreNames.includes(scoreName)) continue;
    if (options.excludeNames?.includes(scoreName)) continue;
    matches.push([Number.parseInt(match[1]!, 10), key]);
  }
  if (matches.length === 0) return {};
  const maxK = maxOf(matches.map(([k]) => k));
  return Object.fromEntries(matches.filter(([k]) => k === maxK).map(([, key]) => [key, metrics[key]]));
}

/**
 * The entries of `metrics` named in `names`, in that order, skipping absent ones: the
 * `for name in (...): if name in agent_metrics` idiom of NeMo Gym's `get_key_metrics`.
 *
 * @example pickMetrics(agentMetrics, ['mean/input_tokens', 'mean/output_tokens'])
 */
export function pickMetrics(metrics: Record<string, unknown>, names: readonly string[]): Record<string, unknown> {
  return Object.fromEntries(names.filter((name) => name in metrics).map((name) => [name, metrics[name]]));
}
