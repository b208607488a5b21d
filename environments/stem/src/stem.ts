import {
  computePassMajorityMetrics,
  defineEnvironment,
  highestKMetrics,
  outputText,
  type NeMoGymResponse,
  type VerifyEntry,
} from '@rollserve/core';
import { extractLetter } from './mcqa.ts';
import { gradeNumeric, parseQuantity } from './numeric.ts';
import { pyStrip } from '@rollserve/core';
import { StemConfig, StemRow } from './schema.ts';

export interface StemVerifyResult {
  reward: number;
  expected_answer: string;
  extracted_answer: string | null;
  [extra: string]: unknown;
}

/**
 * Scores one response against a row: mcqa's letter extraction, or a numeric quantity for
 * `answer_type: "numeric"`. Never throws for anything the model wrote.
 */
export function verifyStem(row: StemRow, response: Pick<NeMoGymResponse, 'output'>, config: StemConfig = {}): StemVerifyResult {
  const text = pyStrip(outputText(response));
  if (row.answer_type === 'numeric') {
    const expectedAnswer = pyStrip(row.expected_answer ?? '');
    const expected = parseQuantity(expectedAnswer);
    if (text === '' || expected === null) return { reward: 0, expected_answer: expectedAnswer, extracted_answer: null };
    const grade = gradeNumeric(text, expected, {
      relTol: row.rel_tol,
      absTol: row.abs_tol,
      requireUnit: row.require_unit,
    });
    return { reward: grade.reward, expected_answer: expectedAnswer, extracted_answer: grade.extracted };
  }

  const gold = pyStrip(row.expected_answer ?? '').toUpperCase();
  if (text === '') return { reward: 0, expected_answer: gold, extracted_answer: null };
  const letter = extractLetter({
    text,
    options: row.options,
    gradingMode: config.grading_mode ?? row.grading_mode ?? 'strict_single_letter_boxed',
    outputRegex: row.template_metadata?.output_regex,
    answerPrefix: row.template_metadata?.answer_prefix,
  });
  const correct = letter !== null && gold !== '' && letter === gold;
  return { reward: correct ? 1 : 0, expected_answer: gold, extracted_answer: letter };
}

/** mcqa's `compute_metrics`: pass@k, pass@1[avg-of-k] and majority@k of accuracy = reward. */
export function stemMetrics(tasks: VerifyEntry[][]): Record<string, unknown> {
  return computePassMajorityMetrics(tasks, {
    score: (entry) => ({ accuracy: entry.reward }),
    answerKey: 'extracted_answer',
  });
}

/** mcqa's `get_key_metrics`. */
export function stemKeyMetrics(agentMetrics: Record<string, unknown>): Record<string, unknown> {
  const key: Record<string, unknown> = {};
  if ('mean/reward' in agentMetrics) key['mean/reward'] = agentMetrics['mean/reward'];
  Object.assign(key, highestKMetrics(agentMetrics, 'pass@1[avg-of-{k}]', { scoreNames: ['accuracy', 'no_answer'] }));
  Object.assign(key, highestKMetrics(agentMetrics, 'pass@{k}', { scoreNames: ['no_answer'] }));
  Object.assign(key, highestKMetrics(agentMetrics, 'majority@{k}', { scoreNames: ['accuracy'] }));
  if ('pass@1/accuracy' in agentMetrics) key['pass@1/accuracy'] = agentMetrics['pass@1/accuracy'];
  return key;
}

export default defineEnvironment({
  name: 'stem',
  domain: 'knowledge',
  description: 'STEM answers: multiple choice (drop-in for NeMo Gym mcqa) and numeric with units',
  row: StemRow,
  config: StemConfig,
  verify: (row, response, ctx) => verifyStem(row, response, ctx.config),
  metrics: stemMetrics,
  keyMetrics: stemKeyMetrics,
  reverifyMode: 'stateless',
  // mcqa's verify response declares reward a float: 1.0, not 1, in the JSON.
  floatFields: ['reward'],
});
