// The code environment: a drop-in for NeMo Gym's code_gen (CONTRACT.md §6.3), with the programs
// run in a sandbox instead of on the host.

import { inflateSync } from 'node:zlib';
import {
  addAvgSampleStdDev,
  computePassMajorityMetrics,
  computeSubsetMetrics,
  defineEnvironment,
  highestKMetrics,
  invalidInputError,
  outputText,
  pickMetrics,
  type PassMajorityOptions,
  type VerifyEntry,
} from '@rollserve/core';
import { z } from 'zod';
import { extractCode, hasReasoningFormatViolation, isBlank } from './extract.ts';
import { createCodeRunner, type CodeRunner } from './runner.ts';

const PlainTests = z.looseObject({
  inputs: z.array(z.string()),
  outputs: z.array(z.string()),
  fn_name: z.string().nullable().optional(),
});

// benchmarks/livecodebench packs big test sets: base64(zlib(json {inputs, outputs})).
const PackedTests = z.looseObject({ packed: z.string(), fn_name: z.string().nullable().optional() });

export const CodeRow = z.looseObject({
  verifier_metadata: z.looseObject({
    unit_tests: z.union([PlainTests, PackedTests]),
    difficulty: z.string().nullable().optional(),
  }),
});

export const CodeConfig = z.object({
  /** Submissions graded at once (code_gen's semaphore). */
  num_processes: z.number().int().positive().default(8),
  /** Seconds per test. */
  unit_test_timeout_secs: z.number().int().positive().default(10),
  /** The reward given instead when the answer breaks the reasoning format. */
  reasoning_format_penalty: z.number().default(0),
  /** code_gen prints debug output when set; accepted and ignored here. */
  debug: z.boolean().default(false),
  /** Address-space limit of the submission, MiB (code_gen caps data at 4 GiB). */
  memory_limit_mib: z.number().int().positive().default(4096),
  /** Sandbox provider: bwrap (Linux default), apptainer, or local (no isolation; tests only). */
  sandbox_provider: z.string().optional(),
  /** Image the programs run in. Omitted: the host's root, read-only. */
  sandbox_image: z.string().optional(),
  /** Python inside the sandbox. */
  sandbox_python: z.string().default('python3'),
});

export type CodeConfig = z.output<typeof CodeConfig>;
type UnitTests = { inputs: string[]; outputs: string[]; fn_name: string | null };

// A packed test set may not inflate past this (a zip bomb in a row is a bad row, not a dead server).
const MAX_UNPACKED_BYTES = 256 * 1024 * 1024;

/**
 * The row's tests, unpacked. A corrupt packed set is bad input: a 422 at
 * `verifier_metadata.unit_tests.packed` (code_gen itself answers 500 there).
 */
function unitTests(raw: z.output<typeof CodeRow>['verifier_metadata']['unit_tests']): UnitTests {
  if ('packed' in raw && typeof raw.packed === 'string') {
    const loc = ['verifier_metadata', 'unit_tests', 'packed'];
    let decoded: unknown;
    try {
      const json = inflateSync(Buffer.from(raw.packed, 'base64'), { maxOutputLength: MAX_UNPACKED_BYTES }).toString('utf8');
      decoded = JSON.parse(json);
    } catch (error) {
      throw invalidInputError(loc, `not base64(zlib(JSON)): ${(error as Error).message}`, raw.packed);
    }
    const tests = PlainTests.safeParse(decoded);
    if (!tests.success) {
      throw invalidInputError(loc, `the unpacked tests are not {inputs: [str], outputs: [str]}: ${z.prettifyError(tests.error)}`, raw.packed);
    }
    return { inputs: tests.data.inputs, outputs: tests.data.outputs, fn_name: raw.fn_name ?? null };
  }
  const tests = raw as z.output<typeof PlainTests>;
  return { inputs: tests.inputs, outputs: tests.outputs, fn_name: tests.fn_name ?? null };
}

