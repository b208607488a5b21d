// The SWE environment: repository tasks in SWE-bench form, worked on in a sandbox with bash and an
// editor, judged by the repository's tests in a fresh sandbox (CONTRACT.md §6.4).

import { performance } from 'node:perf_hooks';
import { createBashTool, createEditorTool, defineEnvironment, defineTool, RolloutError, type EnvironmentContext } from '@rollserve/core';
import { createSandboxProvider, shQuote, type SandboxProvider, type SandboxResources } from '@rollserve/core/sandbox';
import { z } from 'zod';
import { evaluatePatch, type EvalOutcome, type FailureReason } from './evaluate.ts';
import { resolveInstance, sandboxSpec, type SweInstance } from './instance.ts';
import { prepareRepository } from './repository.ts';
import { responseDiff } from './response-diff.ts';
import { SweConfig, SweRow } from './schema.ts';
import { diffScript } from './scripts.ts';

/** What a seeded session keeps for verify. */
interface SweState {
  instance: SweInstance;
  /** The one commit of the agent's fresh repository (its tree is base_commit's). */
  baseSha: string;
  sandboxId: string;
  seedTime: number;
  submitted: boolean;
}

const STATE_KEY = 'swe';
const stateOf = (ctx: EnvironmentContext<SweConfig>): SweState | undefined => ctx.session.state[STATE_KEY] as SweState | undefined;

/** What a SWE server holds: the sandbox provider its config names (bwrap on Linux when none). */
export interface SweResources {
  provider: SandboxProvider;
}

/** The keys of every `/verify` answer besides reward, responses_create_params and response. */
export const SWE_EXTRA_KEYS = [
  'instance_id',
  'resolved',
  'evaluation_completed',
  'model_patch',
  'submitted',
  'failure_reason',
  'failure_detail',
  'apply_failed',
  'patch_applied_with',
  'verify_from',
  'test_command',
  'test_output',
  'failed_tests',
  'f2p_passed',
  'f2p_total',
  'p2p_passed',
  'p2p_total',
  'seed_time',
  'diff_time',
  'eval_sandbox_start_time_taken',
  'patch_verification_time_taken',
  'eval_time',
] as const;

export interface SweEnvironmentOptions {
  /** @default 'swe' */
  name?: string;
  /**
   * The image of the agent sandbox when neither the row nor the config names one (both faces
   * create it from `sandbox.spec`).
   */
  image?: string;
  network?: boolean;
  resources?: SandboxResources;
}

const submitParameters = z.object({});

