import { RolloutError } from '../errors.ts';
import type { EnvironmentMetrics, VerifyEntry } from '../spec/environment.ts';
import { maxOf, minOf, npSum, numeric } from './metrics-python.ts';

// NeMo Gym's `/aggregate_metrics` (nemo_gym/reward_profile.py: `compute_aggregate_metrics` and
// `RewardProfiler`), CONTRACT.md §1.7; the pass@k family its environments' `metrics` hooks add is
// in pass-at-k.ts. Every number is computed in the order Python computes it (see
// metrics-python.ts), so the answer matches Python's within 1e-9.

const TASK_INDEX = '_ng_task_index';
const ROLLOUT_INDEX = '_ng_rollout_index';
const STATS = ['mean', 'max', 'min', 'median', 'std'] as const;

/** The `/aggregate_metrics` response body (NeMo Gym's `AggregateMetrics`). */
export interface AggregateMetrics {
  group_level_metrics: Record<string, unknown>[];
  agent_metrics: Record<string, unknown>;
  key_metrics: Record<string, unknown>;
}

/** An environment's `metrics` / `keyMetrics` hooks; an `Environment` can be passed as it is. */
export interface AggregateMetricsHooks {
  metrics?: (tasks: VerifyEntry[][]) => EnvironmentMetrics;
  keyMetrics?: (agentMetrics: Record<string, unknown>) => Record<string, unknown>;
}

type Row = Map<string, number>;

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** `(result["response"].get("usage") or {})`, tolerating a missing or malformed response. */
function usageOf(entry: VerifyEntry): Record<string, unknown> {
  const response = entry.response;
  const usage = isRecord(response) ? response.usage : undefined;
  return isRecord(usage) ? usage : {};
}

function indexOf(entry: VerifyEntry, key: string): number {
  const value = entry[key];
  if (value === undefined) return 0; // vr.get(key, 0)
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new RolloutError({
      code: 'UNPROCESSABLE',
      message: `${key} must be an integer, got ${JSON.stringify(value)}`,
    });
  }
  return value;
}

interface ColumnStats {
  mean: number;
  max: number;
  min: number;
  median: number;
  std: number;
  complete: boolean;
}

/** pandas' skipna `mean`, `max`, `min`, `median` and `std` (ddof 1) of one column. */
function columnStats(values: Array<number | undefined>): ColumnStats {
  const present = values.filter((v): v is number => v !== undefined);
  const count = present.length;
  if (count === 0) return { mean: NaN, max: NaN, min: NaN, median: NaN, std: NaN, complete: false };
  // nanops fills the missing values with 0 and sums the whole column (the order matters to numpy).
  const filled = values.map((v) => v ?? 0);
  const mean = npSum(filled) / count;
  const sorted = [...present].sort((a, b) => a - b);
  const middle = Math.floor(count / 2);
  const median = count % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
  let std = NaN;
  if (count > 1) {
    const squares = values.map((v) => (v === undefined ? 0 : (mean - v) * (mean - v)));
    std = Math.sqrt(npSum(squares) / (count - 1));
  }
  return {
    mean,
    max: maxOf(present),
    min: minOf(present),
    median,
    std,
    complete: count === values.length,
  };
}

/**
 * `RewardProfiler.describe_dataframe` with its NaN filtering: `<stat>/<column>` for every stat
 * that is not NaN. When every std is NaN (a single rollout), the std of each column without
 * missing values becomes 0.
 */
function describe(rows: readonly Row[], columns: readonly string[]): Record<string, number> {
  const stats = columns.map((column) => columnStats(rows.map((row) => row.get(column))));
  if (stats.every((s) => Number.isNaN(s.std))) {
    for (const s of stats) if (s.complete) s.std = 0;
  }
  const out: Record<string, number> = {};
  for (const stat of STATS) {
    columns.forEach((column, i) => {
      const value = stats[i]![stat];
      if (!Number.isNaN(value)) out[`${stat}/${column}`] = value;
    });
  }
  return out;
}

/** `RewardProfiler.rollout_info_from_result`: the compact per-rollout record of a group. */
function rolloutInfo(entry: VerifyEntry, task: number, rollout: number): Record<string, unknown> {
  const info: Record<string, unknown> = {
    rollout_id: `${task}:${rollout}`,
    [TASK_INDEX]: task,
    [ROLLOUT_INDEX]: rollout,
  };
  if ('reward' in entry) info.reward = entry.reward;
  for (const [key, value] of Object.entries(usageOf(entry))) {
    const n = numeric(value);
    if (n !== undefined) info[key] = n;
  }
  for (const [key, value] of Object.entries(entry)) {
    if (key === TASK_INDEX || key === ROLLOUT_INDEX || key === 'reward' || key === 'response') continue;
    const n = numeric(value);
    if (n !== undefined) info[key] = n;
  }
  return info;
}

/** `_group_by_task`: entries grouped by task index, tasks ascending, entries in input order. */
function groupByTask(entries: ReadonlyArray<{ entry: VerifyEntry; task: number }>): VerifyEntry[][] {
  const groups = new Map<number, VerifyEntry[]>();
  for (const { entry, task } of entries) {
    const group = groups.get(task);
    if (group) group.push(entry);
    else groups.set(task, [entry]);
  }
  return [...groups.keys()].sort((a, b) => a - b).map((task) => groups.get(task)!);
}

