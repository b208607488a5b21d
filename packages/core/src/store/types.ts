import type { RolloutResult, RolloutTask } from '../protocol/rollout.ts';
import type { SampledGroupOutcome, SamplingSettings, SamplingState } from '../protocol/sampling.ts';

/**
 * Where a rollout is in the store's eyes. `queued`: waiting for a worker (new, or re-issued after a
 * lease was lost); `leased`: a worker holds it until its lease expires; `done`, `failed`,
 * `cancelled`: it has a result (the result's own `state`), and never changes again.
 */
export type StoreRolloutState = 'queued' | 'leased' | 'done' | 'failed' | 'cancelled';

export const STORE_ROLLOUT_STATES: readonly StoreRolloutState[] = ['queued', 'leased', 'done', 'failed', 'cancelled'];

/** A task as the store holds it. */
export interface StoredTask {
  /** The task id (the caller's, or one the service chose). */
  id: string;
  /** The normalised task, `id` included. */
  task: RolloutTask;
  /** Its rollouts, one per sample: `taskId` for n = 1, else `taskId:0` … `taskId:n-1` (see rolloutIdsOf). */
  rolloutIds: string[];
  /** When it was first put (ISO 8601). */
  createdAt: string;
}

/** What `putTasks` did with one task. */
export interface PutTaskOutcome {
  taskId: string;
  rolloutIds: string[];
  /** True when the id was already known with the same body: nothing was added. */
  existing: boolean;
}

/** A rollout's bookkeeping (not its result; see `getResult`). */
export interface StoredRollout {
  id: string;
  taskId: string;
  sampleIndex: number;
  state: StoreRolloutState;
  /**
   * The fencing number: 0 until first claimed, then bumped by every claim. Only a commit carrying
   * the current attempt is accepted, so the holder of an older lease can never overwrite a result.
   */
  attempt: number;
  /** Who holds the lease (`leased`), or who committed the result (finished); else null. */
  workerId: string | null;
  /** When the lease runs out (epoch ms), while `leased`; else null. */
  leaseExpiresAt: number | null;
}

/** A rollout handed to a worker by `claim`: everything it needs to run it. */
export interface ClaimedRollout {
  id: string;
  taskId: string;
  sampleIndex: number;
  /** The attempt the worker must quote when renewing and committing. */
  attempt: number;
  leaseExpiresAt: number;
  task: RolloutTask;
}

export interface ClaimOptions {
  /** Who claims: a rollout node's id (or the service's own, when it runs the pools itself). */
  workerId: string;
  /** How many rollouts at most. */
  limit: number;
  /** How long the lease lasts unless renewed. */
  leaseMs: number;
}

/** A lease a worker holds, as it quotes it back. */
export interface LeaseRef {
  rolloutId: string;
  attempt: number;
}

export interface RenewOutcome {
  /** Leases extended to `now + leaseMs`. */
  renewed: string[];
  /** Leases the worker no longer holds (expired and re-issued, released, or finished): stop their work. */
  lost: string[];
}

export interface CommitInput {
  rolloutId: string;
  /** The attempt the committing worker was given by `claim` (0 for a rollout never claimed, e.g. cancelled while queued). */
  attempt: number;
  /** The finished result; its `state` must be `done`, `failed` or `cancelled`. */
  result: RolloutResult;
  /**
   * Who commits (kept as the rollout's `workerId`): it must hold the rollout's lease at `attempt`,
   * checked in the same statement as the attempt, so no worker commits for another's lease.
   */
  workerId: string;
  /**
   * Also accept the commit for a rollout that is queued at `attempt` (held by no one): only the
   * service itself ends work that never ran (cancelled while queued). Never set for a node.
   */
  unheld?: boolean;
  /**
   * Results of the same task's other rollouts, rewritten in the same transaction when this commit
   * is accepted (the group's credit, computed when the last sample finishes). Only rollouts that
   * already have a result are rewritten.
   */
  amend?: RolloutResult[];
}

/**
 * What a commit did. `committed`: the result is stored, the rollout finished. `duplicate`: this
 * worker had already committed this very attempt (a retried commit); nothing changed. `stale`:
 * the attempt is not the current one (the lease was lost and the rollout re-issued), another
 * attempt already committed, or the worker does not hold the lease (another worker does, or no
 * one); nothing changed. `not_found`: no such rollout.
 */
export type CommitOutcome =
  | { status: 'committed' }
  | { status: 'duplicate' }
  | { status: 'stale'; currentAttempt: number; state: StoreRolloutState }
  | { status: 'not_found' };

/** A rollout node's credential as the store keeps it: only its hash, so a node re-registering after a restart of the service proves it is the same. */
export interface StoredNodeCredential {
  nodeId: string;
  /** SHA-256 of the secret, hex. */
  credentialHash: string;
  /** When it was issued (epoch ms). */
  issuedAt: number;
}

export interface ListRolloutsQuery {
  state?: StoreRolloutState | readonly StoreRolloutState[];
  taskId?: string;
  /** The `cursor` of the previous page. */
  cursor?: string | null;
  /** Page size (default 100, at most 10,000). */
  limit?: number;
}

