import type { Logger } from 'pino';
import type { RolloutError } from '../errors.ts';
import type { NodeCommitStatus } from '../protocol/nodes.ts';
import type { RolloutResult, RolloutTask } from '../protocol/rollout.ts';
import { assignGroupCredit } from '../runner/rewards/group.ts';
import { resolveCredit } from '../runner/rewards/settings.ts';
import type { CommitInput, RolloutStore } from '../store/types.ts';

/** What commits stand on: the store, and who hears of a result once it is stored. */
export interface CommitsOptions {
  store: RolloutStore;
  logger: Logger;
  /** Whether the service is shutting down (a failed commit is then tried only a few times). */
  closed: () => boolean;
  /** A result was stored: its waiters, listeners and lease bookkeeping hear of it. */
  finished: (result: RolloutResult) => void;
  /** Whether a cancel was asked for a rollout while a node held it (see withinAttempts). */
  cancelRequested: (rolloutId: string) => boolean;
  /** @default 5 (see RolloutServiceOptions.maxAttempts) */
  maxAttempts?: number;
  /** The newest weight version the trainer announced (what staleness is measured against); null before any. */
  newestWeights?: () => number | null;
}

/**
 * How results reach the store: a result commits only for its lease's current attempt; commits of
 * one task run one at a time, so the last sample of a group to finish sees all the others and
 * gets the group's credit computed; single samples are batched; a commit of the service's own
 * result is retried while the store cannot take it.
 */
export class Commits {
  readonly #store: RolloutStore;
  readonly #logger: Logger;
  readonly #closed: () => boolean;
  readonly #finished: (result: RolloutResult) => void;
  readonly #cancelRequested: (rolloutId: string) => boolean;
  readonly #maxAttempts: number;
  readonly #newestWeights: () => number | null;
  /** Commits of one task run one at a time (the last sample of a group sees all the others). */
  readonly #taskLocks = new Map<string, Promise<unknown>>();
  /** Commits of the service's own results under way (a shutdown lets them finish). */
  readonly #committing = new Set<Promise<unknown>>();
  /** Commits waiting for the next batch (see #commitBatched). */
  #commitBatch: Array<{ input: CommitInput; resolve: (status: NodeCommitStatus) => void; reject: (error: unknown) => void }> = [];
  /** Results of groups (n > 1) not whole yet, by task (see commit). */
  readonly #openGroups = new Map<string, Map<string, RolloutResult>>();

  constructor(options: CommitsOptions) {
    this.#store = options.store;
    this.#logger = options.logger;
    this.#closed = options.closed;
    this.#finished = options.finished;
    this.#cancelRequested = options.cancelRequested;
    this.#maxAttempts = options.maxAttempts ?? 5;
    this.#newestWeights = options.newestWeights ?? (() => null);
  }

