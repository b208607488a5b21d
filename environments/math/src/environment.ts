// The math environment: a drop-in for NeMo Gym's math_with_judge and, for rows with
// `expected_result`, for math_with_code with its Python tools (CONTRACT.md §6.1).

import {
  computePassMajorityMetrics,
  defineEnvironment,
  highestKMetrics,
  outputText,
  pickMetrics,
} from '@rollserve/core';
import type { VerifyEntry } from '@rollserve/core';
import { z } from 'zod';
import { answerCandidate, lastBoxedAnswer } from './extract.ts';
import { createEndSessionTool, createExecutePythonTool } from './code-tools.ts';
import type { Grader } from './grader.ts';
import { createGrader } from './grader.ts';
import type { JudgeEvaluation } from './judge.ts';
import { JudgeError, judgeEquivalence } from './judge.ts';
import { verifyMathWithCode } from './math-with-code.ts';

/**
 * A math_with_judge row (`question`, `expected_answer`) or a math_with_code row
 * (`expected_result`, which wins when both are there). A row with neither gets math_with_judge's
 * 422 for the missing fields.
 */
export const MathRow = z
  .object({
    question: z.string().optional(),
    expected_answer: z.string().optional(),
    expected_result: z.string().optional(),
    expected_code_contains: z.string().optional(),
  })
  .superRefine((row, ctx) => {
    if (row.expected_result !== undefined) return;
    for (const key of ['question', 'expected_answer'] as const) {
      if (row[key] === undefined) {
        ctx.addIssue({ code: 'invalid_type', expected: 'string', path: [key], message: `${key} is required (or expected_result for a math_with_code row)` });
      }
    }
  });

export const MathConfig = z.object({
  should_use_judge: z.boolean().default(false),
  library_verifier_timeout_seconds: z.number().positive().default(10),
  library_verifier_max_concurrency: z.number().int().positive().default(32),
  /**
   * As math_with_judge's option of that name. Without it a response with no \boxed{} scores 0
   * (as NeMo Gym grades today); with one, the whole response is graded, as math-verify grades it
   * (the last \boxed{} first). With it, responses without \boxed{} are graded too ("final answer
   * is", LaTeX environments, plain expressions).
   */
  format_tolerant_answer_extraction: z.boolean().default(false),
  /**
   * 'strict': rewards exactly as math_with_judge (Math-Verify 0.8.0) gives them, its mistakes
   * included. 'corrected': rollserve's deliberate differences where Math-Verify is provably wrong
   * (README, "Deliberate differences").
   */
  math_verify_mode: z.enum(['corrected', 'strict']).default('corrected'),
  /** Filled by the launcher from NeMo Gym's `judge_model_server` ref. */
  judge_base_url: z.string().optional(),
  judge_model: z.string().optional(),
  judge_responses_create_params: z.record(z.string(), z.unknown()).optional(),
  /** math_with_code rows: seconds an `execute_python` call may run before it is interrupted. */
  max_execution_time: z.number().positive().default(10),
  /**
   * math_with_code rows: 'current' verifies as NeMo Gym's math_with_code does today (the last
   * balanced `\boxed{}`, falling back to tool stdout; normalised exact or numeric match);
   * 'recorded' as the version that recorded its example rollouts (the first
   * `\\boxed\{([^}]+)\}` match, plain string equality), which reproduces them exactly.
   */
  math_with_code_verifier: z.enum(['current', 'recorded']).default('current'),
});

export type MathConfig = z.output<typeof MathConfig>;

export { lastBoxedAnswer };

/** What a math server holds: its grader's worker pool (`setup`, freed by `close`). */
export interface MathResources {
  grader: Grader;
}

function mathScore(entry: VerifyEntry): Record<string, number | boolean> {
  const scores: Record<string, number | boolean> = {};
  if ('library_reward' in entry) scores.symbolic_accuracy = entry.library_reward as number;
  if (entry.judge_evaluations !== undefined && entry.judge_evaluations !== null) scores.judge_accuracy = entry.reward as number;
  return scores;
}

// math_with_code answers carry `accuracy` and never `library_reward`; its server keeps NeMo Gym's
// default metrics (nothing beyond the baseline; key metrics every mean/*).
const isCodeEntry = (entry: VerifyEntry): boolean => 'accuracy' in entry && !('library_reward' in entry);

