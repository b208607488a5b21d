import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { RolloutResult, RolloutTask } from '../protocol/rollout.ts';
import type { DynamicSampling, SampledGroupOutcome, SamplingSettings, SamplingState, SamplingStatus } from '../protocol/sampling.ts';
import type { RolloutStore, SamplingChange, StoredSampling } from '../store/types.ts';
import type { SubmittedTask } from './scheduler.ts';

export interface DynamicSamplerOptions {
  logger: Logger;
  /** Where each sampling's request and progress are kept, so that a restarted service goes on with it. */
  store: Pick<RolloutStore, 'putSampling' | 'getSampling' | 'runningSamplings' | 'updateSampling' | 'deleteSampling' | 'unfinishedCancelledSamples' | 'pruneSamplings'>;
  /** Stores a task and starts it (the scheduler's submit); a known task id answers `existing` and starts nothing. */
  submit: (tasks: readonly RolloutTask[]) => Promise<SubmittedTask[]>;
  /** The stored results of those of `ids` that have finished. */
  results: (ids: readonly string[]) => Promise<Map<string, RolloutResult>>;
  onResult: (listener: (result: RolloutResult) => void) => () => void;
  cancel: (id: string) => Promise<unknown>;
}

/** A group a sampling started, and its task. */
export type Started = SubmittedTask & { task: RolloutTask };

