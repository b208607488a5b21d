import PQueue from 'p-queue';
import { pino, type Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import { SessionStore } from '../server/session-store.ts';
import { createSandboxProvider } from '../sandbox/registry.ts';
import type { SandboxProvider, SandboxResources, SandboxSpec } from '../sandbox/types.ts';
import { sandboxSpecOf, type Environment, type EnvironmentContext } from '../spec/environment.ts';
import { createSessionTools, DEFAULT_START_TIMEOUT_MS, type SessionTools } from '../tools/session-tools.ts';
import { offeredDefinitions, runAgentLoop, type CallModel } from './agent-loop.ts';
import { buildResponse } from './messages.ts';
import type { ServiceMetrics } from './metrics.ts';
import { assignSampleCredit } from './rewards/assign.ts';
import { resolveCredit } from './rewards/settings.ts';
import { STAGES, type CriticalError, type RolloutResult, type RolloutTask, type StageName, type StageTiming, type TurnRecord } from '../protocol/rollout.ts';

export { STAGES, type StageName } from '../protocol/rollout.ts';

/** Where the policy's turns go: one sticky caller per rollout. */
export interface ModelProvider {
  forRollout(rolloutId: string, policy: RolloutTask['policy']): CallModel;
  release(rolloutId: string): void;
}

export interface RolloutRunnerOptions {
  environments: ReadonlyArray<Environment<any, any, any>>;
  models: ModelProvider;
  /** Config block per environment name. */
  environmentConfigs?: Record<string, Record<string, unknown>>;
  /** Worker slots per stage. @default { init: 64, run: 512, eval: 32 } */
  pools?: Partial<Record<StageName, number>>;
  /**
   * 'staged' (the default): each stage has its own pool and a job holds a slot only while in a
   * stage. 'serial': one pool of `pools.run` slots, each job holding its slot from INIT to the end
   * of EVAL, as rollout loops inside trainers do (the baseline the overlap is measured against).
   */
  pipeline?: 'staged' | 'serial';
  /**
   * Creates the sandboxes of environments that declare `sandbox` (in INIT).
   * @default createSandboxProvider() (bwrap on Linux)
   */
  sandboxProvider?: SandboxProvider;
  logger?: Logger;
  /** Where stage, tool and policy latencies are observed. */
  metrics?: Pick<ServiceMetrics, 'stageLatency' | 'toolLatency' | 'llmLatency'>;
}

/** A rollout to run: a leased attempt of one sample of a task. */
export interface RunnerJob {
  id: string;
  taskId: string;
  sampleIndex: number;
  /** The lease's fencing number, carried back with the result. */
  attempt: number;
  task: RolloutTask;
}

/** A rollout the runner holds. */
export interface RunningRollout {
  id: string;
  attempt: number;
  /** The stage it is in (waiting for a slot counts): `queued` until INIT begins. */
  stage: 'queued' | StageName;
  /** Whether it holds a slot of its stage now. */
  active: boolean;
}

interface Job extends RunnerJob {
  env: Environment<any, any, any> | undefined;
  stage: 'queued' | StageName;
  active: boolean;
  abort: AbortController;
  usedMs: number;
  /** Whether `time_limit_s` ran out (in RUN, or before or in EVAL): only that time-out is attributed. */
  outOfTime: boolean;
  timing: Record<StageName, StageTiming>;
  startedAt: number;
  done: Promise<RolloutResult>;
  resolve: (result: RolloutResult) => void;
}

/**
 * What a finished rollout's stages produced. `policyTimeout`: a time-out that is the policy's
 * doing (see `timeoutIsPolicys`), scored as reward 0 and not filtered.
 */
type Outcome = Pick<RolloutResult, 'state' | 'reward' | 'reward_components' | 'verify_extras' | 'critical_error' | 'error' | 'response' | 'messages' | 'turns'> & {
  policyTimeout?: boolean;
};

/**
 * Whether a rollout's time-out (in RUN, or in EVAL, or before EVAL for want of time) is the
 * policy's doing: its own time in RUN (the stage's charged time less the time spent waiting for
 * model calls, i.e. its tool calls and the starts it caused after it acted) reached half of
 * `time_limit_s`. Model calls are never its time: how long a backend takes (its load, retries,
 * failover) is the infrastructure's, and a generation's length is bounded by `max_tokens` and
 * `max_turns`. Half, not all, because a policy that sleeps in its tools until the limit passes
 * still spends some of it waiting for its own generations; and a slow backend alone never gets
 * the policy's share there.
 */
function timeoutIsPolicys(policyRunMs: number, timeLimitS: number): boolean {
  return policyRunMs >= (timeLimitS * 1000) / 2;
}

/** The outcome of a rollout that did not get through its stages. */
function failedOutcome(
  error: unknown,
  stage: StageName,
  turns: TurnRecord[],
  messages: Array<Record<string, unknown>>,
  response: Record<string, unknown> | null,
): Outcome {
  const wrapped = RolloutError.from(error);
  // INIT's time-out is its own limit (init_timeout_s): start-up that did not finish, an
  // infrastructure failure like any other of INIT, not the rollout's time limit.
  const criticalError: CriticalError =
    wrapped.code === 'CANCELLED' ? 'cancelled' : wrapped.code === 'TIMEOUT' && stage !== 'init' ? 'timeout' : stage;
  return {
    state: criticalError === 'cancelled' ? 'cancelled' : 'failed',
    reward: 0,
    reward_components: null,
    verify_extras: {},
    critical_error: criticalError,
    error: { code: wrapped.code, message: wrapped.message },
    response,
    messages,
    turns,
  };
}

/** The task's sandbox limits (API names) over the environment's spec. */
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

/**
 * The error of a verify result that says it could not score the rollout: NeMo Gym's failure
 * convention (CONTRACT.md §1.6), `_ng_failure_class` with its `_ng_failure_*` details, which its
 * collection sends to the failures file instead of training on it.
 */
function verifyFailure(extras: Record<string, unknown>): { code: string; message: string } | undefined {
  const failure = extras._ng_failure_class;
  if (failure === undefined || failure === null || failure === false) return undefined;
  const details = Object.entries(extras)
    .filter(([key, value]) => key.startsWith('_ng_failure_') && key !== '_ng_failure_class' && typeof value === 'string' && value !== '')
    .map(([, value]) => value as string);
  return { code: 'UNAVAILABLE', message: `verify could not score the rollout (${String(failure)})${details.length > 0 ? `: ${details.join('; ')}` : ''}` };
}

const cancelled = (message = 'rollout cancelled') => new RolloutError({ code: 'CANCELLED', message });

/**
 * Runs rollouts on this machine: INIT (session and seedSession) → RUN (agent loop) → EVAL
 * (verify), each stage with its own bounded worker pool, so that a slow verifier never holds
 * sandbox start-up or generation. A job holds a slot only while it is in a stage, and its time
 * limit counts stage time only. The central service runs one for its own pools; every rollout
 * node (`rollserve node`) runs one. It knows nothing of stores or leases: it turns a job into its
 * result (failures and cancellations are results too).
 */
export class RolloutRunner {
  readonly logger: Logger;
  readonly #options: RolloutRunnerOptions;
  readonly #envs = new Map<string, Environment<any, any, any>>();
  readonly #configs: Record<string, Record<string, unknown>> = {};
  readonly #pools: Record<StageName, number>;
  readonly #queues: Record<StageName, PQueue>;
  readonly #serial: PQueue | undefined;
  readonly #jobs = new Map<string, Job>();
  readonly #sessions: SessionStore;
  /** The providers sandboxes come from, each wrapped to count what it has open. */
  readonly #counted = new Map<SandboxProvider, SandboxProvider>();
  #defaultProvider: SandboxProvider | undefined;
  /** What each environment's `setup` returned (started on its first rollout). */
  readonly #setups = new Map<string, Promise<unknown>>();
  #liveSandboxes = 0;
  /** Accepted jobs not started yet (see #admit). */
  #backlog: Job[] = [];
  #closed = false;

  constructor(options: RolloutRunnerOptions) {
    this.#options = options;
    this.logger = options.logger ?? pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
    for (const env of options.environments) {
      this.#envs.set(env.name, env);
      const given = options.environmentConfigs?.[env.name] ?? {};
      this.#configs[env.name] = (env.config ? env.config.parse(given) : given) as Record<string, unknown>;
    }
    const pools = (this.#pools = { init: 64, run: 512, eval: 32, ...options.pools });
    this.#serial = options.pipeline === 'serial' ? new PQueue({ concurrency: pools.run }) : undefined;
    // In serial mode the stages run inside the job's one slot: their own queues never wait.
    const unbounded = Number.POSITIVE_INFINITY;
    this.#queues = {
      init: new PQueue({ concurrency: this.#serial ? unbounded : pools.init }),
      run: new PQueue({ concurrency: this.#serial ? unbounded : pools.run }),
      eval: new PQueue({ concurrency: this.#serial ? unbounded : pools.eval }),
    };
    this.#sessions = new SessionStore({ idleTtlMs: 7 * 24 * 3_600_000, logger: this.logger });
  }

  get environments(): string[] {
    return [...this.#envs.keys()];
  }

  environment(name: string): Environment<any, any, any> | undefined {
    return this.#envs.get(name);
  }

  /** Worker slots per stage. */
  get capacity(): Record<StageName, number> {
    return { ...this.#pools };
  }

  /** Rollouts held (queued for a stage or in one). */
  get size(): number {
    return this.#jobs.size;
  }

  /**
   * The sandbox spec a row would get here (`sandbox.spec` with this runner's config), or undefined
   * when the environment makes none per row. `row`: as the environment's row schema gives it,
   * over the raw row (the caller has checked it). Throws what the environment throws for the row
   * (a path, bind or image it may not name): the service calls it when the row is submitted.
   */
  rowSandboxSpec(envName: string, row: Record<string, unknown>): SandboxSpec | undefined {
    const env = this.#envs.get(envName);
    if (!env?.sandbox?.spec) return undefined;
    return env.sandbox.spec(row, this.#configs[env.name] ?? {});
  }

  running(id: string): RunningRollout | undefined {
    const job = this.#jobs.get(id);
    return job && { id: job.id, attempt: job.attempt, stage: job.stage, active: job.active };
  }

  /** Every rollout held. */
  held(): RunningRollout[] {
    return [...this.#jobs.values()].map((job) => ({ id: job.id, attempt: job.attempt, stage: job.stage, active: job.active }));
  }

  /**
   * Runs a job; resolves with its result (never rejects: a failure or a cancellation is a result).
   * The result carries the sample's own credit; a group's credit is the caller's business.
   */
  run(input: RunnerJob): Promise<RolloutResult> {
    if (this.#closed) return Promise.reject(new RolloutError({ code: 'UNAVAILABLE', message: 'the runner is closed', retryable: true }));
    if (this.#jobs.has(input.id)) throw new RolloutError({ code: 'CONFLICT', message: `rollout "${input.id}" is already running here` });
    let resolve!: (result: RolloutResult) => void;
    const done = new Promise<RolloutResult>((r) => (resolve = r));
    const job: Job = {
      ...input,
      env: this.#envs.get(input.task.env),
      stage: 'queued',
      active: false,
      abort: new AbortController(),
      usedMs: 0,
      outOfTime: false,
      timing: { init: { queued_ms: 0, active_ms: 0 }, run: { queued_ms: 0, active_ms: 0 }, eval: { queued_ms: 0, active_ms: 0 } },
      startedAt: performance.now(),
      done,
      resolve,
    };
    this.#jobs.set(job.id, job);
    this.#admit(job);
    return done;
  }

  /**
   * Aborts a rollout: it leaves its queue or stage, its session and sandbox are freed, and its
   * result comes out cancelled. False when the runner does not hold it.
   */
  abort(id: string, message?: string): boolean {
    const job = this.#jobs.get(id);
    if (!job) return false;
    job.abort.abort(cancelled(message));
    return true;
  }

  status(): { stages: Record<StageName, { queued: number; active: number; pool: number }>; live_sessions: number; live_sandboxes: number } {
    const stages = Object.fromEntries(
      STAGES.map((name) => [name, { queued: this.#queues[name].size, active: this.#queues[name].pending, pool: this.#queues[name].concurrency }]),
    ) as Record<StageName, { queued: number; active: number; pool: number }>;
    stages.init.queued += this.#backlog.length; // accepted, about to join INIT's queue
    if (this.#serial) {
      stages.init.queued += this.#serial.size;
      for (const stage of STAGES) stages[stage].pool = this.#serial.concurrency;
    }
    return { stages, live_sessions: this.#sessions.size, live_sandboxes: this.#liveSandboxes };
  }

  /**
   * Queues a job to start soon, off the caller's path: starting one runs the synchronous part of
   * its first stage (a sandbox's creation, for one), so the backlog is started a slice of the
   * event loop at a time and a big batch neither delays its own acceptance nor stalls requests.
   */
  #admit(job: Job): void {
    this.#backlog.push(job);
    if (this.#backlog.length === 1) setImmediate(() => this.#startBacklog());
  }

  #startBacklog(): void {
    const until = performance.now() + 10;
    let started = 0;
    while (started < this.#backlog.length && performance.now() < until) this.#start(this.#backlog[started++]!);
    this.#backlog.splice(0, started);
    if (this.#backlog.length > 0) setImmediate(() => this.#startBacklog());
  }

  #start(job: Job): void {
    // Serial mode: one slot from INIT to the end of EVAL. A rollout cancelled while it waits for
    // its slot ends as cancelled as soon as it gets one (its first stage sees the aborted signal).
    const run = this.#serial ? this.#serial.add(() => this.#run(job)) : this.#run(job);
    void run.catch((error: unknown) => this.logger.error({ err: error, rollout: job.id }, 'rollout bookkeeping failed'));
  }

  /**
   * The environment's sandbox provider (else the runner's), counting what it has open
   * (GET /v1/status, /metrics).
   */
  #sandboxes(given?: SandboxProvider): SandboxProvider {
    const inner = given ?? (this.#defaultProvider ??= this.#options.sandboxProvider ?? createSandboxProvider());
    const known = this.#counted.get(inner);
    if (known) return known;
    const counted: SandboxProvider = {
      name: inner.name,
      create: async (spec) => {
        const sandbox = await inner.create(spec);
        this.#liveSandboxes++;
        let open = true;
        const close = sandbox.close.bind(sandbox);
        return Object.assign(sandbox, {
          close: async () => {
            if (open) {
              open = false;
              this.#liveSandboxes--;
            }
            await close();
          },
        });
      },
    };
    this.#counted.set(inner, counted);
    return counted;
  }

  /** The environment's `setup`, run once (on its first rollout); a failed one is tried again. */
  #setupOf(env: Environment<any, any, any>): Promise<unknown> {
    if (!env.setup) return Promise.resolve(undefined);
    let started = this.#setups.get(env.name);
    if (!started) {
      const run = Promise.resolve().then(() => env.setup!(this.#configs[env.name] ?? {}));
      run.catch(() => {
        if (this.#setups.get(env.name) === run) this.#setups.delete(env.name);
      });
      this.#setups.set(env.name, run);
      started = run;
    }
    return started;
  }

  /**
   * Runs one stage of a job in that stage's pool, within its time budget: INIT within
   * `init_timeout_s` (start-up is infrastructure work, with a limit of its own), RUN and EVAL
   * within what is left of `time_limit_s`. `excluded` is a clock of time the stage spends on work
   * that is not the policy's (starts at first use before the policy acted): the deadline
   * leaves it out.
   */
  async #stage<T>(name: StageName, job: Job, work: (signal: AbortSignal) => Promise<T>, excluded?: () => number): Promise<T> {
    const enqueued = performance.now();
    job.stage = name;
    job.active = false;
    const limits = job.task.limits;
    const initLimitS = limits.init_timeout_s ?? DEFAULT_START_TIMEOUT_MS / 1000; // tasks stored before the field
    const what = name === 'init' ? `init_timeout_s of ${initLimitS} s` : `time limit of ${limits.time_limit_s} s`;
    return this.#queues[name].add(
      async () => {
        job.timing[name].queued_ms = performance.now() - enqueued;
        const budget = name === 'init' ? initLimitS * 1000 : limits.time_limit_s * 1000 - job.usedMs;
        if (budget <= 0) {
          job.outOfTime = true;
          throw new RolloutError({ code: 'TIMEOUT', message: `${what} reached before ${name}` });
        }
        job.active = true;
        // The stage's time limit aborts the job's own signal (a timed-out rollout ends there), so a
        // stage costs one timer, not a timeout signal and a composite one (AbortSignal.timeout's
        // timers live until the signal is collected).
        const signal = job.abort.signal;
        const timeout = () => new RolloutError({ code: 'TIMEOUT', message: `${what} reached in ${name}` });
        const started = performance.now();
        const excludedAt = excluded?.() ?? 0;
        const charged = () => performance.now() - started - ((excluded?.() ?? 0) - excludedAt);
        let deadline: NodeJS.Timeout;
        const expire = (): void => {
          const left = budget - charged();
          if (left >= 1) deadline = setTimeout(expire, Math.ceil(left));
          else {
            if (name !== 'init') job.outOfTime = true;
            job.abort.abort(timeout());
          }
        };
        deadline = setTimeout(expire, Math.ceil(budget));
        try {
          return await new Promise<T>((resolve, reject) => {
            const onAbort = () => {
              const reason: unknown = signal.reason;
              const code = RolloutError.isInstance(reason) ? reason.code : undefined;
              reject(code === 'TIMEOUT' ? timeout() : code === 'CANCELLED' ? reason : cancelled());
            };
            if (signal.aborted) return onAbort();
            signal.addEventListener('abort', onAbort, { once: true });
            work(signal).then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
          });
        } finally {
          clearTimeout(deadline);
          const elapsed = performance.now() - started;
          job.active = false;
          if (name !== 'init') job.usedMs += charged();
          job.timing[name].active_ms = elapsed;
          this.#options.metrics?.stageLatency.observe({ stage: name }, elapsed / 1000);
        }
      },
      { signal: job.abort.signal },
    ) as Promise<T>;
  }

  async #run(job: Job): Promise<void> {
    const { task } = job;
    const env = job.env;
    if (!env) {
      this.#finish(job, failedOutcome(new RolloutError({ code: 'NOT_FOUND', message: `environment "${task.env}" is not served here` }), 'init', [], [], null));
      return;
    }
    const session = this.#sessions.get(job.id);
    const config = this.#configs[env.name] ?? {};
    const logger = this.logger.child({ rollout: job.id, env: env.name });
    const models = this.#options.models;
    const metrics = this.#options.metrics;
    // made first thing in INIT: the one session's tools and the environment's resources
    let tools!: SessionTools;
    let resources: unknown;
    const ctx = (signal: AbortSignal): EnvironmentContext => ({ session, config, logger, signal, tools, resources });
    const row = { ...task.row } as Record<string, unknown> & { responses_create_params: { input: unknown } };
    let stage: StageName = 'init';
    let turns: TurnRecord[] = [];
    let messages: Array<Record<string, unknown>> = [];
    let response: Record<string, unknown> | null = null;
    let outcome: Outcome;
    // Wall time of model calls in RUN (a call in flight included): not the policy's (see timeoutIsPolicys).
    let modelDoneMs = 0;
    let modelSince: number | undefined;
    const modelMs = () => modelDoneMs + (modelSince === undefined ? 0 : performance.now() - modelSince);
    let policyRunMs = 0;
    // The row as the environment's schema gives it, parsed once, at INIT (a node's rows come over
    // the wire): the sandbox's spec and verify both take it.
    let fitted: object = {};
    const progress: NonNullable<Parameters<typeof runAgentLoop>[0]['progress']> = {};
    try {
      await this.#stage('init', job, async (signal) => {
        resources = await this.#setupOf(env);
        fitted = env.row.parse(row) as object;
        const sandboxRow = env.sandbox?.spec ? { ...row, ...fitted } : undefined;
        const spec = withTaskLimits(sandboxSpecOf(env.sandbox, sandboxRow, config), task.limits.sandbox);
        tools = createSessionTools(session, {
          provider: this.#sandboxes(env.sandbox?.provider?.(config, resources)),
          spec,
          startTimeoutMs: (task.limits.init_timeout_s ?? DEFAULT_START_TIMEOUT_MS / 1000) * 1000,
        });
        // Everything the offered tools run on starts now, in parallel (the shell beside the
        // kernel), under INIT's limit: a call's time limit then counts only the call's own work.
        const rowTools: unknown = (row.responses_create_params as { tools?: unknown }).tools;
        const prepared = offeredDefinitions(env, Array.isArray(rowTools) ? rowTools : undefined)
          .filter((tool) => tool.prepare !== undefined)
          .map((tool) => Promise.resolve().then(() => tool.prepare!(ctx(signal))));
        const seeded = (async () => {
          if (env.sandbox) await tools.sandbox();
          const seedRow = env.seedRow ? env.seedRow.parse(row) : row;
          if (env.seedSession) await env.seedSession({ ...row, ...(seedRow as object) }, ctx(signal));
        })();
        await Promise.all([seeded, ...prepared]);
      });
      stage = 'run';
      // From here the tools serve the policy: a start that fails after it has acted in the
      // sandbox may be its doing, so it is the call's error, not INIT's (SessionTools.policyBegins).
      tools.policyBegins();
      const callModel = models.forRollout(job.id, task.policy);
      const loop = await this.#stage('run', job, (signal) =>
        runAgentLoop({
          env,
          row: row as never,
          ctx: { session, config, logger, tools, resources },
          callModel: async (request, s) => {
            const stop = metrics?.llmLatency.startTimer();
            const since = (modelSince = performance.now());
            try {
              return await callModel(request, s);
            } finally {
              // a call that outlived its stage (aborted) was counted when the stage ended
              if (modelSince === since) {
                modelDoneMs += performance.now() - since;
                modelSince = undefined;
              }
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
          progress,
        }),
        // starts after the policy acted are its time (SessionTools.startupBeforeActMs)
        () => tools.startupBeforeActMs(),
      ).finally(() => {
        // RUN is the first stage charged to the time limit: what it used is job.usedMs now
        policyRunMs = job.usedMs - modelMs();
        if (modelSince !== undefined) {
          modelDoneMs = modelMs();
          modelSince = undefined;
        }
      });
      turns = loop.turns;
      messages = loop.messages as Array<Record<string, unknown>>;
      response = buildResponse({ id: job.id, model: task.policy.model, turns, tools: loop.offeredTools, usage: loop.usage });
      if (loop.stop === 'resource_limit') {
        throw new RolloutError({ code: 'RESOURCE_LIMIT', message: `the rollout's sandbox went past a limit and was ended: ${loop.limit}` });
      }
      if (loop.stop === 'start_failed') {
        // A start at first use that failed or missed init_timeout_s before the policy acted:
        // INIT's failure, however late (after it acted, the call's error: see policyBegins).
        stage = 'init';
        throw loop.startError!;
      }
      models.release(job.id);
      stage = 'eval';
      // The agent's resources (sandbox, kernels) are freed before EVAL unless the environment
      // evaluates in them; the session's state stays for verify.
      if (!env.sandbox?.keepForVerify) await this.#sessions.releaseResources(job.id);
      const verified = await this.#stage('eval', job, async (signal) => {
        return env.verify({ ...row, ...fitted }, response as never, ctx(signal));
      });
      const { reward, reward_components, ...extras } = verified as { reward: number; reward_components?: Record<string, number> };
      const unscored = verifyFailure(extras);
      if (unscored !== undefined) {
        // verify could not score it (NeMo Gym's `_ng_failure_class`: a judge outage, say): an
        // infrastructure failure of EVAL, filtered, never a reward 0 to train on
        outcome = { state: 'failed', reward: 0, reward_components: null, verify_extras: extras, critical_error: 'eval', error: unscored, response, messages, turns };
      } else {
        const score = typeof reward === 'number' && Number.isFinite(reward) ? reward : 0;
        outcome = { state: 'done', reward: score, reward_components: reward_components ?? null, verify_extras: extras, critical_error: null, error: null, response, messages, turns };
      }
    } catch (error) {
      if (stage === 'run' && job.outOfTime && progress.snapshot) {
        // cut short by the time limit: what the policy produced until then is the sample's
        try {
          const partial = progress.snapshot();
          response = buildResponse({ id: job.id, model: task.policy.model, turns: partial.turns, tools: partial.offeredTools, usage: partial.usage });
          turns = partial.turns;
          messages = partial.messages as Array<Record<string, unknown>>;
        } catch (snapshotError) {
          logger.error({ err: snapshotError }, 'the trajectory of a timed-out rollout could not be kept');
        }
      }
      outcome = failedOutcome(error, stage, turns, messages, response);
      if (outcome.critical_error === 'timeout' && job.outOfTime && timeoutIsPolicys(policyRunMs, task.limits.time_limit_s)) {
        // The policy spent the time itself (sleeping in its tools, say): filtering that would let
        // it turn a sample it fails into one never trained on. Reward 0 like an unfinished answer;
        // EVAL is not run, as the time limit that also covers it is spent.
        outcome.policyTimeout = true;
        outcome.error = {
          code: 'TIMEOUT',
          message: `${outcome.error!.message}; the policy's own time in RUN (its tool calls) was ${(policyRunMs / 1000).toFixed(1)} s, at least half the limit: scored as reward 0`,
        };
      }
      if (outcome.critical_error !== 'cancelled') logger.warn({ err: error, stage }, 'rollout failed');
    }
    // Everything the rollout held is freed before anyone hears of its result.
    models.release(job.id);
    await this.#sessions.end(job.id);
    this.#finish(job, outcome);
  }

  #finish(job: Job, { policyTimeout, ...outcome }: Outcome): void {
    // (the keys in the schema's order, the order the API sends them in)
    const result: RolloutResult = {
      id: job.id,
      task_id: job.taskId,
      sample_index: job.sampleIndex,
      env: job.task.env,
      state: outcome.state,
      reward: outcome.reward,
      reward_components: outcome.reward_components,
      verify_extras: outcome.verify_extras,
      critical_error: outcome.critical_error,
      // a sandbox limit the policy ran into, or a time limit it spent itself, is the policy's
      // doing: a real 0, to train on
      filter: outcome.critical_error !== null && outcome.error?.code !== 'RESOURCE_LIMIT' && policyTimeout !== true,
      error: outcome.error,
      advantage: null,
      credit: null,
      timing: { ...job.timing, total_ms: performance.now() - job.startedAt },
      response: outcome.response,
      messages: outcome.messages,
      turns: outcome.turns,
      ...(job.task.metadata ? { metadata: job.task.metadata } : {}),
      finished_at: new Date().toISOString(),
    };
    // Turn credit (rewards/), scored once here for every way a rollout ends: the sample's own now;
    // shaping and advantages need every sample of the task, so they are done by whoever sees the
    // group whole (the service's commit).
    assignSampleCredit(result, resolveCredit(job.task), job.task.n);
    this.#jobs.delete(job.id);
    job.resolve(result);
  }

  /** Aborts everything held (results come out cancelled), frees every session, closes the environments. */
  async close(message = 'shutting down'): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const pending = [...this.#jobs.values()];
    for (const job of pending) job.abort.abort(cancelled(message));
    await Promise.all(pending.map((job) => job.done));
    await this.#sessions.close();
    await Promise.all(
      this.#options.environments.map(async (env) => {
        if (!env.setup) return env.close?.(undefined);
        const started = this.#setups.get(env.name);
        if (started === undefined) return;
        const ran = await started.then((value) => ({ value }), () => undefined);
        if (ran) await env.close?.(ran.value);
      }),
    );
  }
}
