import { createHash, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { z } from 'zod';
import { pino, type Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import type { Environment } from '../spec/environment.ts';
import { importJournal } from '../store/import-journal.ts';
import { openStore } from '../store/open.ts';
import type { CommitInput, RetentionPolicy, RolloutStore, StoredRollout, StoreRolloutState } from '../store/types.ts';
import type { CallModel, ModelTurn } from '../runner/agent-loop.ts';
import { assignTaskGroupCredit } from '../runner/credit.ts';
import { createServiceMetrics, type ServiceMetrics } from '../runner/metrics.ts';
import {
  isReservedNodeId,
  NODE_CREDENTIAL_HEADER,
  SERVICE_WORKER_ID,
  type HeartbeatAnswer,
  type NodeAuth,
  type NodeClaim,
  type NodeCommit,
  type NodeCommitStatus,
  type NodeCoordinator,
  type NodeLease,
  type NodeModelRequest,
  type NodeRegistered,
  type NodeRegistration,
  type NodeView,
} from '../protocol/nodes.ts';
import { goneSlurmJobs, slurmJobOf, slurmRunOf, type SlurmJobRef } from '../slurm/watch.ts';
import { RolloutRunner, STAGES, type ModelProvider, type RolloutRunnerOptions, type StageName } from '../runner/runner.ts';
import { RolloutTask, type RolloutResult, type RolloutState, type RolloutTaskInput, type RolloutView } from '../protocol/rollout.ts';

export { STAGES, type ModelProvider, type StageName } from '../runner/runner.ts';

export interface RolloutServiceOptions extends Omit<RolloutRunnerOptions, 'metrics' | 'logger'> {
  /**
   * Where tasks, leases and results live: a store, or its URL (`sqlite:///path.db`,
   * `sqlite::memory:`, `postgres://…`; see openStore). A store given as an object stays the
   * caller's to close. @default 'sqlite::memory:' (nothing survives the process)
   */
  store?: RolloutStore | string;
  /** An old JSONL journal (rollserve before the store): imported once, when the file exists. */
  importJournal?: string;
  /** What results to keep; pruned at start and every `pruneEveryMs`. @default keep everything */
  retention?: RetentionPolicy;
  /** @default 60_000 */
  pruneEveryMs?: number;
  /** How long a lease lasts unless renewed. @default 30_000 */
  leaseMs?: number;
  /** How often nodes heartbeat (and the service sweeps expired leases and lost nodes). @default 2_000 */
  heartbeatMs?: number;
  /** A node silent this long is lost: what it holds is re-issued. @default 10_000 */
  nodeTimeoutMs?: number;
  /**
   * A node that left or was lost stays listed this long after it was last heard from, then is
   * forgotten (a service running for weeks does not list every node that ever ran; one that comes
   * back registers again). @default 3_600_000
   */
  nodeRetentionMs?: number;
  /**
   * Whether the service runs rollouts itself: 'auto' while no rollout node takes work (the
   * default), 'always', or 'never' (only nodes run them). A node takes work while it has a claim
   * open (or ended one in the last few seconds), or holds as many leases as its `maxRollouts`: a
   * node that is up but claims nothing does not stop the service running rollouts itself.
   */
  runLocally?: 'auto' | 'always' | 'never';
  /**
   * How many times a rollout is handed out before it fails: each claim counts (a node lost with
   * it, a lease that ran out, a restart of the service while it ran the rollout itself). @default 5
   */
  maxAttempts?: number;
  /**
   * Asks Slurm (`squeue`) every `everyMs` about the jobs of nodes that registered with Slurm ids:
   * a node whose job is gone (requeued, cancelled, node failure, …) is lost at once, without
   * waiting for its node timeout. Off when false; nothing is concluded while squeue cannot answer.
   * @default { everyMs: 5_000 } (when any node has Slurm ids and squeue is on PATH)
   */
  slurmWatch?: false | { everyMs?: number; squeue?: string; env?: NodeJS.ProcessEnv };
  /** Rollouts the service's own pools hold at most; the rest wait in the store. @default the sum of the pools */
  localRollouts?: number;
  logger?: Logger;
}

export interface SubmittedTask {
  taskId: string;
  rolloutIds: string[];
  /** True when the id was known: nothing new was started. */
  existing: boolean;
}

/** The id under which the service leases what its own pools run (no node may register under it). */
const LOCAL = SERVICE_WORKER_ID;

/**
 * A lease's life, from its claim, is at most this many times its task's limits (`init_timeout_s`
 * for INIT, `time_limit_s` for RUN and EVAL; plus twice that waiting for the node's stage slots):
 * past it, a heartbeat no longer renews
 * the lease, so a node that holds work without ever committing it cannot keep it.
 */
const LEASE_LIFE_PER_TIME_LIMIT = 3;

interface NodeState {
  registration: NodeRegistration;
  registeredAt: number;
  lastSeen: number;
  state: 'up' | 'lost' | 'left';
  /** Why it was lost. */
  lostReason?: string;
  /** Results it committed. */
  committed: number;
  /** SHA-256 of its credential (hex); unknown for a placeholder from before a restart of the service. */
  credentialHash?: string;
  /** Claims of it open now (long polls). */
  claims: number;
  /** When its last claim answered. */
  lastClaimAt: number;
}

/**
 * A rollout leased to a node, as the service tracks it: the stage the node last reported, and
 * its policy caller. `policy` and `n` come with the claim; for a lease from before a restart of
 * the service they are read from the store when its first policy turn comes (see #remoteLease).
 */
interface RemoteLease {
  nodeId: string;
  attempt: number;
  stage: NodeLease['stage'];
  policy?: RolloutTask['policy'];
  /** The task's samples. */
  n?: number;
  caller?: CallModel;
  /** No heartbeat renews the lease after this (epoch ms; see LEASE_LIFE_PER_TIME_LIMIT). */
  renewUntil?: number;
  /** Whose sample it is: a result the node sends for it must say the same. */
  taskId?: string;
  sampleIndex?: number;
}

/** Leases to nodes by rollout id, counting what each node holds (a claim asks it at every turn). */
class RemoteLeases extends Map<string, RemoteLease> {
  readonly #byNode = new Map<string, number>();

  override set(rolloutId: string, lease: RemoteLease): this {
    const old = super.get(rolloutId);
    if (old) this.#count(old.nodeId, -1);
    this.#count(lease.nodeId, 1);
    return super.set(rolloutId, lease);
  }

  override delete(rolloutId: string): boolean {
    const old = super.get(rolloutId);
    if (old) this.#count(old.nodeId, -1);
    return super.delete(rolloutId);
  }

  heldBy(nodeId: string): number {
    return this.#byNode.get(nodeId) ?? 0;
  }

  #count(nodeId: string, by: number): void {
    const held = (this.#byNode.get(nodeId) ?? 0) + by;
    if (held > 0) this.#byNode.set(nodeId, held);
    else this.#byNode.delete(nodeId);
  }
}

const unavailable = () => new RolloutError({ code: 'UNAVAILABLE', message: 'the service is shutting down', retryable: true });
const notFoundNode = (nodeId: string) => new RolloutError({ code: 'NOT_FOUND', message: `no node "${nodeId}" (register again)` });
const badCredential = (nodeId: string) =>
  new RolloutError({ code: 'UNAUTHORIZED', message: `node "${nodeId}": a valid node credential is required (the ${NODE_CREDENTIAL_HEADER} header, as given at its registration)` });
const hashCredential = (credential: string) => createHash('sha256').update(credential).digest('hex');

/** Whether `credential` hashes to `hash`, compared in constant time. */
function credentialFits(credential: string | undefined, hash: string | undefined): boolean {
  if (credential === undefined || hash === undefined) return false;
  const given = Buffer.from(hashCredential(credential), 'hex');
  const kept = Buffer.from(hash, 'hex');
  return given.length === kept.length && timingSafeEqual(given, kept);
}

/**
 * Runs an environment's per-row sandbox spec at submit: what it refuses is the rollout API's 422,
 * its `details` naming the row's field (`path`, as a schema failure's).
 */
function rowSandboxCheck(spec: () => unknown, envName: string): void {
  try {
    spec();
  } catch (error) {
    // whatever the environment cannot make a sandbox of is a bad row: a 4xx, never a 500
    const failure = RolloutError.from(error);
    const items = Array.isArray(failure.details) ? (failure.details as Array<{ loc?: unknown[]; msg?: string }>) : [];
    const details = items.map((item) => ({
      code: 'custom',
      path: ['row', ...(Array.isArray(item.loc) ? item.loc.filter((_, i) => i > 0 || item.loc![0] !== 'body') : [])],
      message: (item.msg ?? failure.message).replace(/^Value error, /, ''),
    }));
    throw new RolloutError({ code: 'UNPROCESSABLE', message: `row does not fit environment "${envName}": ${failure.message}`, details: details.length > 0 ? details : undefined });
  }
}

/** How long a lease may be renewed after its claim (see LEASE_LIFE_PER_TIME_LIMIT). */
const leaseLifeMs = (task: RolloutTask) => LEASE_LIFE_PER_TIME_LIMIT * (task.limits.init_timeout_s + task.limits.time_limit_s) * 1000;

/** A promise that settles when `wake` is called or `ms` pass. */
function sleepUntilWoken(ms: number, wakers: Set<() => void>, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      wakers.delete(done);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    wakers.add(done);
    signal?.addEventListener('abort', done, { once: true });
  });
}

