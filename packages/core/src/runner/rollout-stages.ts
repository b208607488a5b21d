import type { Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import type { SessionStore } from '../server/session-store.ts';
import type { SandboxResources, SandboxSpec } from '../sandbox/types.ts';
import { sandboxSpecOf, type Environment, type EnvironmentContext, type Session } from '../spec/environment.ts';
import { createSessionTools, DEFAULT_START_TIMEOUT_MS, type SessionTools } from '../tools/session-tools.ts';
import { offeredDefinitions, runAgentLoop, type AgentLoopOptions, type AgentLoopResult, type CallModel } from './agent-loop.ts';
import type { RunnerEnvironments } from './environments.ts';
import type { Job } from './job.ts';
import { buildResponse } from './messages.ts';
import type { ServiceMetrics } from './metrics.ts';
import type { ModelProvider } from './model-provider.ts';
import { failedOutcome, policyTimedOut, timeoutIsPolicys, verifiedOutcome, type Outcome, type Trajectory } from './outcome.ts';
import type { ImagePrefetcher } from './prefetch.ts';
import type { StagePools } from './stage-pools.ts';
import type { RolloutTask, StageName } from '../protocol/rollout.ts';

/** What a rollout's stages stand on: the runner's parts. */
export interface StageParts {
  pools: StagePools;
  /** Readies the images of rollouts waiting for INIT. */
  prefetcher?: ImagePrefetcher | undefined;
  environments: RunnerEnvironments;
  sessions: SessionStore;
  models: ModelProvider;
  metrics?: Pick<ServiceMetrics, 'toolLatency' | 'llmLatency'> | undefined;
  logger: Logger;
}

type Row = Record<string, unknown> & { responses_create_params: { input: unknown } };

/**
 * The work of one rollout's stages: INIT (the environment's setup, the session's tools, the
 * sandbox and tool backends started, seedSession) → RUN (the agent loop) → EVAL (verify), each
 * in its pool (StagePools.stage), and what they produced, a failure's included, as its outcome.
 */
export class RolloutStages {
  /** The stage the rollout is in: the one a failure is charged to. */
  #stage: StageName = 'init';
  readonly #job: Job;
  readonly #env: Environment<any, any, any>;
  readonly #parts: StageParts;
  readonly #session: Session;
  readonly #config: Record<string, unknown>;
  readonly #logger: Logger;
  readonly #row: Row;
  // made first thing in INIT: the one session's tools and the environment's resources
  #tools!: SessionTools;
  #resources: unknown;
  // The row as the environment's schema gives it, parsed once, at INIT (a node's rows come over
  // the wire): the sandbox's spec and verify both take it.
  #fitted: object = {};
  #trajectory: Trajectory = { response: null, messages: [], turns: [] };
  readonly #progress: NonNullable<AgentLoopOptions['progress']> = {};
  readonly #modelTime = new ModelTime();
  /** The policy's own time in RUN (see timeoutIsPolicys), known once RUN has ended. */
  #policyRunMs = 0;
  #initBegan = false;

  constructor(job: Job, env: Environment<any, any, any>, parts: StageParts) {
    this.#job = job;
    this.#env = env;
    this.#parts = parts;
    this.#session = parts.sessions.get(job.id);
    this.#config = parts.environments.config(env);
    this.#logger = parts.logger.child({ rollout: job.id, env: env.name });
    this.#row = { ...job.task.row } as Row;
  }

  /** Runs the stages; resolves with what they produced, a failure included (never rejects). */
  async outcome(): Promise<Outcome> {
    try {
      void this.#prefetch();
      await this.#parts.pools.stage('init', this.#job, (signal) => this.#init(signal));
      this.#stage = 'run';
      await this.#run();
      this.#parts.models.release(this.#job.id);
      this.#stage = 'eval';
      return await this.#eval();
    } catch (error) {
      return this.#failed(error);
    }
  }

  #ctx(signal: AbortSignal): EnvironmentContext {
    return { session: this.#session, config: this.#config, logger: this.#logger, signal, tools: this.#tools, resources: this.#resources };
  }

  /**
   * While the rollout waits for INIT: its sandbox's image readied (see readyImage); not once its
   * INIT has begun, which readies it itself (a provider whose first use does other work than its
   * prefetch, Apptainer's, would otherwise do both).
   */
  async #prefetch(): Promise<void> {
    if (!this.#job.abort.signal.aborted) await readyImage(this.#parts, this.#env, this.#job.task, { stale: () => this.#initBegan });
  }

  /**
   * INIT: the session's tools over the row's sandbox spec (with the task's limits), then
   * everything the offered tools run on started in parallel (the shell beside the kernel) with
   * seedSession, under INIT's limit: a call's time limit then counts only the call's own work.
   */
  async #init(signal: AbortSignal): Promise<void> {
    this.#initBegan = true;
    const env = this.#env;
    const row = this.#row;
    const limits = this.#job.task.limits;
    this.#resources = await this.#parts.environments.setupOf(env);
    this.#fitted = env.row.parse(row) as object;
    const sandboxRow = env.sandbox?.spec ? { ...row, ...this.#fitted } : undefined;
    const spec = withTaskLimits(sandboxSpecOf(env.sandbox, sandboxRow, this.#config), limits.sandbox);
    const tools = (this.#tools = createSessionTools(this.#session, {
      provider: this.#parts.environments.sandboxProvider(env, this.#resources),
      spec,
      startTimeoutMs: (limits.init_timeout_s ?? DEFAULT_START_TIMEOUT_MS / 1000) * 1000,
    }));
    const rowTools: unknown = (row.responses_create_params as { tools?: unknown }).tools;
    const prepared = offeredDefinitions(env, Array.isArray(rowTools) ? rowTools : undefined)
      .filter((tool) => tool.prepare !== undefined)
      .map((tool) => Promise.resolve().then(() => tool.prepare!(this.#ctx(signal))));
    const seeded = (async () => {
      if (env.sandbox) await tools.sandbox();
      const seedRow = env.seedRow ? env.seedRow.parse(row) : row;
      if (env.seedSession) await env.seedSession({ ...row, ...(seedRow as object) }, this.#ctx(signal));
    })();
    await Promise.all([seeded, ...prepared]);
  }

  /**
   * RUN: the agent loop, its model calls timed apart from the policy's own time (tool calls, and
   * starts after it acted), which is what a time-out is attributed by.
   */
  async #run(): Promise<void> {
    const job = this.#job;
    const tools = this.#tools;
    // From here the tools serve the policy: a start that fails after it has acted in the
    // sandbox may be its doing, so it is the call's error, not INIT's (SessionTools.policyBegins).
    tools.policyBegins();
    const callModel = this.#parts.models.forRollout(job.id, job.task.policy);
    const loop = await this.#parts.pools
      .stage(
        'run',
        job,
        (signal) => runAgentLoop(this.#loopOptions(callModel, signal)),
        // starts after the policy acted are its time (SessionTools.startupBeforeActMs); a pause of
        // generation for a weight update is nobody's
        () => tools.startupBeforeActMs() + this.#pausedMs(),
      )
      .finally(() => {
        // RUN is the first stage charged to the time limit: what it used is job.usedMs now (the
        // pause left out of both)
        this.#policyRunMs = job.usedMs - (this.#modelTime.ms - this.#pausedMs());
        this.#modelTime.stop();
      });
    this.#keep(loop);
    if (loop.stop === 'resource_limit') {
      throw new RolloutError({ code: 'RESOURCE_LIMIT', message: `the rollout's sandbox went past a limit and was ended: ${loop.limit}` });
    }
    if (loop.stop === 'start_failed') {
      // A start at first use that failed or missed init_timeout_s before the policy acted:
      // INIT's failure, however late (after it acted, the call's error: see policyBegins).
      this.#stage = 'init';
      throw loop.startError!;
    }
  }

  /** Time this rollout's turns waited for pauses of generation (weight updates). */
  #pausedMs(): number {
    return this.#parts.models.pausedMs?.(this.#job.id) ?? 0;
  }

  #loopOptions(callModel: CallModel, signal: AbortSignal): AgentLoopOptions {
    const { task } = this.#job;
    const tools = this.#tools;
    const metrics = this.#parts.metrics;
    return {
      env: this.#env,
      row: this.#row as never,
      ctx: { session: this.#session, config: this.#config, logger: this.#logger, tools, resources: this.#resources },
      callModel: async (request, s) => {
        const stop = metrics?.llmLatency.startTimer();
        try {
          return await this.#modelTime.time(() => callModel(request, s));
        } finally {
          stop?.();
        }
      },
      maxTurns: task.limits.max_turns,
      toolTimeoutMs: task.limits.tool_timeout_s * 1000,
      signal,
      onToolCall: (call) => {
        metrics?.toolLatency.observe({ tool: call.name, status: call.status }, call.duration_ms / 1000);
        // a handler that ran may have reached the sandbox without ctx.tools handing it anything
        if (call.status !== 'unknown_tool' && call.status !== 'invalid_arguments') tools.policyCallEnded();
      },
      checkLimits: () => tools.limitExceeded(),
      checkStartup: () => tools.startFailure(),
      progress: this.#progress,
    };
  }

  /** Keeps what the agent loop produced (all of it, or until it was cut short) as the rollout's trajectory. */
  #keep(produced: Pick<AgentLoopResult, 'turns' | 'messages' | 'offeredTools' | 'usage'>): void {
    const { id, task } = this.#job;
    const response = buildResponse({ id, model: task.policy.model, turns: produced.turns, tools: produced.offeredTools, usage: produced.usage });
    this.#trajectory = { response, messages: produced.messages as Array<Record<string, unknown>>, turns: produced.turns };
  }

  /** EVAL: verify, over the row as the environment's schema gives it. */
  async #eval(): Promise<Outcome> {
    const env = this.#env;
    // The agent's resources (sandbox, kernels) are freed before EVAL unless the environment
    // evaluates in them; the session's state stays for verify.
    if (!env.sandbox?.keepForVerify) await this.#parts.sessions.releaseResources(this.#job.id);
    const verified = await this.#parts.pools.stage('eval', this.#job, async (signal) => {
      return env.verify({ ...this.#row, ...this.#fitted }, this.#trajectory.response as never, this.#ctx(signal));
    });
    return verifiedOutcome(verified, this.#trajectory);
  }

  #failed(error: unknown): Outcome {
    const job = this.#job;
    if (this.#stage === 'run' && this.#progress.snapshot) {
      // cut short (the time limit, a policy backend's error at a later turn, a cancel): what the
      // policy produced until then is the sample's, to train on (a policy time-out) or to see
      // why a filtered one failed where it did
      try {
        this.#keep(this.#progress.snapshot());
      } catch (snapshotError) {
        this.#logger.error({ err: snapshotError }, 'the trajectory of a failed rollout could not be kept');
      }
    }
    let outcome = failedOutcome(error, this.#stage, this.#trajectory);
    if (outcome.critical_error === 'timeout' && job.outOfTime && timeoutIsPolicys(this.#policyRunMs, job.task.limits.time_limit_s)) {
      outcome = policyTimedOut(outcome, this.#policyRunMs);
    }
    if (outcome.critical_error !== 'cancelled') this.#logger.warn({ err: error, stage: this.#stage }, 'rollout failed');
    return outcome;
  }
}

/** The task's sandbox limits (API names) over the environment's spec. */
/**
 * Readies the image of `task`'s sandbox (prefetch.ts): while the rollout waits for INIT, or, a
 * `hint`, while its task is only queued next (a node's `upcoming`). What goes wrong here (a row
 * that does not parse, an image that does not unpack) is INIT's to report.
 */
export async function readyImage(
  parts: Pick<StageParts, 'prefetcher' | 'environments'>,
  env: Environment<any, any, any>,
  task: RolloutTask,
  options: { hint?: boolean; stale?: () => boolean } = {},
): Promise<void> {
  const prefetcher = parts.prefetcher;
  if (prefetcher === undefined || !env.sandbox) return;
  try {
    const resources = await parts.environments.setupOf(env);
    const row = { ...task.row };
    const fitted = env.row.parse(row) as object;
    const spec = withTaskLimits(sandboxSpecOf(env.sandbox, env.sandbox.spec ? { ...row, ...fitted } : undefined, parts.environments.config(env)), task.limits.sandbox);
    prefetcher.prefetch(parts.environments.sandboxProvider(env, resources), spec, options);
  } catch {
    // INIT meets it again and fails the rollout with it
  }
}

function withTaskLimits(spec: SandboxSpec, limits: RolloutTask['limits']['sandbox']): SandboxSpec {
  if (limits === undefined) return spec;
  const names = {
    total_memory_mib: 'totalMemoryMib',
    memory_mib: 'memoryMib',
    max_processes: 'maxProcesses',
    workspace_mib: 'workspaceMib',
    tmp_mib: 'tmpMib',
    max_inodes: 'maxInodes',
    max_file_size_mib: 'maxFileSizeMib',
    output_mib: 'outputMib',
    cpu_seconds: 'cpuSeconds',
    max_open_files: 'maxOpenFiles',
  } as const satisfies Record<keyof NonNullable<typeof limits>, keyof SandboxResources>;
  const resources: SandboxResources = { ...spec.resources };
  for (const [key, name] of Object.entries(names)) {
    const value = limits[key as keyof typeof names];
    if (value !== undefined) resources[name] = value;
  }
  return { ...spec, resources };
}

/** Wall time of a rollout's model calls in RUN, a call in flight included: never the policy's own (see timeoutIsPolicys). */
class ModelTime {
  #doneMs = 0;
  #since: number | undefined;

  get ms(): number {
    return this.#doneMs + (this.#since === undefined ? 0 : performance.now() - this.#since);
  }

  async time<T>(call: () => Promise<T>): Promise<T> {
    const since = (this.#since = performance.now());
    try {
      return await call();
    } finally {
      // a call that outlived its stage (aborted) was counted when the stage ended
      if (this.#since === since) {
        this.#doneMs += performance.now() - since;
        this.#since = undefined;
      }
    }
  }

  /** RUN has ended: a call still in flight is counted until now. */
  stop(): void {
    if (this.#since === undefined) return;
    this.#doneMs = this.ms;
    this.#since = undefined;
  }
}