/**
 * NeMo Gym's `/aggregate_metrics`: the RewardProfiler baseline plus the environment's hooks.
 *
 * - Each entry's `response.usage` is merged into it; numbers and bools (as 0/1) become columns.
 * - `group_level_metrics`: one entry per task (ascending `_ng_task_index`) with
 *   `mean|max|min|median|std/<column>`, `sample`, rollout counts and `rollout_infos`.
 * - `agent_metrics`: the same five statistics over all rows, then `hooks.metrics(tasks)` merged in
 *   (its `per_task_metrics` list goes into the matching groups instead).
 * - `key_metrics`: `hooks.keyMetrics(agent_metrics)`, by default every `mean/*` entry.
 *
 * Throws a RolloutError `UNPROCESSABLE` for a duplicate (task, rollout) pair or a non-integer index.
 *
 * @example
 * computeAggregateMetrics([
 *   { _ng_task_index: 0, _ng_rollout_index: 0, reward: 1, response: { usage: { input_tokens: 60 } } },
 *   { _ng_task_index: 0, _ng_rollout_index: 1, reward: 0, response: { usage: { input_tokens: 40 } } },
 * ]).agent_metrics
 * // → { 'mean/reward': 0.5, 'mean/input_tokens': 50, 'max/reward': 1, ..., 'std/input_tokens': 14.14… }
 */
export function computeAggregateMetrics(
  verifyResponses: readonly VerifyEntry[],
  hooks: AggregateMetricsHooks = {},
): AggregateMetrics {
  if (verifyResponses.length === 0) return { group_level_metrics: [], agent_metrics: {}, key_metrics: {} };
  const keyed = keyedEntries(verifyResponses);
  const { columns, groups, allRows } = profileRows(keyed);

  const groupLevel: Record<string, unknown>[] = [];
  for (const [task, { rows, infos }] of groups) {
    groupLevel.push({
      [TASK_INDEX]: task,
      ...describe(rows, columns),
      sample: { agent_ref: { name: 'agent' } },
      num_rollouts: rows.length,
      expected_num_rollouts: rows.length,
      missing_num_rollouts: 0,
      reward_profile_completion_pct: 100,
      rollout_infos: infos,
    });
  }
  const agentMetrics: Record<string, unknown> = describe(allRows, columns);

  if (hooks.metrics) {
    const custom: Record<string, unknown> = { ...hooks.metrics(groupByTask(keyed)) };
    const perTask = custom.per_task_metrics;
    delete custom.per_task_metrics;
    if (Array.isArray(perTask) && perTask.length > 0) mergePerTaskMetrics(groupLevel, perTask);
    Object.assign(agentMetrics, custom);
  }

  const keyMetrics = hooks.keyMetrics
    ? hooks.keyMetrics(agentMetrics)
    : Object.fromEntries(Object.entries(agentMetrics).filter(([key]) => key.startsWith('mean/')));
  return { group_level_metrics: groupLevel, agent_metrics: agentMetrics, key_metrics: keyMetrics };
}

type KeyedEntry = { entry: VerifyEntry; task: number; rollout: number };

/** The entries with their (task, rollout) indices; throws for a duplicate pair or a non-integer index. */
function keyedEntries(verifyResponses: readonly VerifyEntry[]): KeyedEntry[] {
  const keyed = verifyResponses.map((entry) => ({
    entry,
    task: indexOf(entry, TASK_INDEX),
    rollout: indexOf(entry, ROLLOUT_INDEX),
  }));
  const seen = new Set<string>();
  for (const { task, rollout } of keyed) {
    const id = `${task}:${rollout}`;
    if (seen.has(id)) {
      throw new RolloutError({
        code: 'UNPROCESSABLE',
        message: `Duplicate materialized input row for rollout key (${task}, ${rollout})`,
      });
    }
    seen.add(id);
  }
  return keyed;
}

/**
 * The profiler's rows (each entry's numbers and bools, its usage merged in) in (task, rollout)
 * order, as Python profiles them, with the columns in first-seen order and the rows and rollout
 * infos of each task.
 */
function profileRows(keyed: readonly KeyedEntry[]): {
  columns: string[];
  groups: Map<number, { rows: Row[]; infos: Record<string, unknown>[] }>;
  allRows: Row[];
} {
  const sorted = [...keyed].sort((a, b) => a.task - b.task || a.rollout - b.rollout);
  const columns: string[] = [];
  const known = new Set<string>([TASK_INDEX, ROLLOUT_INDEX]);
  const groups = new Map<number, { rows: Row[]; infos: Record<string, unknown>[] }>();
  const allRows: Row[] = [];
  for (const { entry, task, rollout } of sorted) {
    const row: Row = new Map();
    for (const [key, value] of Object.entries({ ...entry, ...usageOf(entry) })) {
      const n = numeric(value);
      if (n === undefined || key === TASK_INDEX || key === ROLLOUT_INDEX) continue;
      row.set(key, n);
      if (!known.has(key)) {
        known.add(key);
        columns.push(key);
      }
    }
    allRows.push(row);
    const group = groups.get(task) ?? { rows: [], infos: [] };
    group.rows.push(row);
    group.infos.push(rolloutInfo(entry, task, rollout));
    groups.set(task, group);
  }
  return { columns, groups, allRows };
}

function mergePerTaskMetrics(groups: Record<string, unknown>[], perTask: readonly unknown[]): void {
  const byTask = new Map<unknown, Record<string, unknown>>();
  for (const metrics of perTask) {
    if (!isRecord(metrics) || !(TASK_INDEX in metrics)) {
      throw new RolloutError({ code: 'INTERNAL', message: `every per_task_metrics entry needs ${TASK_INDEX}` });
    }
    byTask.set(metrics[TASK_INDEX], metrics);
  }
  for (const group of groups) {
    const metrics = byTask.get(group[TASK_INDEX]);
    if (!metrics) continue;
    for (const [key, value] of Object.entries(metrics)) if (key !== TASK_INDEX) group[key] = value;
  }
}
