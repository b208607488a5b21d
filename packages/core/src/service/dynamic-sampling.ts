import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { RolloutResult, RolloutTask } from '../protocol/rollout.ts';
import type { DynamicSampling, SampledGroupOutcome, SamplingStatus } from '../protocol/sampling.ts';
import type { SubmittedTask } from './scheduler.ts';

export interface DynamicSamplerOptions {
  logger: Logger;
  /** Stores a task and starts it (the scheduler's submit). */
  submit: (tasks: readonly RolloutTask[]) => Promise<SubmittedTask[]>;
  /** The stored results of those of `ids` that have finished. */
  results: (ids: readonly string[]) => Promise<Map<string, RolloutResult>>;
  onResult: (listener: (result: RolloutResult) => void) => () => void;
  cancel: (id: string) => Promise<unknown>;
}

/** A group a sampling started, and its task. */
export type Started = SubmittedTask & { task: RolloutTask };

/** Finished samplings remembered (their status and stream), the oldest forgotten first. */
const KEEP_FINISHED = 1_000;

/** Whether a group is worth training on (DAPO's dynamic sampling; see protocol/sampling.ts). */
export function groupOutcome(results: readonly RolloutResult[], metric: DynamicSampling['metric']): Exclude<SampledGroupOutcome, 'running' | 'cancelled'> {
  const compared = results.filter((result) => !result.filter);
  // verl keeps a group of one (its std is not a spread); one sample left of a larger group is not informative
  if (results.length === 1) return compared.length === 1 ? 'kept' : 'filtered';
  if (compared.length < 2) return 'filtered';
  const values = compared.map((result) => (metric === 'return' ? (result.turns[0]?.return ?? result.reward) : result.reward));
  return values.every((value) => value === values[0]) ? 'all_equal' : 'kept';
}

/** One dynamic sampling: its pool, the groups it started and what became of them. */
export class Sampling {
  readonly id: string;
  readonly settings: { groups: number; maxGroups: number; maxInFlight: number; metric: DynamicSampling['metric'] };
  /** The pool, let go of once the sampling ends (finished samplings are remembered for their status). */
  #pool: readonly RolloutTask[];
  readonly #poolSize: number;
  /** Next task of the pool to start. */
  #next = 0;
  /** Every group started, in order, and its outcome so far. */
  readonly outcomes = new Map<string, SampledGroupOutcome>();
  /** Running groups: their unfinished members. */
  readonly open = new Map<string, Set<string>>();
  /** Running groups' members, by rollout id. */
  readonly members = new Map<string, string[]>();
  readonly kept: string[] = [];
  state: SamplingStatus['state'] = 'running';
  error: string | null = null;
  /** 'change' on every outcome and at the end. */
  readonly events = new EventEmitter();

  constructor(id: string, pool: readonly RolloutTask[], options: DynamicSampling) {
    this.id = id;
    this.#pool = pool;
    this.#poolSize = pool.length;
    const maxInFlight = options.max_in_flight ?? options.groups;
    this.settings = { groups: options.groups, maxGroups: Math.min(options.max_groups ?? pool.length, pool.length), maxInFlight, metric: options.metric };
    this.events.setMaxListeners(0);
  }

  get finished(): boolean {
    return this.state !== 'running';
  }

