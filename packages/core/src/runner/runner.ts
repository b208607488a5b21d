import { pino, type Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import { SessionStore } from '../server/session-store.ts';
import type { SandboxProvider, SandboxSpec } from '../sandbox/types.ts';
import type { Environment } from '../spec/environment.ts';
import { RunnerEnvironments, type EnvironmentSetups } from './environments.ts';
import { cancelled, createJob, runningOf, type Job, type RunnerJob, type RunningRollout } from './job.ts';
import type { ServiceMetrics } from './metrics.ts';
import type { ModelProvider } from './model-provider.ts';
import { failedOutcome, rolloutResult, type Outcome } from './outcome.ts';
import { readyImage, RolloutStages, type StageParts } from './rollout-stages.ts';
import { ImagePrefetcher } from './prefetch.ts';
import { StagePools } from './stage-pools.ts';
import type { RolloutResult, RolloutTask, StageName } from '../protocol/rollout.ts';

export { STAGES, type StageName } from '../protocol/rollout.ts';
export type { RunnerJob, RunningRollout } from './job.ts';
export type { ModelProvider } from './model-provider.ts';
export type { EnvironmentSetups } from './environments.ts';

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
  /**
   * What the environments' `setup`s returned, shared with another runner of this process (the
   * start-up warm-up's): setups found there are not run again, those run here are added.
   * @default a map of this runner's own
   */
  environmentSetups?: EnvironmentSetups;
  /** Whether closing the runner closes the environments (false when another runner owns `environmentSetups`). @default true */
  closeEnvironments?: boolean;
  logger?: Logger;
  /** Where stage, tool and policy latencies are observed. */
  metrics?: Pick<ServiceMetrics, 'stageLatency' | 'toolLatency' | 'llmLatency'>;
}

/**
 * Runs rollouts on this machine: INIT (session and seedSession) → RUN (agent loop) → EVAL
 * (verify), each stage with its own bounded worker pool, so that a slow verifier never holds
 * sandbox start-up or generation. A job holds a slot only while it is in a stage, and its time
 * limit counts stage time only. The central service runs one for its own pools; every rollout
 * node (`rollserve node`) runs one. It knows nothing of stores or leases: it turns a job into its
 * result (failures and cancellations are results too).
 *
 * The assembly of its parts: the served environments (environments.ts), the stage pools and
 * their time budgets (stage-pools.ts), each rollout's stage work (rollout-stages.ts) and its
 * result (outcome.ts).
 */
export class RolloutRunner {
  readonly logger: Logger;
  readonly #environments: RunnerEnvironments;
  readonly #pools: StagePools;
  readonly #sessions: SessionStore;
  readonly #prefetcher: ImagePrefetcher;
  readonly #parts: StageParts;
  readonly #jobs = new Map<string, Job>();
  #closed = false;

  constructor(options: RolloutRunnerOptions) {
    this.logger = options.logger ?? pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
    this.#environments = new RunnerEnvironments(options.environments, options.environmentConfigs, options.sandboxProvider, {
      setups: options.environmentSetups,
      closeEnvironments: options.closeEnvironments,
    });
    this.#pools = new StagePools({ pools: options.pools, pipeline: options.pipeline, metrics: options.metrics });
    this.#sessions = new SessionStore({ idleTtlMs: 7 * 24 * 3_600_000, logger: this.logger });
    this.#prefetcher = new ImagePrefetcher({ logger: this.logger });
    this.#parts = {
      pools: this.#pools,
      prefetcher: this.#prefetcher,
      environments: this.#environments,
      sessions: this.#sessions,
      models: options.models,
      metrics: options.metrics,
      logger: this.logger,
    };
  }

  get environments(): string[] {
    return this.#environments.names;
  }

  environment(name: string): Environment<any, any, any> | undefined {
    return this.#environments.get(name);
  }

  /** Worker slots per stage. */
  get capacity(): Record<StageName, number> {
    return this.#pools.capacity;
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
    return this.#environments.rowSandboxSpec(envName, row);
  }

  /**
   * Readies the sandbox image of a task likely to come here soon (a node's `upcoming`): a hint,
   * after the images of the rollouts held here, within the prefetcher's bounds, holding nothing.
   */
  prefetchTask(task: RolloutTask): void {
    const env = this.#environments.get(task.env);
    if (!this.#closed && env !== undefined) void readyImage(this.#parts, env, task, { hint: true });
  }

  running(id: string): RunningRollout | undefined {
    const job = this.#jobs.get(id);
    return job && runningOf(job);
  }

  /** Every rollout held. */
  held(): RunningRollout[] {
    return [...this.#jobs.values()].map(runningOf);
  }

  /**
   * Runs a job; resolves with its result (never rejects: a failure or a cancellation is a result).
   * The result carries the sample's own credit; a group's credit is the caller's business.
   */
  run(input: RunnerJob): Promise<RolloutResult> {
    if (this.#closed) return Promise.reject(new RolloutError({ code: 'UNAVAILABLE', message: 'the runner is closed', retryable: true }));
    if (this.#jobs.has(input.id)) throw new RolloutError({ code: 'CONFLICT', message: `rollout "${input.id}" is already running here` });
    const job = createJob(input, this.#environments.get(input.task.env));
    this.#jobs.set(job.id, job);
    this.#pools.admit(() => this.#run(job).catch((error: unknown) => this.logger.error({ err: error, rollout: job.id }, 'rollout bookkeeping failed')));
    return job.done;
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
    return { stages: this.#pools.status(), live_sessions: this.#sessions.size, live_sandboxes: this.#environments.liveSandboxes };
  }

  async #run(job: Job): Promise<void> {
    if (!job.env) {
      const missing = new RolloutError({ code: 'NOT_FOUND', message: `environment "${job.task.env}" is not served here` });
      this.#finish(job, failedOutcome(missing, 'init', { response: null, messages: [], turns: [] }));
      return;
    }
    const outcome = await new RolloutStages(job, job.env, this.#parts).outcome();
    // Everything the rollout held is freed before anyone hears of its result.
    this.#parts.models.release(job.id);
    await this.#sessions.end(job.id);
    this.#finish(job, outcome);
  }

  #finish(job: Job, outcome: Outcome): void {
    const result = rolloutResult(job, outcome);
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
    await this.#prefetcher.close();
    await this.#sessions.close();
    await this.#environments.close();
  }
}
