import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { RolloutError } from '../errors.ts';
import type { EnvironmentMetrics, VerifyEntry } from '../spec/environment.ts';
import { computeAggregateMetrics, type AggregateMetricsHooks } from './metrics.ts';
import { comb, npSum, pySum, trueDivide } from './metrics-python.ts';
import {
  addAvgSampleStdDev,
  computePassMajorityMetrics,
  computeSubsetMetrics,
  highestKMetrics,
  pickMetrics,
  type PassMajorityOptions,
} from './pass-at-k.ts';

// ---------------------------------------------------------------------------------------------
// Fixtures: NeMo Gym's example rollouts and what its Python server answers for them

function fixturesDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'pnpm-workspace.yaml'))) dir = dirname(dir);
  return process.env.ROLLSERVE_FIXTURES ?? resolve(dir, '..', 'shared', 'fixtures', 'nemo-gym');
}

interface PythonReference {
  rows: Array<{ recorded_rollout_index: number; reward: number; extras: Record<string, unknown> }>;
  aggregate_metrics: Record<string, unknown>;
}

function readFixture(server: string): { reference: PythonReference; rollouts: Array<Record<string, any>> } {
  const dir = join(fixturesDir(), server);
  const reference = JSON.parse(readFileSync(join(dir, 'python_reference.json'), 'utf8')) as PythonReference;
  const rollouts = readFileSync(join(dir, 'example_rollouts.jsonl'), 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as Record<string, any>);
  return { reference, rollouts };
}

/**
 * The `verify_responses` NeMo Gym's collector posts for a fixture (rollout_collection.py
 * `_call_aggregate_metrics`). The recorded rollouts carry no `_ng_*` indices, so they are the
 * collector's for one repeat: task index = row order, rollout index 0. Each entry is the `/run`
 * result (today's reward and extras from python_reference.json) stamped with the indices and
 * `agent_ref`, minus `responses_create_params` and `response`, except a non-empty `response.usage`.
 */
function collectorVerifyResponses(server: string): VerifyEntry[] {
  const { reference, rollouts } = readFixture(server);
  return reference.rows.map((row, task) => {
    const usage = rollouts[row.recorded_rollout_index]!.response?.usage;
    return {
      reward: row.reward,
      ...row.extras,
      _ng_task_index: task,
      _ng_rollout_index: 0,
      agent_ref: { type: 'responses_api_agents', name: `${server}_simple_agent` },
      ...(usage ? { response: { usage } } : {}),
    };
  });
}

/** Deep equality with numbers within 1e-9 and identical key sets; returns the differences. */
function differences(actual: unknown, expected: unknown, path = '$'): string[] {
  if (typeof expected === 'number' && typeof actual === 'number') {
    return Math.abs(actual - expected) <= 1e-9 ? [] : [`${path}: ${actual} != ${expected}`];
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) return [`${path}: length differs`];
    return expected.flatMap((item, i) => differences(actual[i], item, `${path}[${i}]`));
  }
  if (typeof expected === 'object' && expected !== null) {
    if (typeof actual !== 'object' || actual === null) return [`${path}: not an object`];
    const a = actual as Record<string, unknown>;
    const e = expected as Record<string, unknown>;
    const missing = Object.keys(e).filter((key) => !(key in a)).map((key) => `${path}.${key}: missing`);
    const extra = Object.keys(a).filter((key) => !(key in e)).map((key) => `${path}.${key}: unexpected`);
    const common = Object.keys(e).filter((key) => key in a);
    return [...missing, ...extra, ...common.flatMap((key) => differences(a[key], e[key], `${path}.${key}`))];
  }
  return Object.is(actual, expected) ? [] : [`${path}: ${JSON.stringify(actual)} != ${JSON.stringify(expected)}`];
}

