import { EventEmitter } from 'node:events';
import { RolloutError } from '../errors.ts';
import type { RolloutResult, RolloutState, RolloutView } from '../protocol/rollout.ts';
import { hasDrift } from '../protocol/training-view.ts';
import type { RolloutRunner } from '../runner/runner.ts';
import type { RolloutStore, StoredRollout, StoreRolloutState } from '../store/types.ts';
import type { Commits } from './commits.ts';
import { LOCAL } from './lifecycle.ts';
import type { NodeRegistry } from './node-registry.ts';

export interface FeedOptions {
  store: RolloutStore;
  /** Where a rollout the service runs itself is (and how to stop it). */
  runner: Pick<RolloutRunner, 'running' | 'abort'>;
  /** Where a rollout on a node is (and how to have it stopped). */
  nodes: Pick<NodeRegistry, 'stage' | 'requestCancel'>;
  commits: Pick<Commits, 'commit' | 'endedResult'>;
}

/** How many rollouts the store holds, and how many of them ended how. */
export interface RolloutCounts {
  total: number;
  done: number;
  failed: number;
  cancelled: number;
}

/**
 * What callers see of rollouts: their views (the stage each is in, or its result), lists, the
 * wait for a result, the stream of results as they complete, cancels, and the counts.
 */
export class Feed {
  readonly #store: RolloutStore;
  readonly #runner: FeedOptions['runner'];
  readonly #nodes: FeedOptions['nodes'];
  readonly #commits: FeedOptions['commits'];
  readonly #events = new EventEmitter();
  /** Who waits for a rollout's result. */
  readonly #waiters = new Map<string, Array<{ resolve: (result: RolloutResult) => void; reject: (error: unknown) => void }>>();
  /** Counts since the store was opened (read from it at start, kept up to date since). */
  #counts: RolloutCounts = { total: 0, done: 0, failed: 0, cancelled: 0 };
  /**
   * Results since the service started whose turns drifted (chat mode: a turn's prompt re-tokenised
   * differently from the previous prompt and generation), so that their training views have no
   * sequence: not in the store, which keeps results, not what trainers made of them.
   */
  #drifted = 0;

  constructor(options: FeedOptions) {
    this.#store = options.store;
    this.#runner = options.runner;
    this.#nodes = options.nodes;
    this.#commits = options.commits;
    this.#events.setMaxListeners(0);
  }

  get counts(): Readonly<RolloutCounts> {
    return this.#counts;
  }

  get drifted(): number {
    return this.#drifted;
  }

  async recount(): Promise<void> {
    const counts = await this.#store.counts();
    this.#counts = { total: counts.queued + counts.leased + counts.done + counts.failed + counts.cancelled, done: counts.done, failed: counts.failed, cancelled: counts.cancelled };
  }

  /** New rollouts were stored. */
  added(rollouts: number): void {
    this.#counts.total += rollouts;
  }

  /** A result was stored: it is counted, and its waiters and listeners hear of it. */
  finished(result: RolloutResult): void {
    this.#counts[result.state === 'done' ? 'done' : result.state === 'cancelled' ? 'cancelled' : 'failed']++;
    if (hasDrift(result)) this.#drifted++;
    const waiters = this.#waiters.get(result.id);
    if (waiters) {
      this.#waiters.delete(result.id);
      for (const waiter of waiters) waiter.resolve(result);
    }
    this.#events.emit('result', result);
  }

  /** Calls `listener` with every result as it completes; returns the unsubscribe function. */
  onResult(listener: (result: RolloutResult) => void): () => void {
    this.#events.on('result', listener);
    return () => this.#events.off('result', listener);
  }

  /** Every waiter fails with `error()` (the service is shutting down). */
  close(error: () => unknown): void {
    for (const [id, waiters] of this.#waiters) {
      this.#waiters.delete(id);
      for (const waiter of waiters) waiter.reject(error());
    }
  }

  /** A rollout's state as the API shows it: the stage it is in, or its result. */
  async get(id: string): Promise<RolloutView | undefined> {
    const rollout = await this.#store.getRollout(id);
    if (!rollout) return undefined;
    return this.#view(rollout);
  }

