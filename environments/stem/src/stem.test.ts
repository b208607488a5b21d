import { readFileSync } from 'node:fs';
import { computeAggregateMetrics, type EnvironmentContext, type NeMoGymResponse, type VerifyEntry } from '@rollserve/core';
import { expectDeepClose, nemoGymFixture, pythonReference, readJsonl, referenceCases } from '@rollserve/testing';
import { describe, expect, it } from 'vitest';
import stem, { StemConfig, StemRow, verifyStem } from './index.ts';

const dataDir = new URL('../data/', import.meta.url);

function response(output: unknown[]): NeMoGymResponse {
  return { id: 'resp_test', output: output as NeMoGymResponse['output'] };
}

function message(text: string): Record<string, unknown> {
  return { id: 'msg_1', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] };
}

const ABCD_ROW = StemRow.parse({
  options: [{ A: 'opt1' }, { B: 'opt2' }, { C: 'opt3' }, { D: 'opt4' }],
  expected_answer: 'B',
});

/** Python's response key set: the row echo plus exactly these. */
const EXTRA_KEYS = ['expected_answer', 'extracted_answer', 'reward'];

describe('re-verifying the recorded mcqa rollouts', () => {
  const cases = referenceCases('mcqa');

  it.each(cases.map((c, i) => [i, c] as const))('example row %i gives python_reference reward and extras', (_i, c) => {
    const result = verifyStem(StemRow.parse(c.row), c.recorded.response as NeMoGymResponse);
    expect(Object.keys(result).sort()).toEqual(EXTRA_KEYS);
    expect(result.reward).toBe(c.reference.reward);
    expect({ expected_answer: result.expected_answer, extracted_answer: result.extracted_answer }).toEqual(c.reference.extras);
  });

  it('follows today’s parsing for the row recorded before the fix (rollout 2: C, 1.0)', () => {
    const c = cases.find((x) => x.reference.recorded_rollout_index === 2)!;
    expect(c.recorded.reward).toBe(0);
    expect(verifyStem(StemRow.parse(c.row), c.recorded.response as NeMoGymResponse)).toMatchObject({ reward: 1, extracted_answer: 'C' });
  });

  it('gives the recorded reward and extras for every template_metadata rollout', () => {
    const rows = readJsonl(nemoGymFixture('mcqa', 'example_with_template_metadata.jsonl'));
    const rollouts = readJsonl(nemoGymFixture('mcqa', 'example_rollouts_with_template_metadata.jsonl'));
    expect(rollouts).toHaveLength(5);
    const prompt = (r: Record<string, unknown>) => JSON.stringify((r.responses_create_params as { input: Array<{ content: unknown }> }).input[0]!.content);
    for (const rollout of rollouts) {
      const row = rows.find((r) => prompt(r) === prompt(rollout));
      expect(row).toBeDefined();
      const result = verifyStem(StemRow.parse(row), rollout.response as NeMoGymResponse);
      expect(result).toEqual({ reward: rollout.reward, expected_answer: rollout.expected_answer, extracted_answer: rollout.extracted_answer });
    }
  });

  it('ships the mcqa example data: 5 rows each, the same as the fixtures', () => {
    for (const file of ['example.jsonl', 'example_rollouts.jsonl', 'example_with_template_metadata.jsonl', 'example_rollouts_with_template_metadata.jsonl']) {
      const ours = readFileSync(new URL(file, dataDir), 'utf8');
      expect(ours).toBe(readFileSync(nemoGymFixture('mcqa', file), 'utf8'));
      expect(ours.trim().split('\n')).toHaveLength(5);
    }
    const metrics = JSON.parse(readFileSync(new URL('example_metrics.json', dataDir), 'utf8')) as Record<string, unknown>;
    expect(metrics['Number of examples']).toBe(5);
    for (const line of readFileSync(new URL('example.jsonl', dataDir), 'utf8').trim().split('\n')) {
      expect(StemRow.safeParse(JSON.parse(line)).success).toBe(true);
    }
  });
});