/**
 * The rollout service: accepts tasks, keeps them, their leases and their results in a store
 * (results leave memory once stored), and has them run: by its own INIT/RUN/EVAL pools (a
 * RolloutRunner) while no rollout node is up, else by the nodes, which pull leased work (see
 * NodeCoordinator). A result commits only for the current attempt of its lease, so a retried or
 * late commit (a node that lost its lease) changes nothing: every rollout ends with one result.
 */
export class RolloutService implements NodeCoordinator {
  readonly metrics: ServiceMetrics;
  readonly logger: Logger;
  readonly store: RolloutStore;
  readonly #ownsStore: boolean;
  readonly #runner: RolloutRunner;
  readonly #envs = new Map<string, Environment<any, any, any>>();
  readonly #events = new EventEmitter();
  readonly #options: RolloutServiceOptions;
  readonly #leaseMs: number;
  readonly #heartbeatMs: number;
  readonly #nodeTimeoutMs: number;
  readonly #nodeRetentionMs: number;
  readonly #localLimit: number;
  /** Rollouts the service's own pools run, by id: their lease's attempt. */
  readonly #local = new Map<string, number>();
  /** Rollouts leased to nodes. */
  readonly #remote = new RemoteLeases();
  readonly #nodes = new Map<string, NodeState>();
  /** Cancels asked for rollouts leased to a node that has not heartbeaten since (delivered with its next heartbeat). */
  readonly #cancelRequests = new Set<string>();
  /** Who waits for a rollout's result. */
  readonly #waiters = new Map<string, Array<{ resolve: (result: RolloutResult) => void; reject: (error: unknown) => void }>>();
  /** Commits of one task run one at a time (the last sample of a group sees all the others). */
  readonly #taskLocks = new Map<string, Promise<unknown>>();
  /** Commits of the service's own results under way (a shutdown lets them finish). */
  readonly #committing = new Set<Promise<unknown>>();
  /** Commits waiting for the next batch (see #commitBatched). */
  #commitBatch: Array<{ input: CommitInput; resolve: (status: NodeCommitStatus) => void; reject: (error: unknown) => void }> = [];
  /** Results of groups (n > 1) not whole yet, by task (see #commit). */
  readonly #openGroups = new Map<string, Map<string, RolloutResult>>();
  /** Node claims waiting for work. */
  readonly #claimWakers = new Set<() => void>();
  /** Counts since the store was opened (read from it at start, kept up to date since). */
  #counts = { total: 0, done: 0, failed: 0, cancelled: 0 };
  #pumping = false;
  /** After a restart with nodes holding work, the service waits for them before running anything itself. */
  #localHoldUntil = 0;
  #pumpAgain = false;
  #submitting: Promise<unknown> = Promise.resolve();
  #timers: NodeJS.Timeout[] = [];
  #closed = false;

  private constructor(options: RolloutServiceOptions, store: RolloutStore, ownsStore: boolean) {
    this.#options = options;
    this.store = store;
    this.#ownsStore = ownsStore;
    this.logger = options.logger ?? pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
    for (const env of options.environments) this.#envs.set(env.name, env);
    this.#leaseMs = options.leaseMs ?? 30_000;
    this.#heartbeatMs = options.heartbeatMs ?? 2_000;
    this.#nodeTimeoutMs = options.nodeTimeoutMs ?? 10_000;
    this.#nodeRetentionMs = options.nodeRetentionMs ?? 3_600_000;
    this.#events.setMaxListeners(0);
    this.metrics = createServiceMetrics(() => this.status());
    this.#runner = new RolloutRunner({ ...options, logger: this.logger, metrics: this.metrics });
    const pools = this.#runner.capacity;
    this.#localLimit = options.localRollouts ?? (options.pipeline === 'serial' ? pools.run : pools.init + pools.run + pools.eval);
  }