function hasNaN(value: unknown): boolean {
  if (typeof value === 'number') return !Number.isFinite(value);
  if (Array.isArray(value)) return value.some(hasNaN);
  if (typeof value === 'object' && value !== null) return Object.values(value).some(hasNaN);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Test-local copies of the environments' recipes (resources_servers/<server>/app.py). The
// environments own theirs; these prove the building blocks reproduce Python.

const mathWithJudge: AggregateMetricsHooks = {
  metrics: (tasks) =>
    computePassMajorityMetrics(tasks, {
      score: (r) => ({
        ...('library_reward' in r ? { symbolic_accuracy: r.library_reward } : {}),
        ...(r.judge_evaluations != null ? { judge_accuracy: r.reward } : {}),
      }),
      answerKey: 'extracted_answer',
    }),
  keyMetrics: (m) => ({
    ...pickMetrics(m, ['mean/input_tokens', 'mean/output_tokens']),
    ...highestKMetrics(m, 'pass@1[avg-of-{k}]'),
    ...highestKMetrics(m, 'pass@{k}', { excludeNames: ['no_answer'] }),
    ...highestKMetrics(m, 'majority@{k}', { excludeNames: ['no_answer'] }),
  }),
};

const mcqa: AggregateMetricsHooks = {
  metrics: (tasks) =>
    computePassMajorityMetrics(tasks, { score: (r) => ({ accuracy: r.reward }), answerKey: 'extracted_answer' }),
  keyMetrics: (m) => ({
    ...pickMetrics(m, ['mean/reward']),
    ...highestKMetrics(m, 'pass@1[avg-of-{k}]', { scoreNames: ['accuracy', 'no_answer'] }),
    ...highestKMetrics(m, 'pass@{k}', { scoreNames: ['no_answer'] }),
    ...highestKMetrics(m, 'majority@{k}', { scoreNames: ['accuracy'] }),
    ...pickMetrics(m, ['pass@1/accuracy']),
  }),
};

const codeGenOptions: PassMajorityOptions = {
  score: (r) => ({ accuracy: (r.reward ?? 0) > 0 }),
  answerKey: 'extracted_model_code',
};
const codeGen: AggregateMetricsHooks = {
  metrics: (tasks) => ({
    ...addAvgSampleStdDev(tasks, computePassMajorityMetrics(tasks, codeGenOptions), codeGenOptions),
    ...computeSubsetMetrics(tasks, 'difficulty', codeGenOptions),
  }),
  keyMetrics: (m) => {
    const key = {
      ...pickMetrics(m, ['mean/input_tokens', 'mean/output_tokens']),
      ...highestKMetrics(m, 'pass@1[avg-of-{k}]', { scoreNames: ['accuracy'] }),
      ...highestKMetrics(m, 'pass@{k}', { scoreNames: ['accuracy'] }),
      ...highestKMetrics(m, 'majority@{k}', { scoreNames: ['accuracy'] }),
    };
    // Per-difficulty headlines: subset keys look like 'easy/pass@...'.
    const prefixes = new Set(
      Object.keys(m)
        .filter((k) => k.includes('/pass@') && /^\p{Ll}/u.test(k))
        .map((k) => k.split('/pass@')[0]!),
    );
    for (const prefix of prefixes) {
      Object.assign(key, highestKMetrics(m, `${prefix}/pass@1[avg-of-{k}]`, { scoreNames: ['accuracy'] }));
    }
    return key;
  },
};

describe('computeAggregateMetrics against NeMo Gym Python (python_reference.json)', () => {
  const cases: Array<[server: string, hooks: AggregateMetricsHooks]> = [
    ['math_with_judge', mathWithJudge],
    ['mcqa', mcqa],
    ['code_gen', codeGen],
    ['example_session_state_mgmt', {}], // no compute_metrics / get_key_metrics overrides
  ];
  for (const [server, hooks] of cases) {
    it(`${server}: the whole answer, key for key`, () => {
      const expected = readFixture(server).reference.aggregate_metrics;
      const actual = computeAggregateMetrics(collectorVerifyResponses(server), hooks);
      expect(differences(actual, expected)).toEqual([]);
      expect(hasNaN(actual)).toBe(false);
      // Through JSON, as the route sends it.
      expect(differences(JSON.parse(JSON.stringify(actual)), expected)).toEqual([]);
    });
  }

  it('the verify_responses reach the hooks grouped by task, with the custom verify fields', () => {
    const seen: VerifyEntry[][] = [];
    computeAggregateMetrics(collectorVerifyResponses('code_gen'), {
      metrics: (tasks) => {
        seen.push(...tasks);
        return {};
      },
    });
    expect(seen).toHaveLength(5);
    expect(seen.every((task) => task.length === 1 && 'extracted_model_code' in task[0]!)).toBe(true);
  });
});

// ---------------------------------------------------------------------------------------------
// CONTRACT.md §9 item 8: the golden cases of NeMo Gym's test_aggregate_metrics.py

function verifyResponses(tasks: number, rollouts: number, reward = (t: number, r: number) => (t + r) % 2): VerifyEntry[] {
  const entries: VerifyEntry[] = [];
  for (let t = 0; t < tasks; t++) {
    for (let r = 0; r < rollouts; r++) entries.push({ _ng_task_index: t, _ng_rollout_index: r, reward: reward(t, r) });
  }
  return entries;
}

describe('computeAggregateMetrics: RewardProfiler baseline', () => {
  it('2 tasks × 4 rollouts with reward (t+r)%2: two groups with the reward statistics', () => {
    const result = computeAggregateMetrics(verifyResponses(2, 4));
    expect(result.group_level_metrics).toHaveLength(2);
    // Task 0 rewards 0,1,0,1: mean 0.5, median (0+1)/2, std = sqrt(4 · 0.25 / 3) = sqrt(1/3).
    expect(result.group_level_metrics[0]).toEqual({
      _ng_task_index: 0,
      'mean/reward': 0.5,
      'max/reward': 1,
      'min/reward': 0,
      'median/reward': 0.5,
      'std/reward': Math.sqrt(1 / 3),
      sample: { agent_ref: { name: 'agent' } },
      num_rollouts: 4,
      expected_num_rollouts: 4,
      missing_num_rollouts: 0,
      reward_profile_completion_pct: 100,
      rollout_infos: [0, 1, 2, 3].map((r) => ({
        rollout_id: `0:${r}`,
        _ng_task_index: 0,
        _ng_rollout_index: r,
        reward: r % 2,
      })),
    });
    expect(result.group_level_metrics[1]!._ng_task_index).toBe(1);
    // All 8 rewards: four 0s and four 1s → std = sqrt(8 · 0.25 / 7) = sqrt(2/7).
    expect(result.agent_metrics).toEqual({
      'mean/reward': 0.5,
      'max/reward': 1,
      'min/reward': 0,
      'median/reward': 0.5,
      'std/reward': Math.sqrt(2 / 7),
    });
    expect(result.key_metrics).toEqual({ 'mean/reward': 0.5 });
  });

  it('all ones: mean/reward is 1 and std 0', () => {
    const result = computeAggregateMetrics(verifyResponses(3, 5, () => 1));
    expect(result.agent_metrics['mean/reward']).toBe(1);
    expect(result.agent_metrics['std/reward']).toBe(0);
    expect(result.key_metrics).toEqual({ 'mean/reward': 1 });
  });

  it('empty input: all empty', () => {
    expect(computeAggregateMetrics([])).toEqual({ group_level_metrics: [], agent_metrics: {}, key_metrics: {} });
    expect(computeAggregateMetrics([], mathWithJudge)).toEqual({ group_level_metrics: [], agent_metrics: {}, key_metrics: {} });
  });

  it('merges response.usage into the columns (mean/input_tokens), drops strings, dicts and nulls, counts bools', () => {
    const result = computeAggregateMetrics([
      {
        _ng_task_index: 0,
        _ng_rollout_index: 0,
        reward: 1,
        resolved: true,
        extracted_answer: '8',
        judge_evaluations: null,
        agent_ref: { name: 'a' },
        response: { usage: { input_tokens: 60, output_tokens: 30, input_tokens_details: { cached_tokens: 0 } } },
      },
      {
        _ng_task_index: 1,
        _ng_rollout_index: 0,
        reward: 0,
        resolved: false,
        response: { usage: { input_tokens: 40, output_tokens: 10 } },
      },
    ]);
    expect(result.agent_metrics['mean/input_tokens']).toBe(50);
    expect(result.agent_metrics['mean/resolved']).toBe(0.5);
    expect(Object.keys(result.agent_metrics).filter((k) => k.startsWith('mean/'))).toEqual([
      'mean/reward',
      'mean/resolved',
      'mean/input_tokens',
      'mean/output_tokens',
    ]);
    expect(result.key_metrics).toEqual({
      'mean/reward': 0.5,
      'mean/resolved': 0.5,
      'mean/input_tokens': 50,
      'mean/output_tokens': 20,
    });
    // rollout_infos: index fields, reward, the usage numbers, then the other numbers.
    expect(result.group_level_metrics[0]!.rollout_infos).toEqual([
      {
        rollout_id: '0:0',
        _ng_task_index: 0,
        _ng_rollout_index: 0,
        reward: 1,
        input_tokens: 60,
        output_tokens: 30,
        resolved: 1,
      },
    ]);
  });

  it('single rollout per task: std becomes 0, except for a column the rollout lacks', () => {
    const result = computeAggregateMetrics([
      { _ng_task_index: 0, _ng_rollout_index: 0, reward: 1, score: 0.25 },
      { _ng_task_index: 1, _ng_rollout_index: 0, reward: 0 },
    ]);
    const [first, second] = result.group_level_metrics;
    expect(first).toMatchObject({ 'std/reward': 0, 'std/score': 0, 'mean/score': 0.25, 'median/score': 0.25 });
    expect(second).toMatchObject({ 'std/reward': 0 });
    expect(Object.keys(second!).some((key) => key.endsWith('/score'))).toBe(false);
    // Over both rows the reward has a std (sqrt(0.5)), so the score's NaN std (one value) is dropped.
    expect(result.agent_metrics['std/reward']).toBe(Math.SQRT1_2);
    expect(result.agent_metrics['mean/score']).toBe(0.25);
    expect('std/score' in result.agent_metrics).toBe(false);
    expect(hasNaN(result)).toBe(false);
  });

  it('matches pandas to the bit on 13 rollouts with missing values (numpy pairwise sums)', () => {
    // Values and expected results printed by pandas 3.0.6 / numpy 2.4.6 (DataFrame.from_records,
    // .mean(), .median(), .std()); `score` is missing on 4 rows.
    const rows = [
      { reward: 0.1, score: 0.3333333333333333 }, { reward: 0.27 },
      { reward: 0.37000000000000005, score: 0.2 }, { reward: 0.4, score: 0.16666666666666666 },
      { reward: 0.5700000000000001, score: 0.14285714285714285 }, { reward: 0.6700000000000002 },
      { reward: 0.7000000000000001, score: 0.1111111111111111 }, { reward: 0.8700000000000001, score: 0.1 },
      { reward: 0.97, score: 0.09090909090909091 }, { reward: 1.0 },
      { reward: 1.1700000000000002, score: 0.07692307692307693 }, { reward: 1.2700000000000002, score: 0.07142857142857142 },
      { reward: 1.3, score: 0.06666666666666667 },
    ];
    const result = computeAggregateMetrics(rows.map((row, r) => ({ _ng_task_index: 0, _ng_rollout_index: r, ...row })));
    expect(result.agent_metrics).toMatchObject({
      'mean/reward': 0.7430769230769232,
      'median/reward': 0.7000000000000001,
      'std/reward': 0.39105380310524657,
      'mean/score': 0.13598956598956596,
      'median/score': 0.10555555555555556,
      'std/score': 0.08194796344851842,
    });
  });

  it('sums like numpy, not left to right: 13 rewards where the two differ', () => {
    // pandas: mean 6.353461538461537 (naive summation would give 6.353461538461539), std 2.948404472913687.
    const rewards = [8.655, 4.727, 7.188, 8.788, 7.141, 9.211, 3.95, 8.009, 4.446, 9.356, 8.789, 0.975, 1.36];
    const result = computeAggregateMetrics(rewards.map((reward, r) => ({ _ng_task_index: 0, _ng_rollout_index: r, reward })));
    expect(result.agent_metrics['mean/reward']).toBe(6.353461538461537);
    expect(result.agent_metrics['std/reward']).toBe(2.948404472913687);
  });

  it('one rollout in all: agent std 0 as well', () => {
    const result = computeAggregateMetrics([{ _ng_task_index: 0, _ng_rollout_index: 0, reward: 0.5 }]);
    expect(result.agent_metrics).toEqual({
      'mean/reward': 0.5,
      'max/reward': 0.5,
      'min/reward': 0.5,
      'median/reward': 0.5,
      'std/reward': 0,
    });
  });

  it('no histogram keys anywhere', () => {
    const result = computeAggregateMetrics(verifyResponses(2, 3));
    for (const group of result.group_level_metrics) expect(Object.keys(group).some((k) => k.startsWith('histogram'))).toBe(false);
    expect(Object.keys(result.agent_metrics).some((k) => k.startsWith('histogram'))).toBe(false);
  });

  it('orders groups by task index and rollout_infos by rollout index, whatever the input order', () => {
    const result = computeAggregateMetrics([
      { _ng_task_index: 10, _ng_rollout_index: 1, reward: 0.5 },
      { _ng_task_index: 5, _ng_rollout_index: 1, reward: 0 },
      { _ng_task_index: 10, _ng_rollout_index: 0, reward: 0.5 },
      { _ng_task_index: 5, _ng_rollout_index: 0, reward: 1 },
    ]);
    expect(result.group_level_metrics.map((g) => g._ng_task_index)).toEqual([5, 10]);
    const infos = result.group_level_metrics[0]!.rollout_infos as Array<Record<string, unknown>>;
    expect(infos.map((info) => info.rollout_id)).toEqual(['5:0', '5:1']);
  });

  it('missing indices default to 0 (vr.get(key, 0))', () => {
    const result = computeAggregateMetrics([{ reward: 1 }]);
    expect(result.group_level_metrics[0]).toMatchObject({ _ng_task_index: 0, 'mean/reward': 1 });
  });

  it('a duplicate (task, rollout) pair is an UNPROCESSABLE RolloutError (Python: ValueError → 500)', () => {
    const entries = [...verifyResponses(1, 2), { _ng_task_index: 0, _ng_rollout_index: 1, reward: 1 }];
    let error: unknown;
    try {
      computeAggregateMetrics(entries);
    } catch (e) {
      error = e;
    }
    expect(RolloutError.isInstance(error)).toBe(true);
    expect((error as RolloutError).code).toBe('UNPROCESSABLE');
    expect((error as RolloutError).message).toBe('Duplicate materialized input row for rollout key (0, 1)');
  });

  it('rejects a non-integer task index', () => {
    expect(() => computeAggregateMetrics([{ _ng_task_index: 'a' as unknown as number, reward: 1 }])).toThrow(RolloutError);
  });
});

describe('computeAggregateMetrics: environment hooks', () => {
  it('metrics(tasks) gets the entries by task (tasks ascending, entries in input order) and is merged into agent_metrics', () => {
    let received: VerifyEntry[][] = [];
    const entries: VerifyEntry[] = [
      { _ng_task_index: 1, _ng_rollout_index: 1, reward: 1, judgement: 'x' },
      { _ng_task_index: 0, _ng_rollout_index: 0, reward: 0, judgement: 'y' },
      { _ng_task_index: 1, _ng_rollout_index: 0, reward: 0, judgement: 'z' },
    ];
    const result = computeAggregateMetrics(entries, {
      metrics: (tasks) => {
        received = tasks;
        return { custom_metric: 42, 'mean/reward': 7 };
      },
    });
    expect(received).toEqual([[entries[1]], [entries[0], entries[2]]]);
    expect(result.agent_metrics.custom_metric).toBe(42);
    expect(result.agent_metrics['mean/reward']).toBe(7); // the hook's value wins, as dict.update does
    expect(result.key_metrics).toEqual({ 'mean/reward': 7 });
  });

  it('per_task_metrics goes into the matching groups, not into agent_metrics', () => {
    const result = computeAggregateMetrics(verifyResponses(2, 2), {
      metrics: (): EnvironmentMetrics => ({
        overall: 1,
        per_task_metrics: [
          { _ng_task_index: 1, difficulty_score: 0.9 },
          { _ng_task_index: 7, difficulty_score: 0.1 },
        ],
      }),
    });
    expect('per_task_metrics' in result.agent_metrics).toBe(false);
    expect(result.agent_metrics.overall).toBe(1);
    expect('difficulty_score' in result.group_level_metrics[0]!).toBe(false);
    expect(result.group_level_metrics[1]!.difficulty_score).toBe(0.9);
  });

  it('keyMetrics(agentMetrics) replaces the mean/* default', () => {
    const result = computeAggregateMetrics(verifyResponses(3, 4), {
      metrics: (tasks) => ({ 'pass@k': tasks.filter((t) => t.some((r) => r.reward === 1)).length / tasks.length }),
      keyMetrics: (m) => pickMetrics(m, ['pass@k']),
    });
    expect(result.key_metrics).toEqual({ 'pass@k': 1 });
  });
});

// ---------------------------------------------------------------------------------------------
// The pass@k family, against values worked out by hand

const tasksOf = (rewards: number[][], answers?: Array<Array<string | null>>): VerifyEntry[][] =>
  rewards.map((task, t) =>
    task.map((reward, r) => ({ reward, ...(answers ? { extracted_answer: answers[t]![r] ?? null } : {}) })),
  );

describe('computePassMajorityMetrics', () => {
  it('binary pass@k is 1 - C(n_incorrect, k)/C(n, k) per task, averaged, ×100', () => {
    const m = computePassMajorityMetrics(tasksOf([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]]));
    // task 0: never incorrect → 1 for every k; task 1: 1 - C(4,k)/C(4,k) = 0.
    // task 2 (n=4, 2 incorrect): k=1: 1 - 2/4 = 0.5; k=2: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6;
    //        k=3, 4: fewer than k incorrect → 1.
    expect(m['pass@1/accuracy']).toBeCloseTo((100 * (1 + 0 + 0.5)) / 3, 12); // 50
    expect(m['pass@2/accuracy']).toBeCloseTo((100 * (1 + 0 + 5 / 6)) / 3, 12); // 61.11…
    expect(m['pass@3/accuracy']).toBeCloseTo(200 / 3, 12);
    expect(m['pass@4/accuracy']).toBeCloseTo(200 / 3, 12);
    // pass@1[avg-of-k]: mean of the first k per task. k=2: (1 + 0 + 0.5)/3; k=3: (1 + 0 + 2/3)/3.
    expect(m['pass@1[avg-of-2]/accuracy']).toBeCloseTo(50, 12);
    expect(m['pass@1[avg-of-3]/accuracy']).toBeCloseTo((100 * (1 + 2 / 3)) / 3, 12);
    // per_sample_aggregate: rollout i across tasks: [1,0,1], [1,0,0], [1,0,1], [1,0,0].
    expect(m.per_sample_aggregate).toEqual({ accuracy: [200 / 3, 100 / 3, 200 / 3, 100 / 3] });
    // std across runs for k=2: [66.67, 33.33] → mean 50, std = sqrt(2 · (50/3)² / 1) = 50·√2/3, err = std/√2.
    expect(m['pass@1[avg-of-2]/accuracy/std_dev_across_runs']).toBeCloseTo((50 * Math.SQRT2) / 3, 12);
    expect(m['pass@1[avg-of-2]/accuracy/std_err_across_runs']).toBeCloseTo(50 / 3, 12);
    // Without answerKey: no majority@k and no no_answer.
    expect(Object.keys(m).some((k) => k.startsWith('majority@') || k.includes('no_answer'))).toBe(false);
  });

  it('binary pass@k with n = 10, 7 incorrect, k = 3: 1 - C(7,3)/C(10,3) = 1 - 35/120', () => {
    const m = computePassMajorityMetrics(tasksOf([[1, 0, 0, 1, 0, 0, 0, 1, 0, 0]]));
    expect(m['pass@3/accuracy']).toBe(100 * (1 - 35 / 120));
    expect(m['pass@8/accuracy']).toBe(100); // 7 < 8
    expect(m['pass@7/accuracy']).toBe(100 * (1 - 1 / 120)); // C(7,7)/C(10,7) = 1/120
  });

  it('binary pass@k stays exact beyond 2^53 (n = 64): C(40,32)/C(64,32) computed on integers', () => {
    const m = computePassMajorityMetrics(tasksOf([Array.from({ length: 64 }, (_, i) => (i < 24 ? 1 : 0))]));
    // C(40,32) = C(40,8) = 76904685, C(64,32) = 1832624140942590534: Python divides the exact ints.
    expect(comb(40, 32)).toBe(76904685n);
    expect(comb(64, 32)).toBe(1832624140942590534n);
    expect(m['pass@32/accuracy']).toBe(100 * (1 - trueDivide(76904685n, 1832624140942590534n)));
    expect(m['pass@32/accuracy']).toBeCloseTo(100 * (1 - 76904685 / 1.832624140942590534e18), 12);
  });

  it('non-binary scores: pass@k is the max of the first k', () => {
    const m = computePassMajorityMetrics(tasksOf([[0.2, 0.9, 0.5], [0.4, 0.1, 1]]));
    // k=1: (0.2 + 0.4)/2; k=2: (0.9 + 0.4)/2; k=3: (0.9 + 1)/2.
    expect(m['pass@1/accuracy']).toBeCloseTo(30, 12);
    expect(m['pass@2/accuracy']).toBeCloseTo(65, 12);
    expect(m['pass@3/accuracy']).toBeCloseTo(95, 12);
    // avg-of-2: ((0.2+0.9)/2 + (0.4+0.1)/2)/2 = (0.55 + 0.25)/2 = 0.4.
    expect(m['pass@1[avg-of-2]/accuracy']).toBeCloseTo(40, 12);
  });

  it('a task with fewer rollouts than k is left out of pass@k but not of avg-of-k', () => {
    const m = computePassMajorityMetrics(tasksOf([[1, 0], [0]]));
    expect(m['pass@2/accuracy']).toBe(100); // only task 0: 1 incorrect < 2
    expect(m['pass@1[avg-of-2]/accuracy']).toBe(25); // (0.5 + 0)/2
    expect(m.per_sample_aggregate).toEqual({ accuracy: [50, 0] });
  });

  it('majority@k: the most frequent (answer, score) pair among rollouts with an answer', () => {
    const m = computePassMajorityMetrics(
      tasksOf(
        [
          [1, 1, 0],
          [0, 0, 1],
        ],
        [
          ['A', 'A', 'B'],
          ['C', 'C', 'D'],
        ],
      ),
      { answerKey: 'extracted_answer' },
    );
    // task 0: A×2 (score 1) beats B → 1; task 1: C×2 (score 0) beats D → 0.
    expect(m['majority@3/accuracy']).toBe(50);
    // k=1: the first answer alone: A (1) and C (0).
    expect(m['majority@1/accuracy']).toBe(50);
  });

  it('majority@k ties: the mean score of the tied pairs; no answer at all scores 0', () => {
    const m = computePassMajorityMetrics(
      tasksOf(
        [
          [1, 0, 0, 1],
          [1, 1],
          [0, 0],
        ],
        [
          ['A', 'B', 'C', 'A'],
          ['X', 'Y'],
          [null, null],
        ],
      ),
      { answerKey: 'extracted_answer' },
    );
    // k=2: task 0: (A,1) and (B,0) tie once each → 0.5; task 1: (X,1), (Y,1) tie → 1; task 2: no answers → 0.
    expect(m['majority@2/accuracy']).toBe((100 * (0.5 + 1 + 0)) / 3);
    // k=3: task 0: A, B, C tie → (1 + 0 + 0)/3; task 1 has 2 rollouts → still 1.
    expect(m['majority@3/accuracy']).toBeCloseTo((100 * (1 / 3 + 1 + 0)) / 3, 12);
    // k=4: task 0: (A,1)×2 wins → 1.
    expect(m['majority@4/accuracy']).toBeCloseTo((100 * (1 + 1 + 0)) / 3, 12);
    // no_answer is a binary score: task 2 has it on both rollouts.
    expect(m['pass@1[avg-of-2]/no_answer']).toBeCloseTo(100 / 3, 12);
    expect(m['majority@2/no_answer']).toBe(0); // only rollouts with an answer vote
    expect(m.per_sample_aggregate).toEqual({
      accuracy: [(100 * 2) / 3, (100 * 1) / 3, 0, 100],
      no_answer: [100 / 3, 100 / 3, 0, 0],
    });
  });

  it('same answer with different scores counts as different pairs', () => {
    const m = computePassMajorityMetrics(tasksOf([[1, 0, 0]], [['A', 'A', 'A']]), { answerKey: 'extracted_answer' });
    // (A,1)×1, (A,0)×2 → 0.
    expect(m['majority@3/accuracy']).toBe(0);
  });

  it('several score names, bools as 0/1, names sorted', () => {
    const tasks: VerifyEntry[][] = [
      [
        { reward: 1, library_reward: 1 },
        { reward: 0, library_reward: 0 },
      ],
      [
        { reward: 0, library_reward: 1 },
        { reward: 1, library_reward: 1 },
      ],
    ];
    const m = computePassMajorityMetrics(tasks, {
      score: (r) => ({ symbolic_accuracy: r.library_reward, accuracy: r.reward === 1 }),
    });
    expect(Object.keys(m).slice(0, 4)).toEqual([
      'pass@1/accuracy',
      'pass@1[avg-of-1]/accuracy',
      'pass@1/symbolic_accuracy',
      'pass@1[avg-of-1]/symbolic_accuracy',
    ]);
    expect(m['pass@1/accuracy']).toBe(50);
    expect(m['pass@1/symbolic_accuracy']).toBe(75); // task 0: 1 - 1/2, task 1: 1
  });

  it('empty input gives {}', () => {
    expect(computePassMajorityMetrics([])).toEqual({});
  });
});

