import { deflateSync } from 'node:zlib';
import { computeAggregateMetrics, SessionTools } from '@rollserve/core';
import type { EnvironmentContext, NeMoGymResponse, VerifyEntry } from '@rollserve/core';
import { expectDeepClose, pythonReference, referenceCases } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CodeConfig, codeEnvironment, type CodeResources } from './environment.ts';
import codeDefault from './index.ts';

// the environment's own setup and close, as a server runs them
let resources: CodeResources;
beforeAll(async () => {
  resources = await codeEnvironment.setup!(CodeConfig.parse({}));
});
afterAll(() => codeEnvironment.close!(resources));

function context(config: Record<string, unknown> = {}): EnvironmentContext<CodeConfig> {
  const logger = { info() {}, warn() {}, error() {}, debug() {}, child: () => logger };
  return {
    session: { id: 'test', state: {}, onClose() {} },
    config: CodeConfig.parse({ unit_test_timeout_secs: 2, ...config }),
    logger: logger as never,
    signal: new AbortController().signal,
    tools: new SessionTools(),
    resources,
  };
}

function response(text: string, reasoning: string[] = []): NeMoGymResponse {
  return {
    id: 'resp_1',
    output: [
      ...(reasoning.length ? [{ id: 'rs_1', type: 'reasoning', summary: reasoning.map((t) => ({ type: 'summary_text', text: t })) }] : []),
      { id: 'msg_1', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] },
    ],
    usage: { input_tokens: 10, output_tokens: 20, total_tokens: 30 },
  };
}

const sumRow = (extra: Record<string, unknown> = {}) => ({
  verifier_metadata: { unit_tests: { inputs: ['1 2\n', '5 5\n'], outputs: ['3\n', '10\n'], fn_name: null }, ...extra },
});
const SUM = 'Here you go:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```';

describe('the environment definition', () => {
  it('is the default export: code, coding, stateless re-verification', () => {
    expect(codeDefault).toBe(codeEnvironment);
    expect(codeEnvironment.name).toBe('code');
    expect(codeEnvironment.domain).toBe('coding');
    expect(codeEnvironment.reverifyMode).toBe('stateless');
    expect(codeEnvironment.tools).toEqual({});
  });

  it('takes code_gen YAML config keys with code_gen defaults', () => {
    const config = CodeConfig.parse({ num_processes: 8, unit_test_timeout_secs: 10, debug: false });
    expect(config).toMatchObject({ num_processes: 8, unit_test_timeout_secs: 10, reasoning_format_penalty: 0, memory_limit_mib: 4096 });
  });
});

describe('verify', () => {
  const nulls = {
    extracted_model_output: null,
    extracted_model_code: null,
    result: null,
    metadata: null,
    unit_tests_time_taken: null,
    reasoning_format_violation_rate: 0,
  };

  it('gives reward 0 and null extras for a blank answer, and keeps the answer when there is no code', async () => {
    expect(await codeEnvironment.verify(sumRow({ difficulty: 'easy' }), response(' \n '), context())).toEqual({
      reward: 0,
      ...nulls,
      difficulty: 'easy',
    });
    const noCode = await codeEnvironment.verify(sumRow(), response('print(1)'), context());
    expect(noCode).toEqual({ reward: 0, ...nulls, extracted_model_output: 'print(1)', difficulty: null });
  });

  it('runs the code and gives 1 when every test passes', async () => {
    const answer = await codeEnvironment.verify(sumRow(), response(SUM), context());
    expect(answer).toMatchObject({
      reward: 1,
      extracted_model_output: SUM,
      extracted_model_code: 'a, b = map(int, input().split())\nprint(a + b)',
      result: [true, true],
      reasoning_format_violation_rate: 0,
      difficulty: null,
    });
    expect(Object.keys(answer.metadata as object)).toEqual(['execution time']);
    expect(answer.unit_tests_time_taken).toBeGreaterThan(0);
  });

  it('replaces the reward by reasoning_format_penalty on a think-tag violation', async () => {
    const config = { reasoning_format_penalty: -0.5 };
    const inText = await codeEnvironment.verify(sumRow(), response(`</think>${SUM}`), context(config));
    expect(inText).toMatchObject({ reward: -0.5, reasoning_format_violation_rate: 1, result: [true, true] });
    const twice = await codeEnvironment.verify(sumRow(), response(SUM, ['<think>a', '<think>b']), context(config));
    expect(twice).toMatchObject({ reward: -0.5, reasoning_format_violation_rate: 1 });
  });

  it('reads packed unit tests (base64 zlib JSON) as code_gen does', async () => {
    const packed = deflateSync(JSON.stringify({ inputs: ['2 2'], outputs: ['4'] })).toString('base64');
    const row = { verifier_metadata: { unit_tests: { packed, fn_name: null } } };
    const answer = await codeEnvironment.verify(row, response(SUM), context());
    expect(answer).toMatchObject({ reward: 1, result: [true] });
  });

  it('rejects a row without unit tests', () => {
    expect(codeEnvironment.row.safeParse({ verifier_metadata: {} }).success).toBe(false);
    expect(codeEnvironment.row.safeParse(sumRow()).success).toBe(true);
  });
});

describe('metrics', () => {
  it('match /aggregate_metrics of the Python server for the fixture rollouts', () => {
    const python = pythonReference('code_gen').aggregate_metrics as ReturnType<typeof computeAggregateMetrics>;
    const entries: VerifyEntry[] = referenceCases('code_gen').map((c, i) => ({
      _ng_task_index: i,
      _ng_rollout_index: 0,
      agent_ref: { name: 'agent' },
      ...c.reference.extras,
      reward: c.reference.reward,
      response: { usage: (c.recorded.response as { usage?: unknown }).usage },
    }));
    const ours = computeAggregateMetrics(entries, codeEnvironment);
    expectDeepClose(ours.agent_metrics, python.agent_metrics);
    expectDeepClose(ours.key_metrics, python.key_metrics);
    expectDeepClose(ours.group_level_metrics, python.group_level_metrics);
  });

  it('adds per-difficulty subsets, avg_sample_std_dev and subset headlines', () => {
    const entry = (task: number, r: number, reward: number, difficulty: string | null): VerifyEntry => ({
      _ng_task_index: task,
      _ng_rollout_index: r,
      reward,
      difficulty,
      extracted_model_code: reward > 0 ? 'good' : `bad${r}`,
    });
    const tasks = [
      [entry(0, 0, 1, 'easy'), entry(0, 1, 0, 'easy')],
      [entry(1, 0, 0, 'hard'), entry(1, 1, 0, 'hard')],
    ];
    const metrics = codeEnvironment.metrics!(tasks);
    expect(metrics['pass@2/accuracy']).toBe(50);
    expect(metrics['pass@1[avg-of-2]/accuracy']).toBe(25);
    expect(metrics['easy/pass@2/accuracy']).toBe(100);
    expect(metrics['hard/pass@1[avg-of-2]/accuracy']).toBe(0);
    expect(metrics).toHaveProperty('pass@1[avg-of-2]/accuracy/avg_sample_std_dev');
    const key = codeEnvironment.keyMetrics!({ ...metrics, 'mean/input_tokens': 5, 'mean/reward': 0.25 });
    expect(Object.keys(key).sort()).toEqual(
      [
        'easy/pass@1[avg-of-2]/accuracy',
        'hard/pass@1[avg-of-2]/accuracy',
        'majority@2/accuracy',
        'mean/input_tokens',
        'pass@1[avg-of-2]/accuracy',
        'pass@2/accuracy',
      ].sort(),
    );
  });
});