/** math_with_judge's `compute_metrics`; nothing extra for a batch of math_with_code answers. */
export function mathMetrics(tasks: VerifyEntry[][]): Record<string, unknown> {
  const entries = tasks.flat();
  if (entries.length > 0 && entries.every(isCodeEntry)) return {};
  return computePassMajorityMetrics(tasks, { score: mathScore, answerKey: 'extracted_answer' });
}

/** math_with_judge's `get_key_metrics`; NeMo Gym's default (every mean/*) for math_with_code. */
export function mathKeyMetrics(agentMetrics: Record<string, unknown>): Record<string, unknown> {
  if ('mean/accuracy' in agentMetrics && !('mean/library_reward' in agentMetrics)) {
    return Object.fromEntries(Object.entries(agentMetrics).filter(([key]) => key.startsWith('mean/')));
  }
  return {
    ...pickMetrics(agentMetrics, ['mean/input_tokens', 'mean/output_tokens']),
    ...highestKMetrics(agentMetrics, 'pass@1[avg-of-{k}]'),
    ...highestKMetrics(agentMetrics, 'pass@{k}', { excludeNames: ['no_answer'] }),
    ...highestKMetrics(agentMetrics, 'majority@{k}', { excludeNames: ['no_answer'] }),
  };
}

export const mathEnvironment = defineEnvironment({
  name: 'math',
  domain: 'math',
  description: 'Math answers checked symbolically, with an optional LLM judge (drop-in for math_with_judge) or with Python tools (math_with_code)',
  row: MathRow,
  config: MathConfig,
  setup: (config): MathResources => ({
    grader: createGrader({ timeoutSeconds: config.library_verifier_timeout_seconds, maxConcurrency: config.library_verifier_max_concurrency }),
  }),
  close: (resources) => resources.grader.close(),
  tools: {
    execute_python: createExecutePythonTool<MathConfig>((ctx) => ctx.config),
    end_session: createEndSessionTool<MathConfig>(),
  },
  // As NeMo Gym: the Python tools only for rows that declare them (math_with_code rows).
  offerTools: 'declared',
  reverifyMode: 'unknown',
  // NeMo Gym's response model declares these floats: 1.0, not 1, in the JSON.
  floatFields: ['reward', 'library_reward'],
  async verify(row, response, ctx) {
    const config = ctx.config;
    if (row.expected_result !== undefined) {
      return { ...verifyMathWithCode(row.expected_result, response, config.math_with_code_verifier) };
    }
    // The row schema guarantees both for a row without expected_result.
    const expected = row.expected_answer!;
    const question = row.question!;
    // math_with_judge grades only outputs with an answer candidate: the last complete, non-blank
    // \boxed{} or, format-tolerant, a marked or concise final line (after its repairs). The whole
    // output is graded either way; the judge is shown the candidate.
    const { text, candidate } = answerCandidate(outputText(response), config.format_tolerant_answer_extraction);
    if (candidate === undefined) {
      return { reward: 0, expected_answer: expected, extracted_answer: null, library_reward: 0, judge_evaluations: null };
    }
    const graded = await ctx.resources.grader.grade(expected, text, { corrections: config.math_verify_mode === 'corrected' });
    const libraryReward = graded.reward;
    const extracted = graded.extracted_answer;
    if (!config.should_use_judge || libraryReward > 0.5) {
      return { reward: libraryReward, expected_answer: expected, extracted_answer: extracted, library_reward: libraryReward, judge_evaluations: null };
    }
    if (!config.judge_base_url) {
      return {
        reward: 0,
        _ng_failure_class: 'judge_failed',
        _ng_failure_judge_error: 'should_use_judge is set but no judge_base_url (judge_model_server) is configured',
      };
    }
    let judged: { reward: number; evaluations: JudgeEvaluation[] };
    try {
      const params = config.judge_responses_create_params ?? (config.judge_model ? { model: config.judge_model } : {});
      judged = await judgeEquivalence(
        { baseUrl: config.judge_base_url, responsesCreateParams: params, signal: ctx.signal },
        question,
        expected,
        candidate,
      );
    } catch (error) {
      if (!(error instanceof JudgeError)) throw error;
      return { reward: 0, _ng_failure_class: 'judge_failed', _ng_failure_judge_error: error.message };
    }
    return {
      reward: judged.reward,
      expected_answer: expected,
      extracted_answer: extracted,
      library_reward: libraryReward,
      judge_evaluations: judged.evaluations,
    };
  },
  metrics: mathMetrics,
  keyMetrics: mathKeyMetrics,
});