describe('/aggregate_metrics: metrics and keyMetrics as mcqa', () => {
  it('reproduces python_reference.json for the 5 rollouts', () => {
    const reference = pythonReference('mcqa').aggregate_metrics as {
      agent_metrics: Record<string, unknown>;
      key_metrics: Record<string, unknown>;
      group_level_metrics: Array<Record<string, unknown>>;
    };
    const entries: VerifyEntry[] = referenceCases('mcqa').map((c, task) => {
      const result = verifyStem(StemRow.parse(c.row), c.recorded.response as NeMoGymResponse);
      const { responses_create_params: _params, ...row } = c.row;
      return {
        ...row,
        ...result,
        agent_ref: { type: 'responses_api_agents', name: 'mcqa_simple_agent' },
        _ng_task_index: task,
        _ng_rollout_index: 0,
        response: { usage: (c.recorded.response as { usage: unknown }).usage },
      };
    });
    const answer = computeAggregateMetrics(entries, stem);
    expectDeepClose(answer.agent_metrics, reference.agent_metrics);
    expectDeepClose(answer.key_metrics, reference.key_metrics);
    expect(Object.keys(answer.key_metrics).sort()).toEqual(Object.keys(reference.key_metrics).sort());
    expectDeepClose(answer.group_level_metrics, reference.group_level_metrics);
  });

  it('picks the highest k for the key metrics', () => {
    const tasks = [
      [
        { _ng_task_index: 0, _ng_rollout_index: 0, reward: 1, extracted_answer: 'A' },
        { _ng_task_index: 0, _ng_rollout_index: 1, reward: 1, extracted_answer: 'A' },
      ],
      [
        { _ng_task_index: 1, _ng_rollout_index: 0, reward: 0, extracted_answer: 'B' },
        { _ng_task_index: 1, _ng_rollout_index: 1, reward: 1, extracted_answer: 'C' },
      ],
    ];
    const agent: Record<string, unknown> = { 'mean/reward': 0.75, ...stem.metrics!(tasks) };
    expect(Object.keys(stem.keyMetrics!(agent)).sort()).toEqual(
      ['majority@2/accuracy', 'mean/reward', 'pass@1/accuracy', 'pass@1[avg-of-2]/accuracy', 'pass@1[avg-of-2]/no_answer', 'pass@2/no_answer'].sort(),
    );
    expect(agent['pass@1[avg-of-2]/accuracy']).toBe(75);
  });
});

describe('the environment definition', () => {
  const ctx = (config: Record<string, unknown> = {}) => ({ config: StemConfig.parse(config) }) as unknown as EnvironmentContext<StemConfig>;

  it('is stateless for reverify, in the knowledge domain, with no tools', () => {
    expect(stem.name).toBe('stem');
    expect(stem.domain).toBe('knowledge');
    expect(stem.reverifyMode).toBe('stateless');
    expect(stem.tools).toEqual({});
  });

  it('lets the config grading_mode override the row', async () => {
    const text = 'I think the answer is B.\n\nAnswer: B';
    const row = { ...ABCD_ROW, grading_mode: 'strict_single_letter_boxed' as const };
    expect(await stem.verify(row, response([message(text)]), ctx())).toMatchObject({ reward: 0, extracted_answer: null });
    expect(await stem.verify(row, response([message(text)]), ctx({ grading_mode: 'lenient_answer_colon' }))).toMatchObject({
      reward: 1,
      extracted_answer: 'B',
    });
  });

  it('upper-cases and trims the gold answer; an empty gold never scores', () => {
    const out = response([message('\\boxed{B}')]);
    expect(verifyStem({ ...ABCD_ROW, expected_answer: ' b ' }, out)).toEqual({ reward: 1, expected_answer: 'B', extracted_answer: 'B' });
    expect(verifyStem({ ...ABCD_ROW, expected_answer: null }, out)).toEqual({ reward: 0, expected_answer: '', extracted_answer: 'B' });
  });

  it('reads the answer across all message items, concatenated', () => {
    const out = response([message('\\boxed{'), { type: 'reasoning', summary: [] }, message('C}')]);
    expect(verifyStem({ ...ABCD_ROW, expected_answer: 'C' }, out)).toMatchObject({ reward: 1, extracted_answer: 'C' });
  });

  it('validates rows at the edge', () => {
    expect(StemRow.safeParse({ expected_answer: 'A', grading_mode: 'loose' }).success).toBe(false);
    expect(StemRow.safeParse({ options: [{ A: 1 }], expected_answer: 'A' }).success).toBe(false);
    expect(StemRow.safeParse({ expected_answer: 'A', template_metadata: { output_regex: 3 } }).success).toBe(false);
    expect(StemRow.safeParse({ answer_type: 'numeric', expected_answer: 'nine point eight' }).success).toBe(false);
    expect(StemRow.safeParse({ answer_type: 'numeric' }).success).toBe(false);
    expect(StemRow.safeParse({ answer_type: 'numeric', expected_answer: '9.81 m/s^2', rel_tol: -1 }).success).toBe(false);
    expect(StemRow.safeParse({ answer_type: 'numeric', expected_answer: '9.81 m/s^2', rel_tol: 0.001 }).success).toBe(true);
    expect(StemRow.safeParse({ options: null, expected_answer: null, uuid: 'x', metadata: {} }).success).toBe(true);
  });

  it('grades numeric rows with the same extras', () => {
    const row = StemRow.parse({ answer_type: 'numeric', expected_answer: ' 9.81 m/s^2 ' });
    expect(verifyStem(row, response([message('so \\boxed{981 cm/s^2}')]))).toEqual({
      reward: 1,
      expected_answer: '9.81 m/s^2',
      extracted_answer: '9.81 m s^-2',
    });
    expect(verifyStem(row, response([message('so \\boxed{9.81 m/s}')]))).toMatchObject({ reward: 0 });
    expect(verifyStem({ ...row, rel_tol: 0.1 }, response([message('\\boxed{9 m/s^2}')]))).toMatchObject({ reward: 1 });
    expect(verifyStem({ ...row, require_unit: true }, response([message('\\boxed{9.81}')]))).toMatchObject({ reward: 0 });
  });
});

