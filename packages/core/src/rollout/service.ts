import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import PQueue from 'p-queue';
import { z } from 'zod';
import { pino, type Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import { createSandboxProvider } from '../sandbox/registry.ts';
import type { SandboxProvider, SandboxResources, SandboxSpec } from '../sandbox/types.ts';
import { createSessionTools, type SessionTools } from '../tools/session-tools.ts';
import { SessionStore } from '../gym/session-store.ts';
import { sandboxSpecOf, type Environment, type EnvironmentContext } from '../spec/environment.ts';
import { runAgentLoop, type CallModel } from './agent-loop.ts';
import { assignTaskGroupCredit, assignTaskSampleCredit, assignTurnRewards } from './credit.ts';
import { Journal, type JournalRecord } from './journal.ts';
import { buildResponse } from './messages.ts';
import { createServiceMetrics, type ServiceMetrics } from './metrics.ts';
import { RolloutTask, type CriticalError, type RolloutResult, type RolloutState, type RolloutTaskInput, type RolloutView, type StageTiming, type TurnRecord } from './types.ts';

export type StageName = 'init' | 'run' | 'eval';
export const STAGES: readonly StageName[] = ['init', 'run', 'eval'];

/** Where the policy's turns go: one sticky caller per rollout. */
export interface ModelProvider {
  forRollout(rolloutId: string, policy: RolloutTask['policy']): CallModel;
  release(rolloutId: string): void;
}

export interface RolloutServiceOptions {
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
  /** JSONL journal of tasks and results; omitted: results live in memory only. */
  journalPath?: string;
  /**
   * fdatasync each journal write: accepted tasks and results then survive the machine going down,
   * not just the process (SIGKILL, OOM). Writes are grouped, so it costs one sync per write.
   * @default false
   */
  journalFsync?: boolean;
  logger?: Logger;
}

interface Job {
  id: string;
  taskId: string;
  sampleIndex: number;
  task: RolloutTask;
  env: Environment<any, any, any>;
  state: RolloutState;
  /** Holding a slot of its stage (else waiting for one). */
  active: boolean;
  abort: AbortController;
  usedMs: number;
  timing: Record<StageName, StageTiming>;
  startedAt: number;
  result?: RolloutResult;
  /** Set the moment its result exists, before any await: the group's last sample is the one that sees all. */
  completed?: RolloutResult;
  done: Promise<RolloutResult>;
  resolve: (result: RolloutResult) => void;
}

export interface SubmittedTask {
  taskId: string;
  rolloutIds: string[];
  /** True when the id was known: nothing new was started. */
  existing: boolean;
}


/** What a finished rollout's stages produced. */
type Outcome = Pick<RolloutResult, 'state' | 'reward' | 'rewardComponents' | 'verifyExtras' | 'criticalError' | 'error' | 'response' | 'messages' | 'turns'>;

/** The outcome of a rollout that did not get through its stages. */
function failedOutcome(
  error: unknown,
  stage: StageName,
  turns: TurnRecord[],
  messages: Array<Record<string, unknown>>,
  response: Record<string, unknown> | null,
): Outcome {
  const wrapped = RolloutError.from(error);
  const criticalError: CriticalError = wrapped.code === 'CANCELLED' ? 'cancelled' : wrapped.code === 'TIMEOUT' ? 'timeout' : stage;
  return {
    state: criticalError === 'cancelled' ? 'cancelled' : 'failed',
    reward: 0,
    rewardComponents: null,
    verifyExtras: {},
    criticalError,
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
  } as const satisfies Record<keyof NonNullable<typeof limits>, keyof SandboxResources>;
  const resources: SandboxResources = { ...spec.resources };
  for (const [key, name] of Object.entries(names)) {
    const value = limits[key as keyof typeof names];
    if (value !== undefined) resources[name] = value;
  }
  return { ...spec, resources };
}

interface KnownTask {
  task: RolloutTask;
  rolloutIds: string[];
  fingerprint?: string;
}

const TERMINAL: ReadonlySet<RolloutState> = new Set(['done', 'failed', 'cancelled']);

function stableStringify(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    v && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v,
  );
}