  /** The next task to start, if one may start now (see DynamicSampling.max_in_flight). */
  nextTask(): RolloutTask | undefined {
    if (this.finished || this.#next >= this.settings.maxGroups) return undefined;
    const { groups, maxInFlight } = this.settings;
    const needed = groups - this.kept.length + Math.max(0, maxInFlight - groups);
    if (this.open.size >= Math.min(maxInFlight, needed)) return undefined;
    return this.#pool[this.#next++];
  }

  /** The sampling has ended: nothing more starts. */
  end(state: Exclude<SamplingStatus['state'], 'running'>): void {
    this.state = state;
    this.#pool = [];
  }

  /** No group runs and none may start: the sampling ends with what it kept. */
  get spent(): boolean {
    return this.open.size === 0 && this.#next >= this.settings.maxGroups;
  }

  status(): SamplingStatus {
    const count = (outcome: SampledGroupOutcome) => [...this.outcomes.values()].filter((o) => o === outcome).length;
    return {
      id: this.id,
      state: this.state,
      groups: this.settings.groups,
      max_groups: this.settings.maxGroups,
      max_in_flight: this.settings.maxInFlight,
      metric: this.settings.metric,
      pool: this.#poolSize,
      tried: this.outcomes.size,
      kept: this.kept.length,
      dropped_all_equal: count('all_equal'),
      filtered: count('filtered'),
      cancelled: count('cancelled'),
      running: count('running'),
      kept_task_ids: [...this.kept],
      tasks: [...this.outcomes].map(([task_id, outcome]) => ({ task_id, outcome })),
      error: this.error,
    };
  }
}

/**
 * Dynamic samplings (DAPO): each starts tasks of its pool in order, judges each group once all
 * its samples have finished, and stops once `groups` were kept (cancelling the groups still
 * running: their samples end cancelled, readable by id like every sample tried) or once
 * `max_groups` were tried. Samplings live in the service's memory: after a restart the groups
 * they started still run and are readable by id, the sampling itself is gone.
 */
export class DynamicSampler {
  readonly #options: DynamicSamplerOptions;
  readonly #samplings = new Map<string, Sampling>();
  /** Running groups by rollout id: their sampling and task. */
  readonly #byRollout = new Map<string, { sampling: Sampling; taskId: string }>();
  /** Every decision of every sampling, one at a time: a group is judged once, in result order. */
  #chain: Promise<void> = Promise.resolve();
  readonly #unsubscribe: () => void;
  #closed = false;