export interface ListResultsQuery {
  taskId?: string;
  /** The result's own state. */
  state?: RolloutResult['state'] | readonly RolloutResult['state'][];
  cursor?: string | null;
  limit?: number;
}

/** A page; `cursor` is null on the last one. */
export interface Page<T> {
  items: T[];
  cursor: string | null;
}

/** What retention keeps; both may be given (a result goes when either says so). */
export interface RetentionPolicy {
  /** Forget results stored more than this long ago. */
  maxAgeMs?: number;
  /** Keep only the most recently stored N results. */
  keepLast?: number;
}

export interface PruneOutcome {
  /** Results (and their rollouts) forgotten. */
  results: number;
  /** Tasks left with no rollout, forgotten too (their ids may be submitted again). */
  tasks: number;
}

/** A group a dynamic sampling started, as the store keeps it. */
export interface StoredSampledGroup {
  taskId: string;
  /** Its task's place in the pool (groups start in pool order). */
  position: number;
  outcome: SampledGroupOutcome;
  /** A kept group's place in the order kept (0 first), else null. */
  kept: number | null;
}

/** A dynamic sampling (service/dynamic-sampling.ts) as the store keeps it: its request and its progress. */
export interface StoredSampling {
  id: string;
  settings: SamplingSettings;
  /** The pool's tasks in order, ids given; empty once the sampling has ended. */
  pool: RolloutTask[];
  poolSize: number;
  /** Tasks of the pool started so far (or about to be): the next to start is `pool[next]`. */
  next: number;
  state: SamplingState;
  error: string | null;
  /** Every group started, in pool order, and what became of it so far. */
  groups: StoredSampledGroup[];
  /** Epoch ms (the store's clock). */
  createdAt: number;
  endedAt: number | null;
}

/** Progress of a sampling, written in one transaction (`updateSampling`). */
export interface SamplingChange {
  /** Groups about to start (written before their tasks are stored, so a restart finds them), `running`. */
  started?: ReadonlyArray<{ taskId: string; position: number }>;
  next?: number;
  /** Outcomes decided, a kept group's with its place in the order kept. */
  outcomes?: ReadonlyArray<{ taskId: string; outcome: SampledGroupOutcome; kept?: number }>;
  /** Groups whose start failed (their tasks were not stored): forgotten. */
  unstarted?: readonly string[];
  /** The sampling has ended: its pool is let go of, it counts toward `pruneSamplings`. */
  end?: { state: Exclude<SamplingState, 'running'>; error: string | null };
}

/**
 * The durable state of the rollout service: tasks, their rollouts, the leases workers hold on them
 * and their results. One interface, two engines, chosen by URL (see `openStore`):
 *
 * - `sqlite:///path/to/file.db` or `sqlite::memory:`: embedded, one machine, nothing to set up.
 * - `postgres://user@host:port/db` (or `postgresql://`): several machines share one database.
 *
 * Exactly-once: every claim bumps the rollout's attempt (a fencing number) and a commit succeeds,
 * in one transaction, only for the current attempt of an unfinished rollout. A retried commit is a
 * `duplicate`, a late commit from a node that lost its lease is `stale`; neither changes anything.
 *
 * @example
 * const store = await openStore('sqlite:///var/lib/rollserve/store.db');
 * await store.putTasks([task]);
 * const [work] = await store.claim({ workerId: 'node-1', limit: 1, leaseMs: 30_000 });
 * const outcome = await store.commit({ rolloutId: work.id, attempt: work.attempt, result });
 * await store.close();
 */
export interface RolloutStore {
  /** The engine's name: `sqlite`, `postgres`. */
  readonly kind: string;

  /**
   * Adds tasks (ids required) and their rollouts, queued, in one transaction: a batch goes in
   * whole or not at all. A known id with the same body is `existing` (idempotent); a known id with
   * another body fails the batch with a CONFLICT RolloutError.
   */
  putTasks(tasks: readonly RolloutTask[]): Promise<PutTaskOutcome[]>;
  /**
   * `putTasks`, then `claim`, in one transaction: what a worker accepting work it will run itself
   * pays once instead of twice (a lone rollout's accept and lease were two of its three
   * transactions). The claim is `claim`'s own, oldest first, so older queued work still goes first.
   */
  putTasksAndClaim(tasks: readonly RolloutTask[], claim: ClaimOptions): Promise<{ outcomes: PutTaskOutcome[]; claimed: ClaimedRollout[] }>;
  getTask(taskId: string): Promise<StoredTask | undefined>;