  /** Commits a result the service's own pools produced; a shutdown waits for it (see settleOwn). */
  async commitOwn(workerId: string, attempt: number, result: RolloutResult, groupSize?: number): Promise<void> {
    const committing = this.#commitWithRetry(workerId, attempt, result, groupSize);
    this.#committing.add(committing);
    await committing.finally(() => this.#committing.delete(committing));
  }

  /** Once the commits of the service's own results under way have settled. */
  async settleOwn(): Promise<void> {
    await Promise.allSettled([...this.#committing]);
  }

  /** Once every task's commits under way are done. */
  async settleLocks(): Promise<void> {
    await Promise.all([...this.#taskLocks.values()]);
  }

  /** A commit the store could not take (the database restarting) is tried again until the service closes. */
  async #commitWithRetry(workerId: string, attempt: number, result: RolloutResult, groupSize?: number): Promise<NodeCommitStatus> {
    for (let delay = 100, tries = 0; ; delay = Math.min(delay * 2, 5_000), tries++) {
      try {
        return await this.commit(workerId, attempt, result, groupSize);
      } catch (error) {
        // while shutting down: a few tries (the store may be restarting), then the lease lapses and it runs again
        if (this.#closed() && tries >= 3) throw error;
        this.#logger.warn({ err: error, rollout: result.id }, 'storing a result failed; trying again');
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }

  /**
   * Stores a result if `attempt` is the rollout's current one. The last sample of a group to
   * finish gets the group's credit computed and the others' results amended, in the same
   * transaction. Then its waiters and listeners hear of it.
   */
  async commit(workerId: string, attempt: number, given: RolloutResult, groupSize?: number, unheld = false): Promise<NodeCommitStatus> {
    return this.#commitJudged(workerId, attempt, await this.#judgedStale(given), groupSize, unheld);
  }

  /**
   * A result judged by its task's staleness bound (see StalenessBound) against the newest weight
   * version now: stale, it is flagged (`stale`), and with the bound's `filter`, filtered too.
   * Only a result behind the newest version at all has its task read.
   */
  async #judgedStale(result: RolloutResult): Promise<RolloutResult> {
    const newest = this.#newestWeights();
    const oldest = result.weight_version_min;
    if (newest === null || oldest === null || oldest === undefined || newest - oldest <= 0 || result.stale) return result;
    const bound = (await this.#store.getTask(result.task_id))?.task.staleness;
    if (!bound || newest - oldest <= bound.max_versions) return result;
    return { ...result, stale: true, filter: bound.action === 'filter' ? true : result.filter };
  }

  #commitJudged(workerId: string, attempt: number, result: RolloutResult, groupSize?: number, unheld = false): Promise<NodeCommitStatus> {
    const commit = async (): Promise<NodeCommitStatus> => {
      let amend: RolloutResult[] = [];
      let whole = true;
      // a single sample (the common case) needs no look at its task
      const stored = groupSize === 1 ? undefined : await this.#store.getTask(result.task_id);
      const held = this.#openGroups.get(result.task_id);
      if (stored && stored.rolloutIds.length > 1) {
        const others = await Promise.all(stored.rolloutIds.filter((id) => id !== result.id).map((id) => held?.get(id) ?? this.#store.getResult(id)));
        whole = others.every((other) => other !== undefined);
        if (whole) {
          const group = [...(others as RolloutResult[]), result].sort((a, b) => a.sample_index - b.sample_index);
          await assignGroupCredit(group, resolveCredit(stored.task));
          amend = others as RolloutResult[];
        }
      }
      const outcome = await this.#store.commit({ rolloutId: result.id, attempt, result, workerId, unheld, amend });
      if (outcome.status === 'committed') {
        // The results of a group not yet whole stay here until it is: its credit, computed when the
        // last sample finishes, then reaches the very results their waiters were given.
        if (whole) this.#openGroups.delete(result.task_id);
        else this.#openGroups.set(result.task_id, (held ?? new Map()).set(result.id, result));
        this.#finished(result);
      } else if (outcome.status === 'stale') this.#logger.info({ rollout: result.id, attempt, worker: workerId, current: outcome.currentAttempt }, 'late result of a lost lease ignored');
      return outcome.status;
    };
    // a single sample has no group to see whole: it joins the next batch of commits
    if (groupSize === 1) return this.#commitBatched({ rolloutId: result.id, attempt, result, workerId, unheld });
    const run = (this.#taskLocks.get(result.task_id) ?? Promise.resolve()).then(commit);
    const settled = run.catch(() => undefined);
    this.#taskLocks.set(result.task_id, settled);
    void settled.then(() => {
      if (this.#taskLocks.get(result.task_id) === settled) this.#taskLocks.delete(result.task_id);
    });
    return run;
  }

  /**
   * Commits that arrive in the same turn of the event loop go to the store together: with SQLite,
   * a transaction per result cost more than everything else a rollout does.
   */
  #commitBatched(input: CommitInput): Promise<NodeCommitStatus> {
    return new Promise((resolve, reject) => {
      this.#commitBatch.push({ input, resolve, reject });
      if (this.#commitBatch.length === 1) setImmediate(() => void this.#flushCommits());
    });
  }

  async #flushCommits(): Promise<void> {
    const batch = this.#commitBatch;
    this.#commitBatch = [];
    try {
      const outcomes = await this.#store.commitMany(batch.map((item) => item.input));
      batch.forEach(({ input, resolve }, index) => {
        const outcome = outcomes[index]!;
        if (outcome.status === 'committed') this.#finished(input.result);
        else if (outcome.status === 'stale') this.#logger.info({ rollout: input.rolloutId, attempt: input.attempt, worker: input.workerId, current: outcome.currentAttempt }, 'late result of a lost lease ignored');
        resolve(outcome.status);
      });
    } catch (error) {
      for (const { reject } of batch) reject(error);
    }
  }

  /** The result of a rollout that ends without running (cancelled while queued, or out of attempts). */
  async endedResult(rollout: { id: string; taskId: string; sampleIndex: number }, how: { state: 'cancelled' | 'failed'; code: RolloutError['code']; message: string }): Promise<RolloutResult> {
    const task = await this.#store.getTask(rollout.taskId);
    // (the keys in the schema's order, the order the API sends them in)
    return {
      id: rollout.id,
      task_id: rollout.taskId,
      sample_index: rollout.sampleIndex,
      env: task?.task.env ?? '',
      state: how.state,
      reward: 0,
      reward_components: null,
      verify_extras: {},
      critical_error: how.state === 'cancelled' ? 'cancelled' : 'init',
      filter: true,
      error: { code: how.code, message: how.message },
      advantage: null,
      credit: null,
      timing: { init: { queued_ms: 0, active_ms: 0 }, run: { queued_ms: 0, active_ms: 0 }, eval: { queued_ms: 0, active_ms: 0 }, total_ms: 0 },
      response: null,
      messages: [],
      turns: [],
      weight_version_min: null,
      weight_version_max: null,
      stale: false,
      ...(task?.task.metadata ? { metadata: task.task.metadata } : {}),
      finished_at: new Date().toISOString(),
    };
  }

  /**
   * Work handed out again and again (its node died or lost its lease each time: a rollout that
   * brings its node down, say) ends failed after `maxAttempts` instead of going round for ever;
   * work cancelled while a lost node held it ends cancelled. Returns the claims to run.
   */
  async withinAttempts<T extends { id: string; taskId: string; sampleIndex: number; attempt: number; task: RolloutTask }>(workerId: string, claimed: T[]): Promise<T[]> {
    const max = this.#maxAttempts;
    const runnable: T[] = [];
    for (const work of claimed) {
      if (this.#cancelRequested(work.id)) {
        // cancelled while its node held it, then the node was lost: it ends here, cancelled
        await this.commit(workerId, work.attempt, await this.endedResult(work, { state: 'cancelled', code: 'CANCELLED', message: 'rollout cancelled' }), work.task.n);
        continue;
      }
      if (work.attempt <= max) {
        runnable.push(work);
        continue;
      }
      const result = await this.endedResult(work, { state: 'failed', code: 'UNAVAILABLE', message: `rollout lost its worker ${work.attempt - 1} times (a node died, or its lease ran out, each time); not tried again after ${max} attempts` });
      this.#logger.warn({ rollout: work.id, attempts: work.attempt - 1 }, 'rollout out of attempts: failed');
      await this.commit(workerId, work.attempt, result, work.task.n);
    }
    return runnable;
  }
}
