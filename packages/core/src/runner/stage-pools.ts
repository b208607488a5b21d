import PQueue from 'p-queue';
import { RolloutError } from '../errors.ts';
import { DEFAULT_START_TIMEOUT_MS } from '../tools/session-tools.ts';
import { cancelled, type Job } from './job.ts';
import type { ServiceMetrics } from './metrics.ts';
import { STAGES, type StageName } from '../protocol/rollout.ts';

export interface StagePoolsOptions {
  /** Worker slots per stage. @default { init: 64, run: 512, eval: 32 } */
  pools?: Partial<Record<StageName, number>> | undefined;
  /** See RolloutRunnerOptions.pipeline. */
  pipeline?: 'staged' | 'serial' | undefined;
  metrics?: Pick<ServiceMetrics, 'stageLatency'> | undefined;
}

export type StageStatus = Record<StageName, { queued: number; active: number; pool: number }>;

/**
 * The slots of INIT, RUN and EVAL, each stage a bounded pool of its own (or, serial, one slot a
 * job holds from INIT to the end of EVAL), and a stage's time budget: where a job waits, how long
 * it may take, and what each stage cost it.
 */
export class StagePools {
  readonly #pools: Record<StageName, number>;
  readonly #queues: Record<StageName, PQueue>;
  readonly #serial: PQueue | undefined;
  readonly #metrics: StagePoolsOptions['metrics'];
  /** Accepted rollouts not started yet (see admit). */
  #backlog: Array<() => Promise<void>> = [];

  constructor(options: StagePoolsOptions) {
    const pools = (this.#pools = { init: 64, run: 512, eval: 32, ...options.pools });
    this.#metrics = options.metrics;
    this.#serial = options.pipeline === 'serial' ? new PQueue({ concurrency: pools.run }) : undefined;
    // In serial mode the stages run inside the job's one slot: their own queues never wait.
    const unbounded = Number.POSITIVE_INFINITY;
    this.#queues = {
      init: new PQueue({ concurrency: this.#serial ? unbounded : pools.init }),
      run: new PQueue({ concurrency: this.#serial ? unbounded : pools.run }),
      eval: new PQueue({ concurrency: this.#serial ? unbounded : pools.eval }),
    };
  }

  /** Worker slots per stage. */
  get capacity(): Record<StageName, number> {
    return { ...this.#pools };
  }

  /** Rollouts waiting for a slot of each stage and holding one, with the pool's size. */
  status(): StageStatus {
    const stages = Object.fromEntries(
      STAGES.map((name) => [name, { queued: this.#queues[name].size, active: this.#queues[name].pending, pool: this.#queues[name].concurrency }]),
    ) as StageStatus;
    stages.init.queued += this.#backlog.length; // accepted, about to join INIT's queue
    if (this.#serial) {
      stages.init.queued += this.#serial.size;
      for (const stage of STAGES) stages[stage].pool = this.#serial.concurrency;
    }
    return stages;
  }

  /**
   * Queues a rollout (`run`, its stages from INIT to the end, which never rejects) to start soon,
   * off the caller's path: starting one runs the synchronous part of its first stage (a sandbox's
   * creation, for one), so the backlog is started a slice of the event loop at a time and a big
   * batch neither delays its own acceptance nor stalls requests.
   */
  admit(run: () => Promise<void>): void {
    this.#backlog.push(run);
    if (this.#backlog.length === 1) setImmediate(() => this.#startBacklog());
  }

  #startBacklog(): void {
    const until = performance.now() + 10;
    let started = 0;
    while (started < this.#backlog.length && performance.now() < until) this.#start(this.#backlog[started++]!);
    this.#backlog.splice(0, started);
    if (this.#backlog.length > 0) setImmediate(() => this.#startBacklog());
  }

  #start(run: () => Promise<void>): void {
    // Serial mode: one slot from INIT to the end of EVAL. A rollout cancelled while it waits for
    // its slot ends as cancelled as soon as it gets one (its first stage sees the aborted signal).
    if (this.#serial) void this.#serial.add(run);
    else void run();
  }

  /**
   * Runs one stage of a job in that stage's pool, within its time budget: INIT within
   * `init_timeout_s` (start-up is infrastructure work, with a limit of its own), RUN and EVAL
   * within what is left of `time_limit_s`. `excluded` is a clock of time the stage spends on work
   * that is not the policy's (starts at first use before the policy acted): the deadline
   * leaves it out.
   */
  async stage<T>(name: StageName, job: Job, work: (signal: AbortSignal) => Promise<T>, excluded?: () => number): Promise<T> {
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
        const started = performance.now();
        try {
          return await this.#withinBudget(name, job, work, budget, excluded, `${what} reached in ${name}`);
        } finally {
          const elapsed = performance.now() - started;
          job.active = false;
          job.timing[name].active_ms = elapsed;
          this.#metrics?.stageLatency.observe({ stage: name }, elapsed / 1000);
        }
      },
      { signal: job.abort.signal },
    ) as Promise<T>;
  }

  /**
   * A stage's work, ended by the job's abort or by the stage's deadline (`budget` of charged time,
   * the stage's time less what `excluded` counts); RUN's and EVAL's charged time goes to `usedMs`.
   */
  async #withinBudget<T>(
    name: StageName,
    job: Job,
    work: (signal: AbortSignal) => Promise<T>,
    budget: number,
    excluded: (() => number) | undefined,
    timeoutMessage: string,
  ): Promise<T> {
    // The stage's time limit aborts the job's own signal (a timed-out rollout ends there), so a
    // stage costs one timer, not a timeout signal and a composite one (AbortSignal.timeout's
    // timers live until the signal is collected).
    const signal = job.abort.signal;
    const timeout = () => new RolloutError({ code: 'TIMEOUT', message: timeoutMessage });
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
      if (name !== 'init') job.usedMs += charged();
    }
  }
}