/**
 * The rollout service's engine: INIT (session and seedSession) → RUN (agent loop) → EVAL (verify),
 * each stage with its own bounded worker pool, so that a slow verifier never holds sandbox
 * start-up or generation. A job holds a slot only while it is in a stage, and its time limit
 * counts stage time only.
 */
export class RolloutService {
  readonly metrics: ServiceMetrics;
  readonly logger: Logger;
  readonly #envs = new Map<string, Environment<any, any, any>>();
  readonly #configs: Record<string, Record<string, unknown>>;
  readonly #queues: Record<StageName, PQueue>;
  readonly #serial: PQueue | undefined;
  readonly #jobs = new Map<string, Job>();
  /** Known tasks; a task's fingerprint (to tell a resubmission from a conflict) is made when it is resubmitted. */
  readonly #tasks = new Map<string, KnownTask>();
  readonly #order: string[] = [];
  readonly #sessions: SessionStore;
  readonly #events = new EventEmitter();
  readonly #counts = { done: 0, failed: 0, cancelled: 0 };
  #journal: Journal | undefined;
  #closed = false;
  /** The providers sandboxes come from, each wrapped to count what it has open. */
  readonly #counted = new Map<SandboxProvider, SandboxProvider>();
  #defaultProvider: SandboxProvider | undefined;
  /** What each environment's `setup` returned (started on its first rollout). */
  readonly #setups = new Map<string, Promise<unknown>>();
  #liveSandboxes = 0;
  /** Accepted jobs not started yet (see #admit). */
  #backlog: Job[] = [];
  /** The submit being accepted (one at a time). */
  #submitting: Promise<unknown> = Promise.resolve();

