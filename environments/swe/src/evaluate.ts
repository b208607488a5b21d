import { performance } from 'node:perf_hooks';
import { RolloutError } from '@rollserve/core';
import type { Sandbox, SandboxProvider } from '@rollserve/core/sandbox';
import { instanceTestCommand, sandboxSpec, type SweInstance } from './instance.ts';
import { prepareRepository } from './repository.ts';
import type { SweConfig } from './schema.ts';
import { APPLIED_MARKER, applyScript, PATCH_DIR, patchedFiles, restoreScript, stageScript } from './scripts.ts';
import { condaActivateScript } from './specs/index.ts';
import { grade, type Grade } from './test-parsers.ts';

/**
 * Why a patch did not resolve the instance (`failure_reason`): `patch_failed` when the model
 * patch or test_patch does not apply (`failure_detail` says which), `tests_missing` when none of
 * the FAIL_TO_PASS / PASS_TO_PASS tests appear in the test output (they did not run: a wrong
 * command, missing files, a broken interpreter), `tests_failed` when they ran and some failed.
 */
export type FailureReason =
  | 'no_agent_sandbox'
  | 'diff_failed'
  | 'empty_patch'
  | 'eval_sandbox_failed'
  | 'patch_failed'
  | 'tests_timeout'
  | 'tests_missing'
  | 'tests_failed';

export interface EvalOutcome {
  evaluation_completed: boolean;
  resolved: boolean;
  failure_reason: FailureReason | null;
  /** What went wrong, for the reasons that have more to say. */
  failure_detail: string | null;
  apply_failed: boolean;
  patch_applied_with: string | null;
  /** The test command line that ran (or would have). */
  test_command: string;
  test_output: string;
  f2p_passed: number;
  p2p_passed: number;
  failed_tests: Grade['failedTests'];
  eval_sandbox_start_time_taken: number;
  patch_verification_time_taken: number;
}

export interface EvaluateOptions {
  provider: SandboxProvider;
  config: SweConfig;
  signal?: AbortSignal;
  /** Apply the patch in reverse (SWE-smith's gold patch is the bug). */
  reverse?: boolean;
}

const seconds = (fromMs: number): number => Math.round(performance.now() - fromMs) / 1000;
const tail = (text: string, max: number): string => (text.length <= max ? text : text.slice(text.length - max));

/**
 * SWE-bench's evaluation of one patch in a FRESH sandbox: the repository at base, the patch (git
 * apply, then patch with fuzz), test_patch over base test files, the tests, the parser, the grade.
 * Whatever the patch does is a result, never a throw.
 */
export async function evaluatePatch(instance: SweInstance, patch: string, options: EvaluateOptions): Promise<EvalOutcome> {
  const { config } = options;
  const outcome: EvalOutcome = {
    evaluation_completed: false,
    resolved: false,
    failure_reason: null,
    failure_detail: null,
    apply_failed: false,
    patch_applied_with: null,
    test_command: instanceTestCommand(instance),
    test_output: '',
    f2p_passed: 0,
    p2p_passed: 0,
    failed_tests: [],
    eval_sandbox_start_time_taken: 0,
    patch_verification_time_taken: 0,
  };
  const setupMs = config.setup_timeout_s * 1000;
  const started = performance.now();
  let sandbox: Sandbox | undefined;
  const onAbort = (): void => void sandbox?.close();
  options.signal?.addEventListener('abort', onAbort, { once: true });
  try {
    try {
      sandbox = await options.provider.create(sandboxSpec(instance, config));
      if (options.signal?.aborted) throw new RolloutError({ code: 'CANCELLED', message: 'verify was aborted' });
      await prepareRepository(sandbox, instance, setupMs);
    } catch (error) {
      outcome.failure_reason = 'eval_sandbox_failed';
      outcome.failure_detail = RolloutError.from(error).message;
      return outcome;
    } finally {
      outcome.eval_sandbox_start_time_taken = seconds(started);
    }
    const verifyStarted = performance.now();
    try {
      const cwd = instance.repoDir;
      const stdin = patch.endsWith('\n') ? patch : `${patch}\n`;
      const applied = await sandbox.exec(applyScript(`${PATCH_DIR}/model.patch`, { fromStdin: true, reverse: options.reverse === true }), { cwd, stdin, timeoutMs: setupMs });
      if (applied.returnCode !== 0) {
        outcome.apply_failed = true;
        outcome.failure_reason = 'patch_failed';
        outcome.failure_detail = `the patch does not apply:\n${tail(`${applied.stdout}${applied.stderr}`, 2000)}`;
        return outcome;
      }
      outcome.patch_applied_with = applied.stdout.split(APPLIED_MARKER).pop()?.trim() ?? null;
      if (instance.testPatch.trim() !== '') {
        const file = `${PATCH_DIR}/test.patch`;
        const script = `${stageScript(file)}\n${restoreScript(patchedFiles(instance.testPatch))}\n${applyScript(file)}`;
        const testApplied = await sandbox.exec(script, { cwd, stdin: instance.testPatch, timeoutMs: setupMs });
        if (testApplied.returnCode !== 0) {
          outcome.failure_reason = 'patch_failed';
          outcome.failure_detail = `test_patch does not apply:\n${tail(`${testApplied.stdout}${testApplied.stderr}`, 2000)}`;
          return outcome;
        }
      }
      const ids = [...instance.failToPass, ...instance.passToPass];
      // the datasets' commands run in their images' conda env, as their eval scripts' `conda activate testbed`
      const fromDataset = instance.testCommandFrom !== 'row' && instance.testCommandFrom !== 'config' && instance.testCommandFrom !== 'default';
      const activate = fromDataset ? `${condaActivateScript()}\n` : '';
      const run = await sandbox.exec(`${activate}${outcome.test_command} 2>&1`, { cwd, env: instance.testEnv, timeoutMs: config.evaluation_timeout * 1000 });
      const output = `${run.stdout}${run.stderr}`;
      outcome.test_output = tail(output, config.max_test_output_chars);
      if (run.errorType !== undefined) {
        outcome.failure_reason = run.errorType === 'timeout' ? 'tests_timeout' : 'eval_sandbox_failed';
        outcome.failure_detail = tail(run.stderr, 2000);
        return outcome;
      }
      const graded = grade(instance.parser.parse(output, ids), instance.failToPass, instance.passToPass);
      outcome.evaluation_completed = true;
      outcome.resolved = graded.resolved;
      outcome.f2p_passed = graded.f2pPassed;
      outcome.p2p_passed = graded.p2pPassed;
      outcome.failed_tests = graded.failedTests;
      if (graded.resolved) return outcome;
      if (ids.length > 0 && graded.missing === ids.length) {
        outcome.failure_reason = 'tests_missing';
        outcome.failure_detail = `none of the ${ids.length} FAIL_TO_PASS / PASS_TO_PASS tests is in the output of \`${outcome.test_command}\` (exit ${run.returnCode}, parser ${instance.parserName})`;
      } else outcome.failure_reason = 'tests_failed';
      return outcome;
    } finally {
      outcome.patch_verification_time_taken = seconds(verifyStarted);
    }
  } finally {
    options.signal?.removeEventListener('abort', onAbort);
    await sandbox?.close();
  }
}