  /**
   * Leases up to `limit` rollouts to a worker, oldest first: queued ones and those whose lease
   * has expired. Each claim bumps the rollout's attempt. Concurrent claimers get disjoint sets.
   */
  claim(options: ClaimOptions): Promise<ClaimedRollout[]>;
  /**
   * Heartbeat: extends the worker's leases still current (held by `workerId` at their attempt);
   * reports the ones it has lost. SQLite renews at most 500 per transaction and yields to the
   * event loop between them, so a long list never holds the process for long.
   */
  renewLeases(workerId: string, leases: readonly LeaseRef[], leaseMs: number): Promise<RenewOutcome>;
  /** Re-queues rollouts whose lease has expired; returns their ids. (`claim` takes them anyway.) */
  expireLeases(): Promise<string[]>;
  /** Re-queues every rollout a worker holds (a lost node); returns their ids. */
  releaseWorker(workerId: string): Promise<string[]>;
  /** Re-queues those of `leases` the worker still holds at their attempt (held too long, say); returns their ids. */
  releaseLeases(workerId: string, leases: readonly LeaseRef[]): Promise<string[]>;

  /**
   * Stores a result in one transaction if `attempt` is current, the rollout unfinished and leased
   * to `workerId` (or queued, with `unheld`): one statement checks all of it.
   */
  commit(input: CommitInput): Promise<CommitOutcome>;
  /**
   * Several commits, each with its own outcome, as if made one after the other (SQLite: in one
   * transaction, which is where its time goes; PostgreSQL: concurrently over the pool).
   */
  commitMany(inputs: readonly CommitInput[]): Promise<CommitOutcome[]>;
  getResult(rolloutId: string): Promise<RolloutResult | undefined>;
  /** The results of those of `rolloutIds` that have one, by rollout id (one query per 500 ids). */
  getResults(rolloutIds: readonly string[]): Promise<Map<string, RolloutResult>>;
  getRollout(rolloutId: string): Promise<StoredRollout | undefined>;
  /** Rollouts in the order they were put. */
  listRollouts(query?: ListRolloutsQuery): Promise<Page<StoredRollout>>;
  /** Results in the order they were stored. */
  listResults(query?: ListResultsQuery): Promise<Page<RolloutResult>>;
  /** Rollouts per state. */
  counts(): Promise<Record<StoreRolloutState, number>>;

  /** Forgets old results with their rollouts (and tasks left empty); default: the store's `retention`. */
  prune(policy?: RetentionPolicy): Promise<PruneOutcome>;

  /** Whether a one-time import (see importJournal) has been recorded under `source`. */
  hasImport(source: string): Promise<boolean>;
  /**
   * Writes an import in one transaction: tasks (existing ids are kept as they are), results of
   * rollouts not finished yet (attempt unchanged), and the record that `source` was imported.
   * Returns false, writing nothing, when `source` was already imported.
   */
  recordImport(source: string, tasks: readonly RolloutTask[], results: readonly RolloutResult[]): Promise<{ imported: boolean; tasks: number; results: number }>;

  /** Keeps a rollout node's credential hash (replacing the one it had). */
  putNodeCredential(credential: StoredNodeCredential): Promise<void>;
  getNodeCredential(nodeId: string): Promise<StoredNodeCredential | undefined>;
  /** Forgets a node's credential (a node forgotten by the service's retention). */
  deleteNodeCredential(nodeId: string): Promise<void>;

  /** A setting of the service's kept across restarts (JSON), undefined when never put. */
  getSetting(key: string): Promise<unknown>;
  putSetting(key: string, value: unknown): Promise<void>;

  /** Keeps a new dynamic sampling, `running`, no group started; false (nothing written) when its id is known. */
  putSampling(sampling: { id: string; settings: SamplingSettings; pool: readonly RolloutTask[] }): Promise<boolean>;
  getSampling(id: string): Promise<StoredSampling | undefined>;
  /** The samplings still `running`, oldest first (what a restarted service goes on with). */
  runningSamplings(): Promise<StoredSampling[]>;
  /** Writes a sampling's progress in one transaction; an unknown id changes nothing. */
  updateSampling(id: string, change: SamplingChange): Promise<void>;
  /** Forgets a sampling and its groups (one whose first submit failed). */
  deleteSampling(id: string): Promise<void>;
  /**
   * Rollouts of groups that an ended sampling counts as `cancelled` which have no result yet: the
   * service stopped between storing the end and cancelling them, and cancels them on start.
   */
  unfinishedCancelledSamples(): Promise<string[]>;
  /** Forgets ended samplings but the `keepEnded` that ended last; returns how many went. */
  pruneSamplings(keepEnded: number): Promise<number>;

  /** The applied schema version (see the migrations). */
  schemaVersion(): Promise<number>;
  close(): Promise<void>;
}

export interface OpenStoreOptions {
  /** Milliseconds since the epoch; leases and retention use it (tests inject a fake clock). */
  now?: () => number;
  /** Used by `prune()` without arguments. */
  retention?: RetentionPolicy;
  /** PostgreSQL: connections in the pool (default 10). */
  poolSize?: number;
  /**
   * PostgreSQL: how long an operation keeps retrying while the database cannot be reached (a
   * restart, a failover) before failing with UNAVAILABLE (default 30 s). Retries are safe: every
   * write is idempotent or fenced.
   */
  reconnectMs?: number;
}