describe('addAvgSampleStdDev, computeSubsetMetrics, highestKMetrics', () => {
  it('avg_sample_std_dev: mean over tasks of the per-task std (ddof 1) of the first k', () => {
    const tasks = tasksOf([[1, 0, 1], [1, 1, 1]]);
    const metrics = addAvgSampleStdDev(tasks, {}, {});
    // k=2: task 0 [1,0] std = sqrt(0.5), task 1 [1,1] std 0 → sqrt(0.5)/2.
    expect(metrics['pass@1[avg-of-2]/accuracy/avg_sample_std_dev']).toBe(Math.SQRT1_2 / 2);
    // k=3: task 0 [1,0,1]: mean 2/3, var = (1/9 + 4/9 + 1/9)/2 = 1/3 → sqrt(1/3)/2.
    expect(metrics['pass@1[avg-of-3]/accuracy/avg_sample_std_dev']).toBeCloseTo(Math.sqrt(1 / 3) / 2, 15);
    expect(addAvgSampleStdDev(tasksOf([[1], [0]]), {}, {})).toEqual({}); // one rollout: nothing
  });

  it('subsets by the first entry of each task, falsy values left out, per_sample_aggregate dropped', () => {
    const tasks: VerifyEntry[][] = [
      [{ reward: 1, difficulty: 'easy' }],
      [{ reward: 0, difficulty: 'hard' }],
      [{ reward: 1, difficulty: 'easy' }],
      [{ reward: 1, difficulty: null }],
      [{ reward: 1, difficulty: '' }],
    ];
    expect(computeSubsetMetrics(tasks, 'difficulty')).toEqual({
      'easy/pass@1/accuracy': 100,
      'easy/pass@1[avg-of-1]/accuracy': 100,
      'hard/pass@1/accuracy': 0,
      'hard/pass@1[avg-of-1]/accuracy': 0,
    });
  });

  it('highestKMetrics keeps the highest k of a pattern and skips the stat suffixes', () => {
    const m = computePassMajorityMetrics(tasksOf([[1, 0, 1], [0, 0, 1]], [['1', '2', '1'], [null, '3', '4']]), {
      answerKey: 'extracted_answer',
    });
    expect(Object.keys(highestKMetrics(m, 'pass@{k}'))).toEqual(['pass@3/accuracy', 'pass@3/no_answer']);
    expect(Object.keys(highestKMetrics(m, 'pass@{k}', { excludeNames: ['no_answer'] }))).toEqual(['pass@3/accuracy']);
    expect(Object.keys(highestKMetrics(m, 'pass@1[avg-of-{k}]'))).toEqual([
      'pass@1[avg-of-3]/accuracy',
      'pass@1[avg-of-3]/no_answer',
    ]);
    expect(highestKMetrics(m, 'majority@{k}', { scoreNames: ['accuracy'] })).toEqual({
      'majority@3/accuracy': m['majority@3/accuracy'],
    });
    expect(highestKMetrics(m, 'nothing@{k}')).toEqual({});
    const subset = { 'easy/pass@1[avg-of-2]/accuracy': 1, 'easy/pass@1[avg-of-4]/accuracy': 2, 'pass@1[avg-of-8]/accuracy': 3 };
    expect(highestKMetrics(subset, 'easy/pass@1[avg-of-{k}]')).toEqual({ 'easy/pass@1[avg-of-4]/accuracy': 2 });
  });
});