  /**
   * Creates the service on its store: an old journal is imported once, what the previous service
   * ran itself is queued again (its work died with it), results are pruned by the retention
   * policy, and queued work starts.
   */
  static async create(options: RolloutServiceOptions): Promise<RolloutService> {
    const given = options.store ?? 'sqlite::memory:';
    const store = typeof given === 'string' ? await openStore(given, options.retention ? { retention: options.retention } : {}) : given;
    const service = new RolloutService(options, store, typeof given === 'string');
    try {
      await service.#recover();
    } catch (error) {
      if (service.#ownsStore) await store.close();
      throw error;
    }
    return service;
  }

  async #recover(): Promise<void> {
    if (this.#options.importJournal && existsSync(this.#options.importJournal)) {
      const imported = await importJournal(this.store, this.#options.importJournal);
      if (imported.imported) this.logger.info({ journal: this.#options.importJournal, ...imported }, 'journal imported into the store');
    }
    const requeued = [...(await this.store.releaseWorker(LOCAL)), ...(await this.store.expireLeases())];
    if (this.#options.retention) await this.#prune();
    await this.#recount();
    // Nodes holding leases from before a restart get a node timeout to come back, else their work is re-issued.
    const holders = new Set<string>();
    const now = Date.now();
    const tasks = new Map<string, RolloutTask | undefined>();
    for (let cursor: string | null = null; ; ) {
      const page = await this.store.listRollouts({ state: 'leased', cursor, limit: 10_000 });
      for (const rollout of page.items) {
        if (!rollout.workerId) continue;
        holders.add(rollout.workerId);
        // its lease's life starts again now (when it was claimed is not kept)
        if (!tasks.has(rollout.taskId)) tasks.set(rollout.taskId, (await this.store.getTask(rollout.taskId))?.task);
        const task = tasks.get(rollout.taskId);
        if (task) {
          const { taskId, sampleIndex } = rollout;
          this.#remote.set(rollout.id, { nodeId: rollout.workerId, attempt: rollout.attempt, stage: 'queued', policy: task.policy, n: task.n, renewUntil: now + leaseLifeMs(task), taskId, sampleIndex });
        }
      }
      if (!(cursor = page.cursor)) break;
    }
    for (const nodeId of holders) {
      // a placeholder (no capacity, so it is not "up" for claims) until the node registers again
      const registration: NodeRegistration = { nodeId, host: '', pid: 0, capacity: { init: 0, run: 0, eval: 0 }, maxRollouts: 0, environments: [] };
      this.#nodes.set(nodeId, { registration, registeredAt: now, lastSeen: now, state: 'up', committed: 0, claims: 0, lastClaimAt: 0 });
    }
    // their nodes get a node timeout to come back before the service runs anything itself
    if (holders.size > 0) this.#localHoldUntil = now + this.#nodeTimeoutMs;
    const opened = { ...this.#counts, rerun: requeued.length, nodes: holders.size };
    if (opened.total > 0) this.logger.info(opened, 'store opened');
    else this.logger.debug(opened, 'store opened (empty)');
    this.#timers.push(setInterval(() => void this.#sweep(), this.#heartbeatMs).unref());
    if (this.#options.retention) this.#timers.push(setInterval(() => void this.#prune().then(() => this.#recount()), this.#options.pruneEveryMs ?? 60_000).unref());
    this.#timers.push(setInterval(() => void this.#renewLocal(), Math.max(1_000, Math.floor(this.#leaseMs / 3))).unref());
    if (this.#options.slurmWatch !== false) this.#timers.push(setInterval(() => void this.#watchSlurm(), this.#options.slurmWatch?.everyMs ?? 5_000).unref());
    this.#pump();
  }

  async #recount(): Promise<void> {
    const counts = await this.store.counts();
    this.#counts = { total: counts.queued + counts.leased + counts.done + counts.failed + counts.cancelled, done: counts.done, failed: counts.failed, cancelled: counts.cancelled };
  }

  async #prune(): Promise<void> {
    try {
      const pruned = await this.store.prune(this.#options.retention);
      if (pruned.results > 0) this.logger.info(pruned, 'old results pruned');
    } catch (error) {
      this.logger.error({ err: error }, 'pruning results failed');
    }
  }

  get environments(): string[] {
    return [...this.#envs.keys()];
  }

  /** A served environment by name (its metrics hooks, say). */
  environment(name: string): Environment<any, any, any> | undefined {
    return this.#envs.get(name);
  }

  /**
   * Accepts tasks: the new ones are stored in one transaction, then answered with their rollout
   * ids; their work starts in the background. A batch is accepted whole or not at all.
   */
  async submit(inputs: readonly RolloutTaskInput[]): Promise<SubmittedTask[]> {
    if (this.#closed) throw unavailable();
    const tasks = inputs.map((input) => RolloutTask.parse(input));
    for (const task of tasks) {
      const env = this.#envs.get(task.env);
      if (!env) throw new RolloutError({ code: 'NOT_FOUND', message: `unknown environment "${task.env}" (served: ${this.environments.join(', ') || 'none'})` });
      for (const schema of env.seedRow ? [env.row, env.seedRow] : [env.row]) {
        const parsed = schema.safeParse(task.row);
        if (!parsed.success) {
          throw new RolloutError({ code: 'UNPROCESSABLE', message: `row does not fit environment "${task.env}": ${z.prettifyError(parsed.error)}`, details: parsed.error.issues });
        }
      }
      // the row's sandbox (the host paths, images and binds it names) is checked now, not at INIT
      rowSandboxCheck(() => this.#runner.rowSandboxSpec(task.env, task.row), task.env);
    }
    const withIds = tasks.map((task) => (task.id ? task : { ...task, id: randomUUID() }));
    // One batch at a time, so a task id is known to the next batch once stored.
    const accepted = this.#submitting.then(async () => {
      if (this.#closed) throw unavailable();
      // While the service runs its own work and no lease is being taken already, the batch is
      // stored and leased to its pools in one transaction (claim's order: older work first).
      const room = this.#pumping || !this.#runsLocally() ? 0 : Math.min(this.#localLimit - this.#local.size, 1_000);
      const { outcomes, claimed } =
        room > 0
          ? await this.store.putTasksAndClaim(withIds, { workerId: LOCAL, limit: room, leaseMs: this.#leaseMs })
          : { outcomes: await this.store.putTasks(withIds), claimed: undefined };
      // an id repeated in the batch is new once, then known
      const seen = new Set<string>();
      const submitted = outcomes.map(({ taskId, rolloutIds, existing }) => {
        const repeated = seen.has(taskId);
        seen.add(taskId);
        return { taskId, rolloutIds, existing: existing || repeated };
      });
      for (const task of submitted) if (!task.existing) this.#counts.total += task.rolloutIds.length;
      if (claimed !== undefined) {
        try {
          for (const work of await this.#withinAttempts(LOCAL, claimed)) this.#runLocal(work);
        } catch (error) {
          // the batch is stored: its 202 stands; what was leased here lapses and runs again
          this.logger.error({ err: error }, 'starting leased work failed; its leases lapse and it runs again');
        }
        // the pools took all there was: no one else need look
        if (claimed.length < room) return submitted;
      }
      if (submitted.some((task) => !task.existing)) this.#workArrived();
      return submitted;
    });
    this.#submitting = accepted.catch(() => undefined);
    return accepted;
  }

  /** New or re-queued work: the service's own pools and waiting node claims take it. */
  #workArrived(): void {
    for (const wake of [...this.#claimWakers]) wake();
    this.#pump();
  }

  #nodesUp(): number {
    let up = 0;
    for (const node of this.#nodes.values()) if (node.state === 'up' && node.registration.maxRollouts > 0) up++;
    return up;
  }

  /** Leases a node holds, as the service counts them. */
  #heldBy(nodeId: string): number {
    return this.#remote.heldBy(nodeId);
  }

  /**
   * Whether a node takes work: up, and asking for it (a claim open, or one answered within the
   * last few heartbeats: a node's claim loop asks again at once) or full (as many leases as its
   * capacity). A node that is up but never claims does not count, so it cannot stop the service
   * from running rollouts itself under `runLocally: 'auto'`.
   */
  #takesWork(node: NodeState, now: number): boolean {
    if (node.state !== 'up' || node.registration.maxRollouts === 0) return false;
    if (node.claims > 0 || now - node.lastClaimAt <= Math.max(5_000, 2 * this.#heartbeatMs)) return true;
    return this.#heldBy(node.registration.nodeId) >= node.registration.maxRollouts;
  }

  #runsLocally(): boolean {
    const mode = this.#options.runLocally ?? 'auto';
    if (mode !== 'auto') return mode === 'always';
    const now = Date.now();
    if (now < this.#localHoldUntil) return false;
    for (const node of this.#nodes.values()) if (this.#takesWork(node, now)) return false;
    return true;
  }

  /** Leases queued work to the service's own pools while they have room. */
  #pump(): void {
    if (this.#pumping) {
      this.#pumpAgain = true;
      return;
    }
    this.#pumping = true;
    void (async () => {
      try {
        do {
          this.#pumpAgain = false;
          while (!this.#closed && this.#runsLocally()) {
            const room = this.#localLimit - this.#local.size;
            if (room <= 0) break;
            const claimed = await this.store.claim({ workerId: LOCAL, limit: Math.min(room, 1_000), leaseMs: this.#leaseMs });
            for (const work of await this.#withinAttempts(LOCAL, claimed)) this.#runLocal(work);
            if (claimed.length < room) break;
          }
        } while (this.#pumpAgain && !this.#closed);
      } catch (error) {
        if (!this.#closed) this.logger.error({ err: error }, 'leasing work failed; trying again at the next sweep');
      } finally {
        this.#pumping = false;
      }
    })();
  }

  #runLocal(work: { id: string; taskId: string; sampleIndex: number; attempt: number; task: RolloutTask }): void {
    if (this.#closed) return;
    this.#local.set(work.id, work.attempt);
    void this.#runner
      .run({ id: work.id, taskId: work.taskId, sampleIndex: work.sampleIndex, attempt: work.attempt, task: work.task })
      .then(async (result) => {
        // a lease lost (or a shutdown) while it ran: someone else has, or will have, its result
        if (this.#local.get(work.id) !== work.attempt || this.#closed) return;
        const committing = this.#commitWithRetry(LOCAL, work.attempt, result, work.task.n);
        this.#committing.add(committing);
        await committing.finally(() => this.#committing.delete(committing));
      })
      .catch((error: unknown) => this.logger.error({ err: error, rollout: work.id }, 'rollout bookkeeping failed'))
      .finally(() => {
        if (this.#local.get(work.id) === work.attempt) this.#local.delete(work.id);
        this.#pump();
      });
  }

  /** A commit the store could not take (the database restarting) is tried again until the service closes. */
  async #commitWithRetry(workerId: string, attempt: number, result: RolloutResult, groupSize?: number): Promise<NodeCommitStatus> {
    for (let delay = 100, tries = 0; ; delay = Math.min(delay * 2, 5_000), tries++) {
      try {
        return await this.#commit(workerId, attempt, result, groupSize);
      } catch (error) {
        // while shutting down: a few tries (the store may be restarting), then the lease lapses and it runs again
        if (this.#closed && tries >= 3) throw error;
        this.logger.warn({ err: error, rollout: result.id }, 'storing a result failed; trying again');
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }

  /**
   * Stores a result if `attempt` is the rollout's current one. The last sample of a group to
   * finish gets the group's credit computed and the others' results amended, in the same
   * transaction. Then its waiters and listeners hear of it.
   */
  #commit(workerId: string, attempt: number, result: RolloutResult, groupSize?: number, unheld = false): Promise<NodeCommitStatus> {
    const commit = async (): Promise<NodeCommitStatus> => {
      let amend: RolloutResult[] = [];
      let whole = true;
      // a single sample (the common case) needs no look at its task
      const stored = groupSize === 1 ? undefined : await this.store.getTask(result.task_id);
      const held = this.#openGroups.get(result.task_id);
      if (stored && stored.rolloutIds.length > 1) {
        const others = await Promise.all(stored.rolloutIds.filter((id) => id !== result.id).map((id) => held?.get(id) ?? this.store.getResult(id)));
        whole = others.every((other) => other !== undefined);
        if (whole) {
          const group = [...(others as RolloutResult[]), result].sort((a, b) => a.sample_index - b.sample_index);
          await assignTaskGroupCredit(group, stored.task);
          amend = others as RolloutResult[];
        }
      }
      const outcome = await this.store.commit({ rolloutId: result.id, attempt, result, workerId, unheld, amend });
      if (outcome.status === 'committed') {
        // The results of a group not yet whole stay here until it is: its credit, computed when the
        // last sample finishes, then reaches the very results their waiters were given.
        if (whole) this.#openGroups.delete(result.task_id);
        else this.#openGroups.set(result.task_id, (held ?? new Map()).set(result.id, result));
        this.#finished(result);
      } else if (outcome.status === 'stale') this.logger.info({ rollout: result.id, attempt, worker: workerId, current: outcome.currentAttempt }, 'late result of a lost lease ignored');
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
      const outcomes = await this.store.commitMany(batch.map((item) => item.input));
      batch.forEach(({ input, resolve }, index) => {
        const outcome = outcomes[index]!;
        if (outcome.status === 'committed') this.#finished(input.result);
        else if (outcome.status === 'stale') this.logger.info({ rollout: input.rolloutId, attempt: input.attempt, worker: input.workerId, current: outcome.currentAttempt }, 'late result of a lost lease ignored');
        resolve(outcome.status);
      });
    } catch (error) {
      for (const { reject } of batch) reject(error);
    }
  }

  #finished(result: RolloutResult): void {
    this.#counts[result.state === 'done' ? 'done' : result.state === 'cancelled' ? 'cancelled' : 'failed']++;
    this.metrics.finished.inc({ state: result.state, critical_error: result.critical_error ?? 'none' });
    const remote = this.#remote.get(result.id);
    if (remote) {
      this.#remote.delete(result.id);
      if (remote.caller) this.#options.models.release(result.id);
    }
    this.#cancelRequests.delete(result.id);
    const waiters = this.#waiters.get(result.id);
    if (waiters) {
      this.#waiters.delete(result.id);
      for (const waiter of waiters) waiter.resolve(result);
    }
    this.#events.emit('result', result);
  }

  /** Keeps the leases of what the service's own pools run; a lease found lost ends its rollout here. */
  async #renewLocal(): Promise<void> {
    if (this.#closed || this.#local.size === 0) return;
    try {
      const leases = [...this.#local].map(([rolloutId, attempt]) => ({ rolloutId, attempt }));
      const { lost } = await this.store.renewLeases(LOCAL, leases, this.#leaseMs);
      for (const id of lost) {
        this.#local.delete(id);
        this.#runner.abort(id, 'lease lost');
      }
    } catch (error) {
      this.logger.warn({ err: error }, 'renewing leases failed');
    }
  }

  /** Expired leases and silent nodes: their work goes back to the queue. Old departed nodes are forgotten. */
  async #sweep(): Promise<void> {
    if (this.#closed) return;
    try {
      const expired = await this.store.expireLeases();
      for (const id of expired) this.#forgetRemote(id);
      let released = expired.length;
      const now = Date.now();
      for (const [nodeId, node] of this.#nodes) {
        if (node.state !== 'up') {
          if (now - node.lastSeen > this.#nodeRetentionMs) {
            this.#nodes.delete(nodeId);
            await this.store.deleteNodeCredential(nodeId);
          }
          continue;
        }
        if (now - node.lastSeen <= this.#nodeTimeoutMs) continue;
        released += await this.#lose(nodeId, node, `no heartbeat for ${now - node.lastSeen} ms`);
      }
      if (released > 0) this.#workArrived();
      else this.#pump();
    } catch (error) {
      this.logger.warn({ err: error }, 'lease sweep failed');
    }
  }

  /** A node is lost: what it holds goes back to the queue. Returns how many rollouts. */
  async #lose(nodeId: string, node: NodeState, reason: string): Promise<number> {
    node.state = 'lost';
    node.lostReason = reason;
    const ids = await this.store.releaseWorker(nodeId);
    this.#dropRemote(nodeId);
    this.logger.warn({ node: nodeId, released: ids.length, reason }, 'node lost: its work is re-issued');
    return ids.length;
  }

  /** Runs of Slurm jobs seen gone (see slurmRunOf): a node of one of them is not taken back. */
  readonly #goneRuns = new Set<string>();
  #slurmUnavailable = false;
  /** A squeue is running (a slow controller must not pile them up). */
  #slurmAsking = false;
  /** The last squeue did not answer (said once in the log until one does). */
  #slurmSilent = false;

  /** Nodes whose Slurm job is gone are lost now, not at their node timeout. */
  async #watchSlurm(): Promise<void> {
    if (this.#closed || this.#slurmUnavailable || this.#slurmAsking || this.#options.slurmWatch === false) return;
    const refs: Array<SlurmJobRef & { nodeId: string }> = [];
    for (const [nodeId, node] of this.#nodes) {
      const job = node.state === 'up' ? slurmJobOf(node.registration) : undefined;
      if (job) refs.push({ id: job, node: node.registration.slurm?.nodeName, nodeId });
    }
    if (refs.length === 0) return;
    this.#slurmAsking = true;
    try {
      const options = this.#options.slurmWatch || {};
      const gone = await goneSlurmJobs(refs, { ...(options.squeue ? { squeue: options.squeue } : {}), ...(options.env ? { env: options.env } : {}) });
      if (this.#slurmSilent) this.logger.warn('Slurm answers about node jobs again');
      this.#slurmSilent = false;
      let released = 0;
      for (const { id, nodeId } of gone) {
        const node = this.#nodes.get(nodeId);
        if (node?.state !== 'up' || slurmJobOf(node.registration) !== id) continue; // gone, or registered again from another job meanwhile
        this.#goneRuns.add(slurmRunOf(node.registration)!);
        released += await this.#lose(nodeId, node, `Slurm job ${id} is gone`);
      }
      if (released > 0) this.#workArrived();
    } catch (error) {
      if ((error as { code?: unknown }).code === 'ENOENT') this.#slurmUnavailable = true;
      else if (!this.#slurmSilent) {
        // said once until Slurm answers again: nodes are lost by their heartbeats meanwhile
        this.#slurmSilent = true;
        this.logger.warn({ err: error }, 'asking Slurm about node jobs failed; nodes are lost only by their node timeout until it answers');
      }
    } finally {
      this.#slurmAsking = false;
    }
  }

  /** Forgets what a node held (its policy callers freed). */
  #dropRemote(nodeId: string): void {
    for (const [id, lease] of this.#remote) if (lease.nodeId === nodeId) this.#forgetRemote(id);
  }

  /** Forgets a lease to a node (its policy caller freed). */
  #forgetRemote(rolloutId: string, nodeId?: string): void {
    const lease = this.#remote.get(rolloutId);
    if (!lease || (nodeId !== undefined && lease.nodeId !== nodeId)) return;
    this.#remote.delete(rolloutId);
    if (lease.caller) this.#options.models.release(rolloutId);
  }

  // ----- reading -----------------------------------------------------------------------------

  /** A rollout's state as the API shows it: the stage it is in, or its result. */
  async get(id: string): Promise<RolloutView | undefined> {
    const rollout = await this.store.getRollout(id);
    if (!rollout) return undefined;
    return this.#view(rollout);
  }

  /** A rollout's view; `known`: its result when the caller has read it already (null: it has none). */
  async #view(rollout: StoredRollout, known?: RolloutResult | null): Promise<RolloutView> {
    if (rollout.state === 'done' || rollout.state === 'failed' || rollout.state === 'cancelled') {
      const result = known === undefined ? ((await this.store.getResult(rollout.id)) ?? null) : known;
      const env = result?.env ?? (await this.#taskEnv(rollout.taskId)) ?? '';
      return { id: rollout.id, task_id: rollout.taskId, sample_index: rollout.sampleIndex, env, state: result?.state ?? rollout.state, active: false, result };
    }
    const env = (await this.#taskEnv(rollout.taskId)) ?? '';
    const base = { id: rollout.id, task_id: rollout.taskId, sample_index: rollout.sampleIndex, env };
    const local = this.#runner.running(rollout.id);
    if (local) return { ...base, state: local.stage, active: local.active, result: null };
    if (rollout.state === 'leased') {
      const lease = this.#remote.get(rollout.id);
      const stage = lease && lease.nodeId === rollout.workerId ? lease.stage : 'queued';
      return { ...base, state: stage, active: stage !== 'queued', result: null };
    }
    return { ...base, state: 'queued', active: false, result: null };
  }

  /** Task envs, remembered (a task's env never changes). */
  readonly #envOfTask = new Map<string, string>();
  async #taskEnv(taskId: string): Promise<string | undefined> {
    const known = this.#envOfTask.get(taskId);
    if (known !== undefined) return known;
    const task = await this.store.getTask(taskId);
    if (!task) return undefined;
    if (this.#envOfTask.size > 100_000) this.#envOfTask.clear();
    this.#envOfTask.set(taskId, task.task.env);
    return task.task.env;
  }

  /** The rollout ids of a task, if it is known. */
  async taskRollouts(taskId: string): Promise<string[] | undefined> {
    return (await this.store.getTask(taskId))?.rolloutIds;
  }

  /** A finished rollout's result, if it has one. */
  result(id: string): Promise<RolloutResult | undefined> {
    return this.store.getResult(id);
  }

  /** The results of those of `ids` that have finished, by id. */
  results(ids: readonly string[]): Promise<Map<string, RolloutResult>> {
    return this.store.getResults(ids);
  }

  /** Rollouts in submission order, after `cursor` (an opaque position), at most `limit`. */
  async list(options: { cursor?: string; limit?: number; state?: RolloutState; taskId?: string } = {}): Promise<{ items: RolloutView[]; nextCursor: string | null }> {
    const limit = Math.min(Math.max(options.limit ?? 100, 1), 1_000);
    const stage = options.state === 'init' || options.state === 'run' || options.state === 'eval' || options.state === 'queued' ? options.state : undefined;
    const storeState: StoreRolloutState | readonly StoreRolloutState[] | undefined = stage ? ['queued', 'leased'] : (options.state as 'done' | 'failed' | 'cancelled' | undefined);
    const items: RolloutView[] = [];
    let cursor: string | null = options.cursor ?? null;
    do {
      const page = await this.store.listRollouts({ cursor, limit: limit - items.length, ...(storeState ? { state: storeState } : {}), ...(options.taskId !== undefined ? { taskId: options.taskId } : {}) });
      // the page's results in one query, not one per rollout
      const results = await this.store.getResults(page.items.filter((r) => r.state !== 'queued' && r.state !== 'leased').map((r) => r.id));
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
      const [rollout, stored] = await Promise.all([this.store.getRollout(id), this.store.getResult(id)]);
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
      const rollout = await this.store.getRollout(id);
      if (!rollout) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout "${id}"` });
      if (rollout.state === 'done' || rollout.state === 'failed' || rollout.state === 'cancelled') return this.#view(rollout);
      if (this.#runner.abort(id)) return this.#view(rollout);
      if (rollout.state === 'leased') {
        // on a node: it aborts at its next heartbeat and commits the cancelled result
        this.#cancelRequests.add(id);
        return this.#view(rollout);
      }
      const result = await this.#endedResult(rollout, { state: 'cancelled', code: 'CANCELLED', message: 'rollout cancelled' });
      // queued: held by no one, which only the service's own commit may end
      const status = await this.#commit(LOCAL, rollout.attempt, result, undefined, rollout.state === 'queued');
      if (status === 'committed' || status === 'duplicate' || tries >= 5) return (await this.get(id))!;
      // claimed in between: look again
    }
  }

  /** The result of a rollout that ends without running (cancelled while queued, or out of attempts). */
  async #endedResult(rollout: { id: string; taskId: string; sampleIndex: number }, how: { state: 'cancelled' | 'failed'; code: RolloutError['code']; message: string }): Promise<RolloutResult> {
    const task = await this.store.getTask(rollout.taskId);
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
      ...(task?.task.metadata ? { metadata: task.task.metadata } : {}),
      finished_at: new Date().toISOString(),
    };
  }

  /**
   * Work handed out again and again (its node died or lost its lease each time: a rollout that
   * brings its node down, say) ends failed after `maxAttempts` instead of going round for ever;
   * work cancelled while a lost node held it ends cancelled. Returns the claims to run.
   */
  async #withinAttempts<T extends { id: string; taskId: string; sampleIndex: number; attempt: number; task: RolloutTask }>(workerId: string, claimed: T[]): Promise<T[]> {
    const max = this.#options.maxAttempts ?? 5;
    const runnable: T[] = [];
    for (const work of claimed) {
      if (this.#cancelRequests.has(work.id)) {
        // cancelled while its node held it, then the node was lost: it ends here, cancelled
        await this.#commit(workerId, work.attempt, await this.#endedResult(work, { state: 'cancelled', code: 'CANCELLED', message: 'rollout cancelled' }), work.task.n);
        continue;
      }
      if (work.attempt <= max) {
        runnable.push(work);
        continue;
      }
      const result = await this.#endedResult(work, { state: 'failed', code: 'UNAVAILABLE', message: `rollout lost its worker ${work.attempt - 1} times (a node died, or its lease ran out, each time); not tried again after ${max} attempts` });
      this.logger.warn({ rollout: work.id, attempts: work.attempt - 1 }, 'rollout out of attempts: failed');
      await this.#commit(workerId, work.attempt, result, work.task.n);
    }
    return runnable;
  }

  /** Calls `listener` with every result as it completes; returns the unsubscribe function. */
  onResult(listener: (result: RolloutResult) => void): () => void {
    this.#events.on('result', listener);
    return () => this.#events.off('result', listener);
  }

  status(): {
    stages: Record<StageName, { queued: number; active: number; pool: number }>;
    rollouts: { total: number; done: number; failed: number; cancelled: number; in_flight: number };
    live_sessions: number;
    live_sandboxes: number;
    nodes: number;
  } {
    const local = this.#runner.status();
    const finished = this.#counts.done + this.#counts.failed + this.#counts.cancelled;
    const inFlight = Math.max(0, this.#counts.total - finished);
    // waiting in the store for a slot here or on a node
    local.stages.init.queued += Math.max(0, inFlight - this.#local.size - this.#remote.size);
    return { stages: local.stages, rollouts: { ...this.#counts, in_flight: inFlight }, live_sessions: local.live_sessions, live_sandboxes: local.live_sandboxes, nodes: this.#nodesUp() };
  }

  // ----- rollout nodes (NodeCoordinator) -----------------------------------------------------

  /** Registrations one at a time: two for one id never both take it. */
  #registrations: Promise<unknown> = Promise.resolve();

  registerNode(registration: NodeRegistration, credential?: string): Promise<NodeRegistered> {
    const registered = this.#registrations.then(() => this.#register(registration, credential));
    this.#registrations = registered.catch(() => undefined);
    return registered;
  }

  async #register(registration: NodeRegistration, credential: string | undefined): Promise<NodeRegistered> {
    if (this.#closed) throw unavailable();
    const { nodeId } = registration;
    if (isReservedNodeId(nodeId)) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `node_id: "${nodeId}" is reserved (the service's own worker id); choose another` });
    }
    const missing = this.environments.filter((name) => !registration.environments.includes(name));
    if (missing.length > 0) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `node "${nodeId}" does not serve environment${missing.length === 1 ? '' : 's'} ${missing.join(', ')} that the service does` });
    }
    const run = slurmRunOf(registration);
    if (run && this.#goneRuns.has(run)) {
      throw new RolloutError({ code: 'CONFLICT', message: `node "${nodeId}" belongs to a run of Slurm job ${slurmJobOf(registration)} that Slurm reported gone: this process should exit (a requeued job starts a new node)` });
    }
    const known = this.#nodes.get(nodeId);
    const stored = known?.credentialHash ?? (await this.store.getNodeCredential(nodeId))?.credentialHash;
    let hash = stored;
    if (!credentialFits(credential, stored)) {
      // Without its credential, an id in use (a node up, or holding leases from before a restart) is not taken over.
      if (known?.state === 'up') {
        throw new RolloutError({
          code: 'CONFLICT',
          message: `node id "${nodeId}" is in use by a live node: registering again under it needs that node's credential (or wait until the node is lost, ${this.#nodeTimeoutMs} ms without a heartbeat)`,
        });
      }
      credential = randomBytes(32).toString('base64url');
      hash = hashCredential(credential);
      await this.store.putNodeCredential({ nodeId, credentialHash: hash, issuedAt: Date.now() });
    }
    const now = Date.now();
    // the same object when known: a claim of it still open counts itself out of that one
    const state: NodeState = known ?? { registration, registeredAt: now, lastSeen: now, state: 'up', committed: 0, claims: 0, lastClaimAt: 0 };
    Object.assign(state, { registration, lastSeen: now, state: 'up', credentialHash: hash! });
    delete state.lostReason;
    this.#nodes.set(nodeId, state);
    this.logger.info({ node: nodeId, host: registration.host, capacity: registration.capacity, slurm: registration.slurm }, known ? 'node registered again' : 'node registered');
    return { nodeId, credential: credential!, leaseMs: this.#leaseMs, heartbeatMs: this.#heartbeatMs, nodeTimeoutMs: this.#nodeTimeoutMs };
  }

  /**
   * The node a call comes from, authenticated: registered (a placeholder from before a restart
   * must register again first), and with its credential. Not yet whether it is lost.
   */
  #node({ nodeId, credential }: NodeAuth): NodeState {
    const node = this.#nodes.get(nodeId);
    if (!node || node.state === 'left' || node.registration.maxRollouts === 0) throw notFoundNode(nodeId);
    if (!credentialFits(credential, node.credentialHash)) throw badCredential(nodeId);
    return node;
  }

  async heartbeat(auth: NodeAuth, given: readonly NodeLease[]): Promise<HeartbeatAnswer> {
    if (this.#closed) throw unavailable();
    const node = this.#node(auth);
    const { nodeId } = auth;
    const max = node.registration.maxRollouts;
    if (given.length > max) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `leases: a heartbeat carries at most the node's max_rollouts (${max}) leases, not ${given.length}` });
    }
    // one entry per rollout (the last one given)
    const leases = [...new Map(given.map((lease) => [lease.rolloutId, lease])).values()];
    if (node.state === 'lost') {
      // declared lost: its work was re-issued. It hears so, and must register again.
      return { renewed: [], lost: leases.map((lease) => lease.rolloutId), cancel: [] };
    }
    node.lastSeen = Date.now();
    // a lease past its life is not renewed: it runs out, and its rollout is re-issued
    const now = Date.now();
    const overdue = leases.filter((lease) => {
      const known = this.#remote.get(lease.rolloutId);
      return known?.nodeId === nodeId && known.attempt === lease.attempt && known.renewUntil !== undefined && now > known.renewUntil;
    });
    const late = new Set(overdue);
    const renewable = overdue.length === 0 ? leases : leases.filter((lease) => !late.has(lease));
    if (overdue.length > 0) {
      const released = await this.store.releaseLeases(nodeId, overdue);
      for (const id of released) this.#forgetRemote(id, nodeId);
      this.logger.warn({ node: nodeId, rollouts: released }, "leases held past their life (3× their task's time limit) without a commit: re-queued");
      if (released.length > 0) this.#workArrived();
    }
    const { renewed, lost } = await this.store.renewLeases(nodeId, renewable.map(({ rolloutId, attempt }) => ({ rolloutId, attempt })), this.#leaseMs);
    const reported = new Map(leases.map((lease) => [lease.rolloutId, lease]));
    for (const id of renewed) {
      const { attempt, stage } = reported.get(id)!;
      const lease = this.#remote.get(id);
      if (lease?.nodeId === nodeId && lease.attempt === attempt) lease.stage = stage;
      else this.#remote.set(id, { nodeId, attempt, stage }); // held from before a restart of the service
    }
    for (const id of lost) this.#forgetRemote(id, nodeId);
    const cancel = renewed.filter((id) => this.#cancelRequests.has(id));
    return { renewed, lost: [...lost, ...overdue.map((lease) => lease.rolloutId)], cancel };
  }

  async claimForNode(auth: NodeAuth, limit: number, waitMs: number, signal?: AbortSignal): Promise<NodeClaim[]> {
    const { nodeId } = auth;
    const first = this.#node(auth);
    if (limit > first.registration.maxRollouts) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `limit: a claim asks for at most the node's max_rollouts (${first.registration.maxRollouts}), not ${limit}` });
    }
    const until = Date.now() + Math.max(0, waitMs);
    first.claims++;
    try {
      for (;;) {
        if (this.#closed) throw unavailable();
        const node = this.#node(auth);
        if (node.state === 'lost') throw notFoundNode(nodeId);
        node.lastSeen = Date.now();
        // at most its free capacity, as the service counts its leases
        const room = Math.min(limit, node.registration.maxRollouts - this.#heldBy(nodeId));
        const claimed = room > 0 ? await this.#withinAttempts(nodeId, await this.store.claim({ workerId: nodeId, limit: room, leaseMs: this.#leaseMs })) : [];
        if (claimed.length > 0) {
          const now = Date.now();
          for (const work of claimed) {
            const { taskId, sampleIndex } = work;
            this.#remote.set(work.id, { nodeId, attempt: work.attempt, stage: 'queued', policy: work.task.policy, n: work.task.n, renewUntil: now + leaseLifeMs(work.task), taskId, sampleIndex });
          }
          return claimed.map((work) => ({ rolloutId: work.id, taskId: work.taskId, sampleIndex: work.sampleIndex, attempt: work.attempt, leaseExpiresAt: work.leaseExpiresAt, task: work.task }));
        }
        const left = until - Date.now();
        if (left <= 0 || signal?.aborted) return [];
        await sleepUntilWoken(Math.min(left, this.#heartbeatMs), this.#claimWakers, signal);
      }
    } finally {
      first.claims = Math.max(0, first.claims - 1);
      first.lastClaimAt = Date.now();
    }
  }

  async commitFromNode(auth: NodeAuth, commits: readonly NodeCommit[]): Promise<NodeCommitStatus[]> {
    const node = this.#node(auth);
    const { nodeId } = auth;
    if (commits.length > node.registration.maxRollouts) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `results: a node commits at most its max_rollouts (${node.registration.maxRollouts}) results at once, not ${commits.length}` });
    }
    if (node.state === 'up') node.lastSeen = Date.now();
    for (const { rolloutId, result } of commits) {
      if (result.id !== rolloutId) throw new RolloutError({ code: 'UNPROCESSABLE', message: `result id "${result.id}" is not rollout "${rolloutId}"` });
      // (a rollout's task and sample are the store's: a result naming others would be stored under them)
      const lease = this.#remote.get(rolloutId);
      if (lease?.nodeId === nodeId && lease.taskId !== undefined && (result.task_id !== lease.taskId || result.sample_index !== lease.sampleIndex)) {
        throw new RolloutError({ code: 'UNPROCESSABLE', message: `result "${rolloutId}" names task "${result.task_id}" sample ${result.sample_index}; the rollout is task "${lease.taskId}" sample ${lease.sampleIndex}` });
      }
    }
    const outcomes: NodeCommitStatus[] = [];
    for (const { rolloutId, attempt, result } of commits) {
      const lease = this.#remote.get(rolloutId);
      // the store takes it only from this node's lease at this attempt (one statement)
      const status = await this.#commit(nodeId, attempt, result, lease?.nodeId === nodeId && lease.attempt === attempt ? lease.n : undefined);
      if (status === 'committed') node.committed++;
      outcomes.push(status);
    }
    return outcomes;
  }

  async modelTurn(auth: NodeAuth, call: NodeModelRequest, signal: AbortSignal): Promise<ModelTurn> {
    this.#node(auth);
    const { nodeId } = auth;
    const lease = await this.#remoteLease(nodeId, call.rolloutId, call.attempt);
    if (!lease?.policy) {
      throw new RolloutError({ code: 'CONFLICT', message: `node "${nodeId}" does not hold rollout "${call.rolloutId}" at attempt ${call.attempt}: its lease was lost` });
    }
    lease.caller ??= this.#options.models.forRollout(call.rolloutId, lease.policy);
    return lease.caller(call.request, signal);
  }

  /**
   * The lease a node holds on a rollout at `attempt`, with its policy. A lease from before a
   * restart of the service is known by the store: its policy is read from there, once.
   */
  async #remoteLease(nodeId: string, rolloutId: string, attempt: number): Promise<RemoteLease | undefined> {
    const known = this.#remote.get(rolloutId);
    if (known && (known.nodeId !== nodeId || known.attempt !== attempt)) return undefined;
    if (known?.policy) return known;
    if (this.#nodes.get(nodeId)?.state !== 'up') return undefined;
    const rollout = await this.store.getRollout(rolloutId);
    if (rollout?.state !== 'leased' || rollout.workerId !== nodeId || rollout.attempt !== attempt) return undefined;
    const task = await this.store.getTask(rollout.taskId);
    if (!task) return undefined;
    const lease: RemoteLease = { ...(this.#remote.get(rolloutId) ?? { nodeId, attempt, stage: 'run' }), policy: task.task.policy, n: task.task.n };
    lease.renewUntil ??= Date.now() + leaseLifeMs(task.task);
    this.#remote.set(rolloutId, lease);
    return lease;
  }

  async deregisterNode(auth: NodeAuth): Promise<{ released: number }> {
    const node = this.#node(auth);
    const { nodeId } = auth;
    if (node.state === 'lost') {
      // its work was re-issued when it was lost; it stays listed as lost, with why
      this.logger.info({ node: nodeId, reason: node.lostReason }, 'a lost node left');
      return { released: 0 };
    }
    node.state = 'left';
    const ids = await this.store.releaseWorker(nodeId);
    this.#dropRemote(nodeId);
    this.logger.info({ node: nodeId, released: ids.length }, 'node left');
    if (ids.length > 0 || this.#runsLocally()) this.#workArrived();
    return { released: ids.length };
  }

  nodes(): NodeView[] {
    const leases = new Map<string, number>();
    for (const lease of this.#remote.values()) leases.set(lease.nodeId, (leases.get(lease.nodeId) ?? 0) + 1);
    return [...this.#nodes.values()]
      .filter((node) => node.registration.maxRollouts > 0)
      .map((node) => ({
        ...node.registration,
        registeredAt: new Date(node.registeredAt).toISOString(),
        lastSeenAt: new Date(node.lastSeen).toISOString(),
        leases: leases.get(node.registration.nodeId) ?? 0,
        committed: node.committed,
        state: node.state,
        ...(node.lostReason ? { lostReason: node.lostReason } : {}),
      }));
  }

  /**
   * Stops accepting work and stops what the service runs itself, without storing results for it:
   * its leases are released, so the next start runs it again. Closes the store if it opened it.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const timer of this.#timers) clearInterval(timer);
    for (const wake of [...this.#claimWakers]) wake();
    await this.#submitting;
    // results that finished before the shutdown are stored; what it stops is not (it runs again)
    await Promise.allSettled([...this.#committing]);
    await this.#runner.close('service shutting down');
    await Promise.all([...this.#taskLocks.values()]);
    try {
      await this.store.releaseWorker(LOCAL);
    } catch (error) {
      this.logger.warn({ err: error }, 'releasing the service\'s own leases failed: they expire instead');
    }
    for (const [id, waiters] of this.#waiters) {
      this.#waiters.delete(id);
      for (const waiter of waiters) waiter.reject(unavailable());
    }
    if (this.#ownsStore) await this.store.close();
  }
}