/** What a code server holds: the runner of its submissions (`setup`; `close` stops its warm sandboxes). */
export interface CodeResources {
  runner: CodeRunner;
}

const passOptions: PassMajorityOptions = {
  score: (entry) => ({ accuracy: (entry.reward ?? 0) > 0 }),
  answerKey: 'extracted_model_code',
};

/** code_gen's `compute_metrics`. */
export function codeMetrics(tasks: VerifyEntry[][]): Record<string, unknown> {
  return {
    ...addAvgSampleStdDev(tasks, computePassMajorityMetrics(tasks, passOptions), passOptions),
    ...computeSubsetMetrics(tasks, 'difficulty', passOptions),
  };
}

/** code_gen's `get_key_metrics`, with the per-difficulty pass@1 headlines. */
export function codeKeyMetrics(metrics: Record<string, unknown>): Record<string, unknown> {
  const accuracy = { scoreNames: ['accuracy'] };
  const key: Record<string, unknown> = {
    ...pickMetrics(metrics, ['mean/input_tokens', 'mean/output_tokens']),
    ...highestKMetrics(metrics, 'pass@1[avg-of-{k}]', accuracy),
    ...highestKMetrics(metrics, 'pass@{k}', accuracy),
    ...highestKMetrics(metrics, 'majority@{k}', accuracy),
  };
  const prefixes = new Set(
    Object.keys(metrics)
      .filter((name) => name.includes('/pass@') && /^\p{Ll}/u.test(name))
      .map((name) => name.split('/pass@')[0]!),
  );
  for (const prefix of prefixes) Object.assign(key, highestKMetrics(metrics, `${prefix}/pass@1[avg-of-{k}]`, accuracy));
  return key;
}

export const codeEnvironment = defineEnvironment({
  name: 'code',
  domain: 'coding',
  description: 'Python solutions judged by unit tests in a sandbox (drop-in for code_gen)',
  row: CodeRow,
  config: CodeConfig,
  reverifyMode: 'stateless',
  // CompCodingVerifyResponse's floats: 1.0 and 0.0 in the JSON, as code_gen writes them.
  floatFields: ['reward', 'unit_tests_time_taken', 'reasoning_format_violation_rate'],
  setup: (config): CodeResources => ({
    runner: createCodeRunner({
      concurrency: config.num_processes,
      memoryMib: config.memory_limit_mib,
      python: config.sandbox_python,
      ...(config.sandbox_provider === undefined ? {} : { provider: config.sandbox_provider }),
      ...(config.sandbox_image === undefined ? {} : { image: config.sandbox_image }),
    }),
  }),
  close: (resources) => resources.runner.close(),
  async verify(row, response, ctx) {
    const config = ctx.config;
    const text = outputText(response);
    const difficulty = row.verifier_metadata.difficulty ?? null;
    const empty = {
      extracted_model_output: null,
      extracted_model_code: null,
      result: null,
      metadata: null,
      unit_tests_time_taken: null,
      reasoning_format_violation_rate: 0,
      difficulty,
    };
    if (isBlank(text)) return { reward: 0, ...empty };
    const tests = unitTests(row.verifier_metadata.unit_tests);
    const code = extractCode(text);
    if (code === '') return { reward: 0, ...empty, extracted_model_output: text };

    const { result, metadata, seconds } = await ctx.resources.runner.run({
      code,
      inputs: tests.inputs,
      outputs: tests.outputs,
      fnName: tests.fn_name,
      timeoutSecs: config.unit_test_timeout_secs,
    });
    const violation = hasReasoningFormatViolation(text, response.output);
    const passed = result.every((r) => r === true || r === 1);
    return {
      reward: violation ? config.reasoning_format_penalty : passed ? 1 : 0,
      extracted_model_output: text,
      extracted_model_code: code,
      result,
      metadata,
      unit_tests_time_taken: seconds,
      reasoning_format_violation_rate: violation ? 1 : 0,
      difficulty,
    };
  },
  metrics: codeMetrics,
  keyMetrics: codeKeyMetrics,
});