  private constructor(private readonly options: RolloutServiceOptions) {
    this.logger = options.logger ?? pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
    for (const env of options.environments) this.#envs.set(env.name, env);
    this.#configs = {};
    for (const env of options.environments) {
      const given = options.environmentConfigs?.[env.name] ?? {};
      this.#configs[env.name] = (env.config ? env.config.parse(given) : given) as Record<string, unknown>;
    }
    const pools = { init: 64, run: 512, eval: 32, ...options.pools };
    this.#serial = options.pipeline === 'serial' ? new PQueue({ concurrency: pools.run }) : undefined;
    // In serial mode the stages run inside the job's one slot: their own queues never wait.
    const unbounded = Number.POSITIVE_INFINITY;
    this.#queues = {
      init: new PQueue({ concurrency: this.#serial ? unbounded : pools.init }),
      run: new PQueue({ concurrency: this.#serial ? unbounded : pools.run }),
      eval: new PQueue({ concurrency: this.#serial ? unbounded : pools.eval }),
    };
    this.#sessions = new SessionStore({ idleTtlMs: 7 * 24 * 3_600_000, logger: this.logger });
    this.#events.setMaxListeners(0);
    this.metrics = createServiceMetrics(() => this.status());
  }

  /** Creates the service; with a journal, stored results come back and unfinished samples run again. */
  static async create(options: RolloutServiceOptions): Promise<RolloutService> {
    const service = new RolloutService(options);
    if (options.journalPath) await service.#recover(options.journalPath, options.journalFsync ?? false);
    return service;
  }

  get environments(): string[] {
    return [...this.#envs.keys()];
  }

  /** A served environment by name (its metrics hooks, say). */
  environment(name: string): Environment<any, any, any> | undefined {
    return this.#envs.get(name);
  }

  async #recover(path: string, fsync: boolean): Promise<void> {
    const { journal, contents } = await Journal.open(path, { fsync });
    this.#journal = journal;
    let rerun = 0;
    for (const record of contents.tasks.values()) {
      const env = this.#envs.get(record.task.env);
      this.#tasks.set(record.taskId, { task: record.task, rolloutIds: record.rolloutIds });
      record.rolloutIds.forEach((id, sampleIndex) => {
        const stored = contents.results.get(id);
        if (stored) {
          const job = this.#newJob(id, record.taskId, sampleIndex, record.task, env);
          this.#finish(job, stored, false);
        } else if (env) {
          this.#admit(this.#newJob(id, record.taskId, sampleIndex, record.task, env));
          rerun++;
        }
      });
    }
    if (contents.skippedLines > 0) this.logger.warn({ skipped: contents.skippedLines }, 'journal lines cut short were skipped');
    this.logger.info({ results: contents.results.size, rerun }, 'journal recovered');
  }

  /**
   * Accepts tasks: the new ones are journaled in one write, then answered with their rollout ids;
   * their work starts in the background. A batch is accepted whole or not at all.
   */
  async submit(inputs: readonly RolloutTaskInput[]): Promise<SubmittedTask[]> {
    if (this.#closed) throw new RolloutError({ code: 'UNAVAILABLE', message: 'the service is shutting down', retryable: true });
    const tasks = inputs.map((input) => RolloutTask.parse(input));
    for (const task of tasks) {
      if (!this.#envs.has(task.env)) {
        throw new RolloutError({ code: 'NOT_FOUND', message: `unknown environment "${task.env}" (served: ${this.environments.join(', ') || 'none'})` });
      }
      const env = this.#envs.get(task.env)!;
      for (const schema of env.seedRow ? [env.row, env.seedRow] : [env.row]) {
        const parsed = schema.safeParse(task.row);
        if (!parsed.success) {
          throw new RolloutError({ code: 'UNPROCESSABLE', message: `row does not fit environment "${task.env}": ${z.prettifyError(parsed.error)}`, details: parsed.error.issues });
        }
      }
    }
    // One batch at a time from here, so that a task id is known to the next batch once journaled.
    const accepted = this.#submitting.then(() => this.#accept(tasks));
    this.#submitting = accepted.catch(() => undefined);
    return accepted;
  }

  async #accept(tasks: readonly RolloutTask[]): Promise<SubmittedTask[]> {
    const unavailable = () => new RolloutError({ code: 'UNAVAILABLE', message: 'the service is shutting down', retryable: true });
    if (this.#closed) throw unavailable();
    const submitted: SubmittedTask[] = [];
    const fresh = new Map<string, KnownTask>();
    const records: JournalRecord[] = [];
    const at = new Date().toISOString();
    for (const task of tasks) {
      const taskId = task.id ?? randomUUID();
      const known = this.#tasks.get(taskId) ?? fresh.get(taskId);
      if (known) {
        if ((known.fingerprint ??= stableStringify(known.task)) !== stableStringify({ ...task, id: taskId })) {
          throw new RolloutError({ code: 'CONFLICT', message: `task id "${taskId}" was already submitted with a different body` });
        }
        submitted.push({ taskId, rolloutIds: known.rolloutIds, existing: true });
        continue;
      }
      const rolloutIds = Array.from({ length: task.n }, (_, k) => (task.n === 1 ? taskId : `${taskId}:${k}`));
      const normalised = { ...task, id: taskId };
      fresh.set(taskId, { rolloutIds, task: normalised });
      records.push({ type: 'task', taskId, task: normalised, rolloutIds, at });
      submitted.push({ taskId, rolloutIds, existing: false });
    }
    // Journaled before it is known, in one write: a batch that could not be written was never
    // accepted; once written, a restart runs it even if the service dies before answering.
    if (records.length > 0) await this.#journal?.append(records);
    if (this.#closed) throw unavailable(); // journaled: it runs after the restart
    for (const [taskId, known] of fresh) {
      this.#tasks.set(taskId, known);
      const { rolloutIds, task } = known;
      const env = this.#envs.get(task.env)!;
      rolloutIds.forEach((id, k) => this.#admit(this.#newJob(id, taskId, k, task, env)));
    }
    return submitted;
  }

  #newJob(id: string, taskId: string, sampleIndex: number, task: RolloutTask, env: Environment<any, any, any> | undefined): Job {
    let resolve!: (result: RolloutResult) => void;
    const done = new Promise<RolloutResult>((r) => (resolve = r));
    const job: Job = {
      id,
      taskId,
      sampleIndex,
      task,
      env: env ?? ({ name: task.env } as Environment<any, any, any>),
      state: 'queued',
      active: false,
      abort: new AbortController(),
      usedMs: 0,
      timing: { init: { queuedMs: 0, activeMs: 0 }, run: { queuedMs: 0, activeMs: 0 }, eval: { queuedMs: 0, activeMs: 0 } },
      startedAt: performance.now(),
      done,
      resolve,
    };
    this.#jobs.set(id, job);
    this.#order.push(id);
    return job;
  }

  /**
   * Queues a job to start soon, off the caller's path: starting one runs the synchronous part of
   * its first stage (a sandbox's creation, for one), so the backlog is started a slice of the
   * event loop at a time and a big batch neither delays its own 202 nor stalls other requests.
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
   * The environment's sandbox provider (else the service's), counting what it has open
   * (GET /v1/status, /metrics).
   */
  #sandboxes(given?: SandboxProvider): SandboxProvider {
    const inner = given ?? (this.#defaultProvider ??= this.options.sandboxProvider ?? createSandboxProvider());
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

  /** Runs one stage of a job in that stage's pool, within what is left of the job's time budget. */
  async #stage<T>(name: StageName, job: Job, work: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const enqueued = performance.now();
    job.state = name;
    job.active = false;
    return this.#queues[name].add(
      async () => {
        job.timing[name].queuedMs = performance.now() - enqueued;
        const budget = job.task.limits.time_limit_s * 1000 - job.usedMs;
        if (budget <= 0) throw new RolloutError({ code: 'TIMEOUT', message: `time limit of ${job.task.limits.time_limit_s} s reached before ${name}` });
        job.active = true;
        // The stage's time limit aborts the job's own signal (a timed-out rollout ends there), so a
        // stage costs one timer, not a timeout signal and a composite one (AbortSignal.timeout's
        // timers live until the signal is collected).
        const signal = job.abort.signal;
        const timeout = () => new RolloutError({ code: 'TIMEOUT', message: `time limit of ${job.task.limits.time_limit_s} s reached in ${name}` });
        const deadline = setTimeout(() => job.abort.abort(timeout()), Math.ceil(budget));
        const started = performance.now();
        try {
          return await new Promise<T>((resolve, reject) => {
            const onAbort = () => reject(RolloutError.isInstance(signal.reason) && signal.reason.code === 'TIMEOUT' ? timeout() : new RolloutError({ code: 'CANCELLED', message: 'rollout cancelled' }));
            if (signal.aborted) return onAbort();
            signal.addEventListener('abort', onAbort, { once: true });
            work(signal).then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
          });
        } finally {
          clearTimeout(deadline);
          const elapsed = performance.now() - started;
          job.active = false;
          job.usedMs += elapsed;
          job.timing[name].activeMs = elapsed;
          this.metrics.stageLatency.observe({ stage: name }, elapsed / 1000);
        }
      },
      { signal: job.abort.signal },
    ) as Promise<T>;
  }

  async #run(job: Job): Promise<void> {
    const { task, env } = job;
    const session = this.#sessions.get(job.id);
    const config = this.#configs[env.name] ?? {};
    const logger = this.logger.child({ rollout: job.id, env: env.name });
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
    try {
      await this.#stage('init', job, async (signal) => {
        resources = await this.#setupOf(env);
        const sandboxRow = env.sandbox?.spec ? { ...row, ...(env.row.parse(row) as object) } : undefined;
        const spec = withTaskLimits(sandboxSpecOf(env.sandbox, sandboxRow, config), task.limits.sandbox);
        tools = createSessionTools(session, { provider: this.#sandboxes(env.sandbox?.provider?.(config, resources)), spec });
        if (env.sandbox) await tools.sandbox();
        const seedRow = env.seedRow ? env.seedRow.parse(row) : row;
        if (env.seedSession) await env.seedSession({ ...row, ...(seedRow as object) }, ctx(signal));
      });
      stage = 'run';
      const callModel = this.options.models.forRollout(job.id, task.policy);
      const loop = await this.#stage('run', job, (signal) =>
        runAgentLoop({
          env,
          row: row as never,
          ctx: { session, config, logger, tools, resources },
          callModel: async (request, s) => {
            const stop = this.metrics.llmLatency.startTimer();
            try {
              return await callModel(request, s);
            } finally {
              stop();
            }
          },
          maxTurns: task.limits.max_turns,
          toolTimeoutMs: task.limits.tool_timeout_s * 1000,
          signal,
          onToolCall: (call) => this.metrics.toolLatency.observe({ tool: call.name, status: call.status }, call.durationMs / 1000),
          checkLimits: () => tools.limitExceeded(),
        }),
      );
      turns = loop.turns;
      messages = loop.messages as Array<Record<string, unknown>>;
      response = buildResponse({ id: job.id, model: task.policy.model, turns, tools: loop.offeredTools, usage: loop.usage });
      if (loop.stop === 'resource_limit') {
        throw new RolloutError({ code: 'RESOURCE_LIMIT', message: `the rollout's sandbox went past a limit and was ended: ${loop.limit}` });
      }
      this.options.models.release(job.id);
      stage = 'eval';
      // The agent's resources (sandbox, kernels) are freed before EVAL unless the environment
      // evaluates in them; the session's state stays for verify.
      if (!env.sandbox?.keepForVerify) await this.#sessions.releaseResources(job.id);
      const verified = await this.#stage('eval', job, async (signal) => {
        const verifyRow = env.row.parse(row) as object;
        return env.verify({ ...row, ...verifyRow }, response as never, ctx(signal));
      });
      const { reward, reward_components, ...extras } = verified as { reward: number; reward_components?: Record<string, number> };
      const score = typeof reward === 'number' && Number.isFinite(reward) ? reward : 0;
      assignTurnRewards(turns, score, task.turn_rewards, task.gamma);
      outcome = { state: 'done', reward: score, rewardComponents: reward_components ?? null, verifyExtras: extras, criticalError: null, error: null, response, messages, turns };
    } catch (error) {
      outcome = failedOutcome(error, stage, turns, messages, response);
      if (outcome.criticalError !== 'cancelled') logger.warn({ err: error, stage }, 'rollout failed');
      assignTurnRewards(turns, 0, task.turn_rewards, task.gamma);
    }
    // Everything the rollout held is freed before anyone hears of its result.
    this.options.models.release(job.id);
    await this.#sessions.end(job.id);
    await this.complete(job, outcome);
  }

  /**
   * Journals a finished rollout and tells its waiters. Results finishing together share the
   * journal's next write (and fsync): see Journal.
   */
  private async complete(job: Job, outcome: Outcome): Promise<void> {
    const result: RolloutResult = {
      id: job.id,
      taskId: job.taskId,
      sampleIndex: job.sampleIndex,
      env: job.task.env,
      ...outcome,
      // a sandbox limit the policy ran into is the policy's doing: a real 0, to train on
      filter: outcome.criticalError !== null && outcome.error?.code !== 'RESOURCE_LIMIT',
      advantage: null,
      credit: null,
      timing: { ...job.timing, totalMs: performance.now() - job.startedAt },
      ...(job.task.metadata ? { metadata: job.task.metadata } : {}),
      finishedAt: new Date().toISOString(),
    };
    // Turn credit (rewards/): the sample's own now; shaping and advantages need every sample of
    // the task, so they are done when the last one finishes.
    assignTaskSampleCredit(result, job.task);
    job.completed = result;
    const group = this.#tasks.get(job.taskId)?.rolloutIds.map((id) => {
      const other = this.#jobs.get(id);
      return other?.completed ?? other?.result; // (a result read back from the journal at start)
    });
    const records: Array<{ type: 'result'; result: RolloutResult }> = [{ type: 'result', result }];
    if (group && group.length > 1 && group.every((r) => r !== undefined)) {
      await assignTaskGroupCredit(group as RolloutResult[], job.task);
      // the others were journaled before their group was whole: again, with their group's credit
      // (the journal keeps a rollout's last record)
      for (const other of group as RolloutResult[]) if (other !== result) records.push({ type: 'result', result: other });
    }
    try {
      await this.#journal?.append(records);
    } catch (error) {
      this.logger.error({ err: error, rollout: job.id }, 'journal write failed: the result is kept in memory only');
    }
    this.#finish(job, result, true);
  }