/** Builds the SWE environment; the package's default export is `createSweEnvironment()`. */
export function createSweEnvironment(options: SweEnvironmentOptions = {}) {
  const sandboxImage = options.image;

  return defineEnvironment({
    name: options.name ?? 'swe',
    domain: 'coding',
    description: 'Repository tasks in sandboxes, judged by their tests (SWE-bench form; drop-in for swebench)',
    row: SweRow,
    seedRow: SweRow,
    config: SweConfig,
    reverifyMode: 'unsupported',
    setup: (config): SweResources => ({ provider: createSandboxProvider(config.sandbox_provider) }),
    close: (resources) => resources.provider.close?.(),
    sandbox: {
      keepForVerify: true,
      // Per row: the instance's image (or repository directory), workdir and the config's
      // environment variables (the agent's shell has them from the start).
      spec: (row, config) => {
        const spec = sandboxSpec(resolveInstance(row, config), config);
        return sandboxImage === undefined || spec.image !== undefined ? spec : { ...spec, image: sandboxImage };
      },
      // the provider the config names, for the agent's sandbox too; else the face's
      provider: (config, resources) => (config.sandbox_provider === undefined ? undefined : resources.provider),
      ...(sandboxImage === undefined ? {} : { image: sandboxImage }),
      ...(options.network === undefined ? {} : { network: options.network }),
      ...(options.resources === undefined ? {} : { resources: options.resources }),
    },
    tools: {
      bash: createBashTool<SweConfig>(),
      str_replace_editor: createEditorTool<SweConfig>(),
      submit: defineTool<typeof submitParameters, SweConfig>({
        description:
          'Submit your changes when the task is done. The repository as it is now is evaluated; make no further changes after submitting.',
        parameters: submitParameters,
        handler(_args, ctx) {
          const state = stateOf(ctx);
          if (state !== undefined) state.submitted = true;
          return 'Your changes have been submitted for evaluation.';
        },
      }),
    },

    async seedSession(row, ctx) {
      const started = performance.now();
      const instance = resolveInstance(row, ctx.config);
      const { tools } = ctx;
      const sandbox = await tools.sandbox(); // `sandbox.spec` above, for this row
      let baseSha: string;
      try {
        baseSha = await prepareRepository(sandbox, instance, ctx.config.setup_timeout_s * 1000);
        // The agent's shell starts in the repository.
        if (instance.repoDir !== sandbox.workdir) await (await tools.bash()).run(`cd ${shQuote(instance.repoDir)}`);
      } catch (error) {
        await tools.close(); // a failed seed holds no sandbox
        throw error;
      }
      const state: SweState = { instance, baseSha, sandboxId: sandbox.id, seedTime: Math.round(performance.now() - started) / 1000, submitted: false };
      ctx.session.state[STATE_KEY] = state;
      return { sandbox_handle: sandbox.id };
    },

    async verify(row, response, ctx) {
      const started = performance.now();
      const config = ctx.config;
      const state = stateOf(ctx);
      const result = {
        instance_id: row.instance_id,
        resolved: false,
        evaluation_completed: false,
        model_patch: '',
        submitted: state?.submitted ?? false,
        failure_reason: null as FailureReason | null,
        failure_detail: null as string | null,
        apply_failed: false,
        patch_applied_with: null as string | null,
        verify_from: row.verify_from ?? config.verify_from,
        test_command: '',
        test_output: '',
        failed_tests: [] as EvalOutcome['failed_tests'],
        f2p_passed: 0,
        f2p_total: row.FAIL_TO_PASS.length,
        p2p_passed: 0,
        p2p_total: row.PASS_TO_PASS.length,
        seed_time: state?.seedTime ?? 0,
        diff_time: 0,
        eval_sandbox_start_time_taken: 0,
        patch_verification_time_taken: 0,
        eval_time: 0,
      };
      const finish = (reason: FailureReason | null, detail: string | null = null) => {
        if (reason !== null) result.failure_reason ??= reason;
        if (detail !== null) result.failure_detail ??= detail;
        result.eval_time = Math.round(performance.now() - started) / 1000;
        return { reward: result.resolved ? 1 : 0, ...result };
      };

      let patch = '';
      // verify_from 'response': the agent's sandbox is only released, the diff is the response's.
      if (state !== undefined && result.verify_from === 'response') await ctx.tools.close();
      else if (state !== undefined) {
        const diffStarted = performance.now();
        const { tools } = ctx;
        try {
          const sandbox = await tools.sandbox();
          const diff = await sandbox.exec(diffScript(state.baseSha), { cwd: state.instance.repoDir, timeoutMs: 120_000, maxOutputBytes: 64 << 20 });
          if (diff.returnCode === 0) patch = diff.stdout;
          else {
            result.failure_reason = 'diff_failed';
            result.failure_detail = `${diff.stdout}${diff.stderr}`.slice(-2000);
          }
        } catch (error) {
          result.failure_reason = 'diff_failed';
          result.failure_detail = RolloutError.from(error).message;
        } finally {
          // The agent's sandbox is released before the eval sandbox starts.
          await tools.close();
        }
        result.diff_time = Math.round(performance.now() - diffStarted) / 1000;
      }
      if (config.is_verifying_golden_patch) patch = row.patch ?? '';
      else if (result.verify_from === 'response') patch = responseDiff(response);
      else if (state === undefined) return finish('no_agent_sandbox', 'verify found no seeded session: call /seed_session first (same cookie)');
      result.model_patch = patch;
      if (patch.trim() === '') return finish(result.failure_reason === 'diff_failed' ? 'diff_failed' : 'empty_patch');
      result.failure_reason = null;
      result.failure_detail = null;

      let instance: SweInstance;
      try {
        instance = state?.instance ?? resolveInstance(row, config);
      } catch (error) {
        const failure = RolloutError.from(error);
        // a row naming what it may not (a path outside its root) is a 422 naming the field
        if (failure.code === 'UNPROCESSABLE') throw failure;
        return finish('eval_sandbox_failed', failure.message);
      }
      const reverse = config.is_verifying_golden_patch && instance.goldReversed;
      const outcome = await evaluatePatch(instance, patch, { provider: ctx.resources.provider, config, signal: ctx.signal, reverse });
      Object.assign(result, outcome);
      return finish(null);
    },
  });
}

export const sweEnvironment = createSweEnvironment();