  /** A rollout's view; `known`: its result when the caller has read it already (null: it has none). */
  async #view(rollout: StoredRollout, known?: RolloutResult | null): Promise<RolloutView> {
    if (rollout.state === 'done' || rollout.state === 'failed' || rollout.state === 'cancelled') {
      const result = known === undefined ? ((await this.#store.getResult(rollout.id)) ?? null) : known;
      const env = result?.env ?? (await this.#taskEnv(rollout.taskId)) ?? '';
      return { id: rollout.id, task_id: rollout.taskId, sample_index: rollout.sampleIndex, env, state: result?.state ?? rollout.state, active: false, result };
    }
    const env = (await this.#taskEnv(rollout.taskId)) ?? '';
    const base = { id: rollout.id, task_id: rollout.taskId, sample_index: rollout.sampleIndex, env };
    const local = this.#runner.running(rollout.id);
    if (local) return { ...base, state: local.stage, active: local.active, result: null };
    if (rollout.state === 'leased') {
      const stage = this.#nodes.stage(rollout.id, rollout.workerId);
      return { ...base, state: stage, active: stage !== 'queued', result: null };
    }
    return { ...base, state: 'queued', active: false, result: null };
  }

  /** Task envs, remembered (a task's env never changes). */
  readonly #envOfTask = new Map<string, string>();
  async #taskEnv(taskId: string): Promise<string | undefined> {
    const known = this.#envOfTask.get(taskId);
    if (known !== undefined) return known;
    const task = await this.#store.getTask(taskId);
    if (!task) return undefined;
    if (this.#envOfTask.size > 100_000) this.#envOfTask.clear();
    this.#envOfTask.set(taskId, task.task.env);
    return task.task.env;
  }

  /** Rollouts in submission order, after `cursor` (an opaque position), at most `limit`. */
  async list(options: { cursor?: string; limit?: number; state?: RolloutState; taskId?: string } = {}): Promise<{ items: RolloutView[]; nextCursor: string | null }> {
    const limit = Math.min(Math.max(options.limit ?? 100, 1), 1_000);
    const stage = options.state === 'init' || options.state === 'run' || options.state === 'eval' || options.state === 'queued' ? options.state : undefined;
    const storeState: StoreRolloutState | readonly StoreRolloutState[] | undefined = stage ? ['queued', 'leased'] : (options.state as 'done' | 'failed' | 'cancelled' | undefined);
    const items: RolloutView[] = [];
    let cursor: string | null = options.cursor ?? null;
    do {
      const page = await this.#store.listRollouts({ cursor, limit: limit - items.length, ...(storeState ? { state: storeState } : {}), ...(options.taskId !== undefined ? { taskId: options.taskId } : {}) });
      // the page's results in one query, not one per rollout
      const results = await this.#store.getResults(page.items.filter((r) => r.state !== 'queued' && r.state !== 'leased').map((r) => r.id));
      for (const rollout of page.items) {
        const view = await this.#view(rollout, results.get(rollout.id) ?? null);
        if (!stage || view.state === stage) items.push(view);
      }
      cursor = page.cursor;
    } while (cursor && items.length < limit);
    return { items, nextCursor: cursor };
  }

  /** Resolves with the rollout's result once it is finished. */
  async wait(id: string): Promise<RolloutResult> {
    // listening before looking, so a result stored in between is not missed
    let waiter!: { resolve: (result: RolloutResult) => void; reject: (error: unknown) => void };
    const finished = new Promise<RolloutResult>((resolve, reject) => (waiter = { resolve, reject }));
    const list = this.#waiters.get(id) ?? [];
    list.push(waiter);
    this.#waiters.set(id, list);
    const forget = () => {
      const rest = (this.#waiters.get(id) ?? []).filter((w) => w !== waiter);
      if (rest.length > 0) this.#waiters.set(id, rest);
      else this.#waiters.delete(id);
    };
    try {
      const [rollout, stored] = await Promise.all([this.#store.getRollout(id), this.#store.getResult(id)]);
      if (stored) {
        forget();
        return stored;
      }
      if (!rollout) {
        forget();
        throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout "${id}"` });
      }
    } catch (error) {
      forget();
      throw error;
    }
    return finished;
  }

  /** Cancels a rollout: it leaves its queue or stage, its session and sandbox are freed. */
  async cancel(id: string): Promise<RolloutView> {
    for (let tries = 0; ; tries++) {
      const rollout = await this.#store.getRollout(id);
      if (!rollout) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout "${id}"` });
      if (rollout.state === 'done' || rollout.state === 'failed' || rollout.state === 'cancelled') return this.#view(rollout);
      if (this.#runner.abort(id)) return this.#view(rollout);
      if (rollout.state === 'leased') {
        // on a node: it aborts at its next heartbeat and commits the cancelled result
        this.#nodes.requestCancel(id);
        return this.#view(rollout);
      }
      const result = await this.#commits.endedResult(rollout, { state: 'cancelled', code: 'CANCELLED', message: 'rollout cancelled' });
      // queued: held by no one, which only the service's own commit may end
      const status = await this.#commits.commit(LOCAL, rollout.attempt, result, undefined, rollout.state === 'queued');
      if (status === 'committed' || status === 'duplicate' || tries >= 5) return (await this.get(id))!;
      // claimed in between: look again
    }
  }
}