describe('Python arithmetic', () => {
  it('pySum is CPython 3.12+ sum(): Neumaier-compensated', () => {
    // Plain left-to-right addition gives 0; CPython's sum gives 2.
    expect(pySum([1, 1e100, 1, -1e100])).toBe(2);
    expect(pySum([0.1, 0.2, 0.3])).toBe(0.6); // naive: 0.6000000000000001
    expect(pySum([])).toBe(0);
  });

  it('npSum is numpy pairwise summation (8 accumulators from 8 values on)', () => {
    const values = Array.from({ length: 20 }, (_, i) => 0.1 * (i + 1));
    let naive = 0;
    for (const v of values) naive += v;
    expect(npSum(values.slice(0, 5))).toBe(values.slice(0, 5).reduce((a, b) => a + b, 0));
    expect(Math.abs(npSum(values) - naive)).toBeLessThan(1e-12);
  });

  it('trueDivide rounds the exact quotient once, half to even, like Python int / int', () => {
    expect(trueDivide(2n ** 53n + 1n, 1n)).toBe(2 ** 53); // tie → even
    expect(trueDivide(2n ** 53n + 3n, 1n)).toBe(2 ** 53 + 4); // tie → even
    expect(trueDivide(10n ** 30n, 3n * 10n ** 30n)).toBe(1 / 3);
    expect(trueDivide(3n * 2n ** 100n, 2n ** 102n)).toBe(0.75);
    expect(trueDivide(0n, 5n)).toBe(0);
  });
});