  #finish(job: Job, result: RolloutResult, fresh: boolean): void {
    job.result = result;
    job.state = result.state;
    this.#counts[result.state === 'done' ? 'done' : result.state === 'cancelled' ? 'cancelled' : 'failed']++;
    if (fresh) this.metrics.finished.inc({ state: result.state, critical_error: result.criticalError ?? 'none' });
    job.resolve(result);
    this.#events.emit('result', result);
  }

  get(id: string): RolloutView | undefined {
    const job = this.#jobs.get(id);
    if (!job) return undefined;
    return { id: job.id, taskId: job.taskId, sampleIndex: job.sampleIndex, env: job.task.env, state: job.state, active: job.active, result: job.result ?? null };
  }

  /** The rollout ids of a task, if it is known. */
  taskRollouts(taskId: string): string[] | undefined {
    return this.#tasks.get(taskId)?.rolloutIds;
  }

  /** Rollouts in submission order, after `cursor` (an opaque position), at most `limit`. */
  list(options: { cursor?: string; limit?: number; state?: RolloutState; taskId?: string } = {}): { items: RolloutView[]; nextCursor: string | null } {
    const limit = Math.min(Math.max(options.limit ?? 100, 1), 1_000);
    let index = options.cursor ? Number.parseInt(Buffer.from(options.cursor, 'base64url').toString(), 10) : 0;
    if (!Number.isInteger(index) || index < 0) throw new RolloutError({ code: 'BAD_REQUEST', message: 'invalid cursor' });
    const items: RolloutView[] = [];
    while (index < this.#order.length && items.length < limit) {
      const view = this.get(this.#order[index++]!)!;
      if ((options.state === undefined || view.state === options.state) && (options.taskId === undefined || view.taskId === options.taskId)) items.push(view);
    }
    return { items, nextCursor: index < this.#order.length ? Buffer.from(String(index)).toString('base64url') : null };
  }

  /** Resolves with the rollout's result once it is finished. */
  async wait(id: string): Promise<RolloutResult> {
    const job = this.#jobs.get(id);
    if (!job) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout "${id}"` });
    return job.done;
  }

  /** Cancels a rollout: it leaves its queue or stage, its session and sandbox are freed. */
  cancel(id: string): RolloutView {
    const job = this.#jobs.get(id);
    if (!job) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout "${id}"` });
    if (!TERMINAL.has(job.state)) job.abort.abort(new RolloutError({ code: 'CANCELLED', message: 'rollout cancelled' }));
    return this.get(id)!;
  }

  /** Calls `listener` with every result as it completes; returns the unsubscribe function. */
  onResult(listener: (result: RolloutResult) => void): () => void {
    this.#events.on('result', listener);
    return () => this.#events.off('result', listener);
  }

  status(): {
    stages: Record<StageName, { queued: number; active: number; pool: number }>;
    rollouts: { total: number; done: number; failed: number; cancelled: number; inFlight: number };
    liveSessions: number;
    liveSandboxes: number;
  } {
    const stages = Object.fromEntries(
      STAGES.map((name) => [name, { queued: this.#queues[name].size, active: this.#queues[name].pending, pool: this.#queues[name].concurrency }]),
    ) as Record<StageName, { queued: number; active: number; pool: number }>;
    stages.init.queued += this.#backlog.length; // accepted, about to join INIT's queue
    if (this.#serial) {
      stages.init.queued += this.#serial.size;
      for (const stage of STAGES) stages[stage].pool = this.#serial.concurrency;
    }
    const finished = this.#counts.done + this.#counts.failed + this.#counts.cancelled;
    return { stages, rollouts: { total: this.#jobs.size, ...this.#counts, inFlight: this.#jobs.size - finished }, liveSessions: this.#sessions.size, liveSandboxes: this.#liveSandboxes };
  }

  /** Stops accepting work, cancels what is in flight, frees every session and closes the journal. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    // In-flight rollouts are not journaled as cancelled: after a restart they run again.
    const pending = [...this.#jobs.values()].filter((job) => !job.result);
    const journal = this.#journal;
    this.#journal = undefined;
    for (const job of pending) job.abort.abort(new RolloutError({ code: 'CANCELLED', message: 'service shutting down' }));
    await Promise.all(pending.map((job) => job.done));
    await this.#sessions.close();
    await journal?.close();
    await Promise.all(
      this.options.environments.map(async (env) => {
        if (!env.setup) return env.close?.(undefined);
        const started = this.#setups.get(env.name);
        if (started === undefined) return;
        const ran = await started.then((value) => ({ value }), () => undefined);
        if (ran) await env.close?.(ran.value);
      }),
    );
  }
}