/** Ended samplings kept (in memory, and in the store across restarts): the last 1,000 to end. */
export const KEEP_ENDED_SAMPLINGS = 1_000;

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
  readonly settings: SamplingSettings;
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
  state: SamplingState = 'running';
  error: string | null = null;
  /** 'change' on every outcome and at the end. */
  readonly events = new EventEmitter();

  constructor(id: string, pool: readonly RolloutTask[], settings: SamplingSettings, poolSize = pool.length) {
    this.id = id;
    this.#pool = pool;
    this.#poolSize = poolSize;
    this.settings = settings;
    this.events.setMaxListeners(0);
  }

  /** A request's settings over a pool of `poolSize` tasks (the cap is at most the pool). */
  static settingsOf(options: DynamicSampling, poolSize: number): SamplingSettings {
    return { groups: options.groups, maxGroups: Math.min(options.max_groups ?? poolSize, poolSize), maxInFlight: options.max_in_flight ?? options.groups, metric: options.metric };
  }

  /** A sampling as the store kept it: its running groups are open again, their members to be found. */
  static restore(stored: StoredSampling): Sampling {
    const sampling = new Sampling(stored.id, stored.pool, stored.settings, stored.poolSize);
    sampling.#next = stored.next;
    for (const group of stored.groups) {
      sampling.outcomes.set(group.taskId, group.outcome);
      if (group.outcome === 'running') sampling.open.set(group.taskId, new Set());
    }
    const kept = stored.groups.filter((group) => group.kept !== null).sort((a, b) => a.kept! - b.kept!);
    sampling.kept.push(...kept.map((group) => group.taskId));
    sampling.state = stored.state;
    sampling.error = stored.error;
    return sampling;
  }

  get finished(): boolean {
    return this.state !== 'running';
  }

  /** Tasks of the pool started so far. */
  get next(): number {
    return this.#next;
  }

  /** The pool's task of a started group (while the sampling runs). */
  taskOf(taskId: string): RolloutTask | undefined {
    return this.#pool.find((task) => task.id === taskId);
  }

  /** The next task to start and its place in the pool, if one may start now (see DynamicSampling.max_in_flight). */
  nextTask(): { task: RolloutTask; position: number } | undefined {
    if (this.finished || this.#next >= this.settings.maxGroups) return undefined;
    const { groups, maxInFlight } = this.settings;
    const needed = groups - this.kept.length + Math.max(0, maxInFlight - groups);
    if (this.open.size >= Math.min(maxInFlight, needed)) return undefined;
    const position = this.#next++;
    return { task: this.#pool[position]!, position };
  }

  /** The sampling has ended: nothing more starts. */
  end(state: Exclude<SamplingState, 'running'>): void {
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
 * `max_groups` were tried.
 *
 * A sampling is kept in the store from before its 202: its request (the whole pool), each group
 * before its task is stored, each outcome once judged, its end before the cancels it makes. A
 * restarted service (`recover`) goes on with the samplings still running where the store says
 * they were: their groups' tasks submitted again (task ids are the dedup key: a stored task starts
 * nothing more), the groups that finished meanwhile judged from their stored results, the pool's
 * next tasks started until the target or the cap. An outcome the store missed (a crash between a
 * group's last result and its judgment) is judged again from the same results.
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
      if (owner) void this.#enqueue(() => this.#finished(owner.sampling, owner.taskId, [result.id])).catch(() => undefined);
    });
  }

  /** A sampling by id: a running one, or one that ended (kept for the last KEEP_ENDED_SAMPLINGS to end). */
  async get(id: string): Promise<Sampling | undefined> {
    return this.#samplings.get(id) ?? (await this.#load(id));
  }

  /**
   * Starts a sampling over `pool` (tasks already checked, ids given): answers once it and its
   * first groups are stored, with them. A known sampling id answers that sampling and starts nothing.
   */
  start(pool: readonly RolloutTask[], options: DynamicSampling): Promise<{ sampling: Sampling; submitted: Started[]; existing: boolean }> {
    const id = options.id ?? randomUUID();
    return this.#enqueue(async () => {
      const known = this.#samplings.get(id) ?? (await this.#load(id));
      if (known) return { sampling: known, submitted: [], existing: true };
      const sampling = new Sampling(id, pool, Sampling.settingsOf(options, pool.length));
      if (!(await this.#options.store.putSampling({ id, settings: sampling.settings, pool }))) {
        // stored meanwhile by another service on the same store
        return { sampling: (await this.#load(id)) ?? sampling, submitted: [], existing: true };
      }
      this.#samplings.set(id, sampling);
      this.#forgetOld();
      const submitted: Started[] = [];
      try {
        await this.#fill(sampling, submitted, true);
      } catch (error) {
        // nothing of it was started: the submit fails whole (a 503 while closing), and the same id may come again
        this.#samplings.delete(id);
        await this.#options.store.deleteSampling(id).catch((err: unknown) => this.#options.logger.warn({ err, sampling: id }, 'forgetting a sampling that could not start failed'));
        throw error;
      }
      return { sampling, submitted, existing: false };
    });
  }

  /** Stops a sampling: nothing more starts, its running groups are cancelled. */
  async stop(id: string): Promise<Sampling | undefined> {
    const sampling = this.#samplings.get(id);
    // one not in memory has ended (or is another service's): nothing to stop here
    if (!sampling) return this.#load(id);
    return this.#enqueue(async () => {
      if (!sampling.finished) await this.#end(sampling, 'stopped');
      return sampling;
    });
  }

  /**
   * Goes on with the samplings the store says are running (at the service's start): the cancels
   * an ended sampling did not get to make are made, then each running one resumes (see the class).
   */
  async recover(): Promise<void> {
    const { store, logger } = this.#options;
    for (const id of await store.unfinishedCancelledSamples()) {
      await this.#options.cancel(id).catch((err: unknown) => logger.warn({ err, rollout: id }, 'cancelling a surplus sample failed'));
    }
    await this.#prune();
    for (const stored of await store.runningSamplings()) {
      const sampling = Sampling.restore(stored);
      this.#samplings.set(sampling.id, sampling);
      await this.#enqueue(() => this.#resume(sampling)).catch(() => undefined);
      logger.info({ sampling: sampling.id, state: sampling.state, tried: sampling.outcomes.size, kept: sampling.kept.length }, 'dynamic sampling resumed');
    }
  }

  /**
   * Starts nothing more (the service is closing); running samplings show `stopped` to their
   * streams, while the store keeps them running for the next start. Resolves once no step runs.
   */
  async close(): Promise<void> {
    this.#closed = true;
    this.#unsubscribe();
    for (const sampling of this.#samplings.values()) {
      if (sampling.finished) continue;
      sampling.end('stopped');
      sampling.error ??= 'the service stopped: the sampling goes on where it was when the service starts again on its store';
      sampling.events.emit('change');
    }
    await this.#chain;
  }

  #enqueue<T>(step: () => Promise<T>): Promise<T> {
    const run = this.#chain.then(step);
    this.#chain = run.then(
      () => undefined,
      (error: unknown) => this.#options.logger.error({ err: error }, 'dynamic sampling step failed'),
    );
    return run;
  }

  /** An ended sampling from the store, remembered in memory from then on. */
  async #load(id: string): Promise<Sampling | undefined> {
    const stored = await this.#options.store.getSampling(id);
    if (!stored) return undefined;
    const sampling = Sampling.restore(stored);
    if (sampling.finished && !this.#samplings.has(id)) {
      this.#samplings.set(id, sampling);
      this.#forgetOld();
    }
    return this.#samplings.get(id) ?? sampling;
  }

  /** Writes progress; a failure is logged, not thrown: what the store missed is judged again at the next start. */
  async #persist(sampling: Sampling, change: SamplingChange): Promise<void> {
    try {
      await this.#options.store.updateSampling(sampling.id, change);
    } catch (error) {
      this.#options.logger.warn({ err: error, sampling: sampling.id }, 'storing a dynamic sampling\'s progress failed: a restart judges those groups again');
    }
  }

  /** A restored sampling goes on: its running groups found (or stored, if the stop came first), judged once whole, then the pool. */
  async #resume(sampling: Sampling): Promise<void> {
    const running = [...sampling.open.keys()];
    if (running.length > 0) {
      const tasks = running.map((taskId) => sampling.taskOf(taskId));
      let started: SubmittedTask[];
      try {
        if (tasks.some((task) => task === undefined)) throw new Error('its pool lacks a task it started');
        started = await this.#options.submit(tasks as RolloutTask[]);
      } catch (error) {
        if (this.#closed) return;
        sampling.error = `the groups it had started could not be resumed: ${(error as Error).message}`;
        await this.#end(sampling, 'stopped');
        return;
      }
      await this.#track(sampling, started);
    }
    if (sampling.finished) return;
    // the target was reached but the end not stored
    if (sampling.kept.length >= sampling.settings.groups) await this.#end(sampling, 'done');
    else await this.#fill(sampling);
  }

  /**
   * Starts groups while the sampling may, those that may start together in one submit (one
   * store transaction); `submitted` collects them. Each batch is written to the sampling's record
   * before its tasks are stored. `first`: a failure before anything was started is thrown (the
   * sampling's submit fails), not recorded.
   */
  async #fill(sampling: Sampling, submitted: Started[] = [], first = false): Promise<void> {
    while (!this.#closed) {
      const batch: Array<{ task: RolloutTask; position: number }> = [];
      for (let next = sampling.nextTask(); next; next = sampling.nextTask()) {
        batch.push(next);
        sampling.outcomes.set(next.task.id!, 'running');
        sampling.open.set(next.task.id!, new Set());
      }
      if (batch.length === 0) break;
      const tasks = batch.map(({ task }) => task);
      let started: SubmittedTask[];
      try {
        // a restart after the tasks were stored knows they were started (and stores them if they were not)
        await this.#options.store.updateSampling(sampling.id, { started: batch.map(({ task, position }) => ({ taskId: task.id!, position })), next: sampling.next });
        started = await this.#options.submit(tasks);
      } catch (error) {
        for (const task of tasks) {
          sampling.outcomes.delete(task.id!);
          sampling.open.delete(task.id!);
        }
        if (first && submitted.length === 0) throw error;
        // closing: the store still says they start, and the next start of the service starts them
        if (this.#closed) return;
        sampling.error = `tasks ${tasks.map((task) => `"${task.id}"`).join(', ')} could not be started: ${(error as Error).message}`;
        await this.#end(sampling, 'stopped', tasks.map((task) => task.id!));
        return;
      }
      started.forEach((group, i) => submitted.push({ ...group, task: tasks[i]! }));
      await this.#track(sampling, started);
    }
    if (!sampling.finished && sampling.spent) await this.#end(sampling, sampling.kept.length >= sampling.settings.groups ? 'done' : 'exhausted');
  }

  /** Follows the results of started groups; what finished before they were followed (a known task, a fast sample) is read back. */
  async #track(sampling: Sampling, started: readonly SubmittedTask[]): Promise<void> {
    for (const group of started) {
      sampling.open.set(group.taskId, new Set(group.rolloutIds));
      sampling.members.set(group.taskId, group.rolloutIds);
      for (const id of group.rolloutIds) this.#byRollout.set(id, { sampling, taskId: group.taskId });
    }
    const done = await this.#options.results(started.flatMap((group) => group.rolloutIds));
    for (const group of started) {
      const finished = group.rolloutIds.filter((id) => done.has(id));
      if (finished.length > 0) await this.#finished(sampling, group.taskId, finished, false);
    }
  }

  /** Samples of a running group finished; once all have, the group is judged. */
  async #finished(sampling: Sampling, taskId: string, ids: readonly string[], fill = true): Promise<void> {
    const open = sampling.open.get(taskId);
    if (!open || sampling.finished) return;
    for (const id of ids) open.delete(id);
    if (open.size > 0) return;
    const members = sampling.members.get(taskId)!;
    // read back from the store: the group's credit was added when its last sample was stored
    const stored = await this.#options.results(members);
    // (a result pruned by retention in between counts as filtered: nothing to compare)
    const results = members.map((id) => stored.get(id));
    const outcome = results.every((r) => r !== undefined) ? groupOutcome(results as RolloutResult[], sampling.settings.metric) : 'filtered';
    await this.#persist(sampling, { outcomes: [{ taskId, outcome, ...(outcome === 'kept' ? { kept: sampling.kept.length } : {}) }] });
    if (sampling.finished) return;
    this.#release(sampling, taskId);
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

  /**
   * Ends a sampling; its running groups are cancelled (their samples stay readable by id). The end
   * is stored first: a restart before the cancels are made finds them (unfinishedCancelledSamples).
   * `unstarted`: groups whose start failed, forgotten.
   */
  async #end(sampling: Sampling, state: Exclude<SamplingState, 'running'>, unstarted: readonly string[] = []): Promise<void> {
    // closing: the store keeps it running for the next start
    if (this.#closed) return;
    const running = [...sampling.open.keys()];
    await this.#persist(sampling, { outcomes: running.map((taskId) => ({ taskId, outcome: 'cancelled' as const })), unstarted, end: { state, error: sampling.error } });
    sampling.end(state);
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
    await this.#prune();
  }

  async #prune(): Promise<void> {
    try {
      await this.#options.store.pruneSamplings(KEEP_ENDED_SAMPLINGS);
    } catch (error) {
      this.#options.logger.warn({ err: error }, 'forgetting old dynamic samplings failed');
    }
  }

  #forgetOld(): void {
    if (this.#samplings.size <= KEEP_ENDED_SAMPLINGS) return;
    for (const [id, sampling] of this.#samplings) {
      if (this.#samplings.size <= KEEP_ENDED_SAMPLINGS) break;
      if (sampling.finished) this.#samplings.delete(id);
    }
  }
}