describe('robustness: reward 0 or a Python-parity answer, quickly, never a throw', () => {
  const rows = {
    mcqa: ABCD_ROW,
    md: { ...ABCD_ROW, grading_mode: 'lenient_answer_colon_md' as const },
    lenient: { ...ABCD_ROW, grading_mode: 'lenient_boxed' as const },
    template: { ...ABCD_ROW, template_metadata: { output_regex: ['Final Choice:\\s*([A-D])', 'Selected:\\s*(\\w+)$'] } },
    numeric: StemRow.parse({ answer_type: 'numeric', expected_answer: '9.81 m/s^2' }),
  };
  const MB = 1 << 20;
  const outputs: Array<[name: string, output: unknown[]]> = [
    ['empty output', []],
    ['empty text', [message('')]],
    ['whitespace only', [message(' \n\t\u00a0 ')]],
    ['refusal only', [{ type: 'message', role: 'assistant', content: [{ type: 'refusal', refusal: 'I cannot help with that.' }] }]],
    ['no message items', [{ type: 'reasoning', summary: [{ type: 'summary_text', text: '\\boxed{B}' }] }, { type: 'function_call', name: 'f', arguments: '{}', call_id: 'c1' }]],
    ['1 MB of text without an answer', [message('x'.repeat(MB))]],
    ['1 MB of Answer: lines', [message('Answer: A or B\n'.repeat(MB / 16))]],
    ['1 MB inside one box', [message(`\\boxed{\\text{${' '.repeat(MB)}}`)]],
    ['5,000 unclosed nested braces', [message(`\\boxed{${'{'.repeat(5000)}B`)]],
    ['5,000 nested \\text{', [message(`\\boxed{${'\\text{'.repeat(5000)}`)]],
    ['5,000 unclosed boxes', [message('\\boxed{'.repeat(5000))]],
  ];
  for (const [rowName, row] of Object.entries(rows)) {
    it.each(outputs)(`${rowName} row: %s`, (_name, output) => {
      const result = verifyStem(row, response(output));
      expect(result.reward).toBe(0);
      expect(result.extracted_answer).toBeNull();
    });
  }

  it('balanced deep nesting is read as Python reads it, quickly', () => {
    const nested = `\\boxed{${'{'.repeat(5000)}B${'}'.repeat(5000)}}`;
    const wrapped = `\\boxed{${'\\text{'.repeat(5000)}B${'}'.repeat(5000)}}`;
    expect(verifyStem(ABCD_ROW, response([message(nested)]))).toMatchObject({ reward: 1, extracted_answer: 'B' });
    expect(verifyStem(ABCD_ROW, response([message(wrapped)]))).toMatchObject({ reward: 1, extracted_answer: 'B' });
    expect(verifyStem(rows.numeric, response([message(nested)]))).toMatchObject({ reward: 0, extracted_answer: null });
    expect(verifyStem(ABCD_ROW, response([message('x'.repeat(MB) + '\\boxed{B}')]))).toMatchObject({ reward: 1 });
  });
});