  constructor(options: DynamicSamplerOptions) {
    this.#options = options;
    this.#unsubscribe = options.onResult((result) => {
      const owner = this.#byRollout.get(result.id);
      if (owner) this.#enqueue(() => this.#finished(owner.sampling, owner.taskId, [result.id]));
    });
  }

  get(id: string): Sampling | undefined {
    return this.#samplings.get(id);
  }

  /**
   * Starts a sampling over `pool` (tasks already checked, ids given): answers once its first
   * groups are stored, with them. A known sampling id answers that sampling and starts nothing.
   */
  async start(pool: readonly RolloutTask[], options: DynamicSampling): Promise<{ sampling: Sampling; submitted: Started[]; existing: boolean }> {
    const id = options.id ?? randomUUID();
    const known = this.#samplings.get(id);
    if (known) return { sampling: known, submitted: [], existing: true };
    const sampling = new Sampling(id, pool, options);
    this.#samplings.set(id, sampling);
    this.#forgetOld();
    const submitted: Started[] = [];
    try {
      await this.#enqueue(() => this.#fill(sampling, submitted, true));
    } catch (error) {
      // nothing of it was stored: the submit fails whole (a 503 while closing), and the same id may come again
      this.#samplings.delete(id);
      throw error;
    }
    return { sampling, submitted, existing: false };
  }

  /** Stops a sampling: nothing more starts, its running groups are cancelled. */
  stop(id: string): Promise<Sampling | undefined> {
    const sampling = this.#samplings.get(id);
    if (!sampling) return Promise.resolve(undefined);
    return this.#enqueue(async () => {
      if (!sampling.finished) await this.#end(sampling, 'stopped');
      return sampling;
    });
  }

  /** Starts nothing more (the service is closing); running samplings end `stopped`, their groups left to run. */
  close(): void {
    this.#closed = true;
    this.#unsubscribe();
    for (const sampling of this.#samplings.values()) {
      if (sampling.finished) continue;
      sampling.end('stopped');
      sampling.error ??= 'the service stopped';
      sampling.events.emit('change');
    }
  }

  #enqueue<T>(step: () => Promise<T>): Promise<T> {
    const run = this.#chain.then(step);
    this.#chain = run.then(
      () => undefined,
      (error: unknown) => this.#options.logger.error({ err: error }, 'dynamic sampling step failed'),
    );
    return run;
  }

  /**
   * Starts groups while the sampling may, those that may start together in one submit (one
   * store transaction); `submitted` collects them. `first`: a failure before anything was
   * stored is thrown (the sampling's submit fails), not recorded.
   */
  async #fill(sampling: Sampling, submitted: Started[] = [], first = false): Promise<void> {
    while (!this.#closed) {
      const batch: RolloutTask[] = [];
      for (let task = sampling.nextTask(); task; task = sampling.nextTask()) {
        batch.push(task);
        sampling.outcomes.set(task.id!, 'running');
        sampling.open.set(task.id!, new Set());
      }
      if (batch.length === 0) break;
      let started: SubmittedTask[];
      try {
        started = await this.#options.submit(batch);
      } catch (error) {
        for (const task of batch) {
          sampling.outcomes.delete(task.id!);
          sampling.open.delete(task.id!);
        }
        if (first && submitted.length === 0) throw error;
        sampling.error = `tasks ${batch.map((task) => `"${task.id}"`).join(', ')} could not be started: ${(error as Error).message}`;
        await this.#end(sampling, 'stopped');
        return;
      }
      started.forEach((group, i) => {
        submitted.push({ ...group, task: batch[i]! });
        sampling.open.set(group.taskId, new Set(group.rolloutIds));
        sampling.members.set(group.taskId, group.rolloutIds);
        for (const id of group.rolloutIds) this.#byRollout.set(id, { sampling, taskId: group.taskId });
      });
      // what finished before it was registered (a known task, a fast sample) is read back
      const done = await this.#options.results(started.flatMap((group) => group.rolloutIds));
      for (const group of started) {
        const finished = group.rolloutIds.filter((id) => done.has(id));
        if (finished.length > 0) await this.#finished(sampling, group.taskId, finished, false);
      }
    }
    if (!sampling.finished && sampling.spent) await this.#end(sampling, sampling.kept.length >= sampling.settings.groups ? 'done' : 'exhausted');
  }

  /** Samples of a running group finished; once all have, the group is judged. */
  async #finished(sampling: Sampling, taskId: string, ids: readonly string[], fill = true): Promise<void> {
    const open = sampling.open.get(taskId);
    if (!open || sampling.finished) return;
    for (const id of ids) open.delete(id);
    if (open.size > 0) return;
    const members = sampling.members.get(taskId)!;
    this.#release(sampling, taskId);
    // read back from the store: the group's credit was added when its last sample was stored
    const stored = await this.#options.results(members);
    // (a result pruned by retention in between counts as filtered: nothing to compare)
    const results = members.map((id) => stored.get(id));
    const outcome = results.every((r) => r !== undefined) ? groupOutcome(results as RolloutResult[], sampling.settings.metric) : 'filtered';
    sampling.outcomes.set(taskId, outcome);
    if (outcome === 'kept') sampling.kept.push(taskId);
    sampling.events.emit('change');
    if (sampling.kept.length >= sampling.settings.groups) await this.#end(sampling, 'done');
    else if (fill) await this.#fill(sampling);
  }

  #release(sampling: Sampling, taskId: string): void {
    for (const id of sampling.members.get(taskId) ?? []) this.#byRollout.delete(id);
    sampling.open.delete(taskId);
    sampling.members.delete(taskId);
  }

  /** Ends a sampling; its running groups are cancelled (their samples stay readable by id). */
  async #end(sampling: Sampling, state: Exclude<SamplingStatus['state'], 'running'>): Promise<void> {
    sampling.end(state);
    const running = [...sampling.open.keys()];
    const members = running.flatMap((taskId) => sampling.members.get(taskId) ?? []);
    for (const taskId of running) {
      this.#release(sampling, taskId);
      sampling.outcomes.set(taskId, 'cancelled');
    }
    sampling.events.emit('change');
    await Promise.all(
      members.map((id) =>
        this.#options.cancel(id).catch((error: unknown) => this.#options.logger.warn({ err: error, rollout: id, sampling: sampling.id }, 'cancelling a surplus sample failed')),
      ),
    );
  }

  #forgetOld(): void {
    if (this.#samplings.size <= KEEP_FINISHED) return;
    for (const [id, sampling] of this.#samplings) {
      if (this.#samplings.size <= KEEP_FINISHED) break;
      if (sampling.finished) this.#samplings.delete(id);
    }
  }
}
