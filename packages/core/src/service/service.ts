import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { pino, type Logger } from 'pino';
import type { Environment } from '../spec/environment.ts';
import { importJournal } from '../store/import-journal.ts';
import { openStore } from '../store/open.ts';
import type { RetentionPolicy, RolloutStore } from '../store/types.ts';
import type { ModelTurn } from '../runner/agent-loop.ts';
import { createServiceMetrics, registerWeightMetrics, type ServiceMetrics } from '../runner/metrics.ts';
import { Weights, type PauseMode, type PauseOutcome, type WeightState } from '../llm/weights.ts';
import { RolloutError } from '../errors.ts';
import type {
  HeartbeatAnswer,
  NodeAuth,
  NodeClaim,
  NodeCommit,
  NodeCommitStatus,
  NodeCoordinator,
  NodeLease,
  NodeGeneration,
  NodeModelRequest,
  NodeRegistered,
  NodeRegistration,
  NodeUpcoming,
  NodeRoute,
  NodeRouteRequest,
  NodeView,
  NodeWeights,
} from '../protocol/nodes.ts';
import { RolloutRunner, type RolloutRunnerOptions, type StageName } from '../runner/runner.ts';
import type { RolloutResult, RolloutState, RolloutTaskInput, RolloutView } from '../protocol/rollout.ts';
import type { DynamicSampling } from '../protocol/sampling.ts';
import { Commits } from './commits.ts';
import { DynamicSampler, type Sampling, type Started } from './dynamic-sampling.ts';
import { Feed } from './feed.ts';
import { LOCAL, unavailable } from './lifecycle.ts';
import { Coordinator } from './node-coordinator.ts';
import { NodeRegistry } from './node-registry.ts';
import { NodeWatch } from './node-watch.ts';
import { Scheduler, type SubmittedTask } from './scheduler.ts';

export { STAGES, type ModelProvider, type StageName } from '../runner/runner.ts';
export type { SubmittedTask } from './scheduler.ts';
export type { Sampling } from './dynamic-sampling.ts';

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
   * Whether rollout nodes that can (they say `direct-backends`) send their policy turns to the
   * backends themselves, on routes the service hands them (least in flight and sticky per rollout,
   * as its own turns), instead of through the service. @default true (where the service routes turns: `models.route`)
   */
  directBackends?: boolean;
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


/** The store's key of the weight state (Weights.state()). */
const WEIGHTS_SETTING = 'weights';

/**
 * The rollout service: accepts tasks, keeps them, their leases and their results in a store
 * (results leave memory once stored), and has them run: by its own INIT/RUN/EVAL pools (a
 * RolloutRunner) while no rollout node is up, else by the nodes, which pull leased work (see
 * NodeCoordinator). A result commits only for the current attempt of its lease, so a retried or
 * late commit (a node that lost its lease) changes nothing: every rollout ends with one result.
 *
 * This class assembles the parts, each owning its own state: the Scheduler (submit, the pump,
 * the service's own runs), Commits (retries, batches, task locks, group credit), the nodes
 * (NodeRegistry, the Coordinator of their protocol, the NodeWatch for lost nodes and Slurm) and
 * the Feed (views, waits, result events, counts).
 */
export class RolloutService implements NodeCoordinator {
  readonly metrics: ServiceMetrics;
  readonly logger: Logger;
  readonly store: RolloutStore;
  readonly #ownsStore: boolean;
  readonly #options: RolloutServiceOptions;
  readonly #runner: RolloutRunner;
  readonly #envs = new Map<string, Environment<any, any, any>>();
  readonly #nodes: NodeRegistry;
  readonly #commits: Commits;
  readonly #scheduler: Scheduler;
  readonly #coordinator: Coordinator;
  readonly #watch: NodeWatch;
  readonly #feed: Feed;
  readonly #sampler: DynamicSampler;
  readonly #leaseMs: number;
  readonly #heartbeatMs: number;
  readonly #nodeTimeoutMs: number;
  /** The weight versions and the pause gate of the policy's turns (the model provider's), when it routes them itself. */
  readonly #weights: Weights | undefined;
  /** Changes of the weight state, one at a time (each stored before it is answered). */
  #weightsChange: Promise<unknown> = Promise.resolve();
  /** Greater after every change of the weight state (nodes calling backends themselves keep the greatest they hear of). */
  #weightsEpoch = Date.now();
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
    this.#weights = options.models.weights;
    this.metrics = createServiceMetrics(() => this.status());
    if (this.#weights) registerWeightMetrics(this.metrics.registry, this.#weights);
    this.#runner = new RolloutRunner({ ...options, logger: this.logger, metrics: this.metrics });
    const pools = this.#runner.capacity;
    const localLimit = options.localRollouts ?? (options.pipeline === 'serial' ? pools.run : pools.init + pools.run + pools.eval);
    const { logger } = this;
    const closed = () => this.#closed;
    this.#nodes = new NodeRegistry({ heartbeatMs: this.#heartbeatMs, release: (id) => options.models.release(id) });
    this.#commits = new Commits({
      store,
      logger,
      closed,
      finished: (result) => this.#finished(result),
      cancelRequested: (id) => this.#nodes.cancelRequested(id),
      newestWeights: () => this.#weights?.newest ?? null,
      ...(options.maxAttempts === undefined ? {} : { maxAttempts: options.maxAttempts }),
    });
    this.#feed = new Feed({ store, runner: this.#runner, nodes: this.#nodes, commits: this.#commits });
    this.#scheduler = new Scheduler({
      store,
      logger,
      closed,
      envs: this.#envs,
      runner: this.#runner,
      commits: this.#commits,
      nodes: this.#nodes,
      wakeClaims: () => this.#coordinator.wake(),
      added: (rollouts) => this.#feed.added(rollouts),
      runLocally: options.runLocally,
      localLimit,
      leaseMs: this.#leaseMs,
    });
    this.#sampler = new DynamicSampler({
      logger,
      store,
      submit: (tasks) => this.#scheduler.submit(tasks),
      results: (ids) => this.store.getResults(ids),
      onResult: (listener) => this.#feed.onResult(listener),
      cancel: (id) => this.#feed.cancel(id),
    });
    const workArrived = () => this.#scheduler.workArrived();
    this.#watch = new NodeWatch({
      store,
      logger,
      nodes: this.#nodes,
      closed,
      workArrived,
      pump: () => this.#scheduler.pump(),
      nodeTimeoutMs: this.#nodeTimeoutMs,
      nodeRetentionMs: options.nodeRetentionMs ?? 3_600_000,
      slurmWatch: options.slurmWatch,
    });
    this.#coordinator = new Coordinator({
      store,
      logger,
      nodes: this.#nodes,
      commits: this.#commits,
      models: options.models,
      closed,
      environments: this.environments,
      workArrived,
      runsLocally: () => this.#scheduler.runsLocally(),
      paused: () => this.#weights?.paused === true,
      weights: () => (this.#weights ? { state: this.#weights.state(), epoch: this.#weightsEpoch } : undefined),
      ...(options.directBackends === undefined ? {} : { direct: options.directBackends }),
      isGoneRun: (run) => this.#watch.isGoneRun(run),
      leaseMs: this.#leaseMs,
      heartbeatMs: this.#heartbeatMs,
      nodeTimeoutMs: this.#nodeTimeoutMs,
    });
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
    // A pause for a weight update outlives a restart (the trainer is still mid-update): what is
    // re-run waits at its first turn until the resume.
    const kept = this.#weights ? await this.store.getSetting(WEIGHTS_SETTING) : undefined;
    if (kept !== undefined) {
      this.#weights!.restore(kept as WeightState);
      this.#bumpWeightsEpoch();
    }
    const requeued = [...(await this.store.releaseWorker(LOCAL)), ...(await this.store.expireLeases())];
    if (this.#options.retention) await this.#prune();
    await this.#feed.recount();
    // Nodes holding leases from before a restart get a node timeout to come back, else their work is re-issued.
    const holders = await this.#nodes.restore(this.store);
    // their nodes get a node timeout to come back before the service runs anything itself
    if (holders > 0) this.#scheduler.holdUntil(Date.now() + this.#nodeTimeoutMs);
    // dynamic samplings go on where they were (their groups re-submitted: the stored ones start nothing)
    await this.#sampler.recover();
    const opened = { ...this.#feed.counts, rerun: requeued.length, nodes: holders };
    if (opened.total > 0) this.logger.info(opened, 'store opened');
    else this.logger.debug(opened, 'store opened (empty)');
    this.#timers.push(setInterval(() => void this.#watch.sweep(), this.#heartbeatMs).unref());
    if (this.#options.retention) this.#timers.push(setInterval(() => void this.#prune().then(() => this.#feed.recount()), this.#options.pruneEveryMs ?? 60_000).unref());
    this.#timers.push(setInterval(() => void this.#scheduler.renewLocal(), Math.max(1_000, Math.floor(this.#leaseMs / 3))).unref());
    if (this.#options.slurmWatch !== false) this.#timers.push(setInterval(() => void this.#watch.watchSlurm(), this.#options.slurmWatch?.everyMs ?? 5_000).unref());
    this.#scheduler.pump();
  }

  async #prune(): Promise<void> {
    try {
      const pruned = await this.store.prune(this.#options.retention);
      if (pruned.results > 0) this.logger.info(pruned, 'old results pruned');
    } catch (error) {
      this.logger.error({ err: error }, 'pruning results failed');
    }
  }

  /** A result is stored: its lease is done with, and its waiters and listeners hear of it. */
  #finished(result: RolloutResult): void {
    this.metrics.finished.inc({ state: result.state, critical_error: result.critical_error ?? 'none' });
    this.#nodes.finished(result.id);
    this.#feed.finished(result);
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
  submit(inputs: readonly RolloutTaskInput[]): Promise<SubmittedTask[]> {
    return this.#scheduler.submit(inputs);
  }

  /**
   * Dynamic sampling (DAPO): `inputs` are a pool whose tasks start in order until `options.groups`
   * groups are informative (or `max_groups` were tried); answers once the sampling (its whole pool)
   * and its first groups are stored, so a restart goes on with it. The whole pool is checked first,
   * as submit checks a batch.
   */
  async sample(inputs: readonly RolloutTaskInput[], options: DynamicSampling): Promise<{ sampling: Sampling; submitted: Started[]; existing: boolean }> {
    if (this.#closed) throw unavailable();
    const pool = this.#scheduler.validate(inputs).map((task) => (task.id ? task : { ...task, id: randomUUID() }));
    return this.#sampler.start(pool, options);
  }

  /** A dynamic sampling by id: running, or among the last 1,000 to end (kept in the store across restarts). */
  sampling(id: string): Promise<Sampling | undefined> {
    return this.#sampler.get(id);
  }

  /** Stops a dynamic sampling: nothing more starts and its running groups are cancelled. */
  stopSampling(id: string): Promise<Sampling | undefined> {
    return this.#sampler.stop(id);
  }

  /** Calls `listener` with every result as it completes; returns the unsubscribe function. */
  onResult(listener: (result: RolloutResult) => void): () => void {
    return this.#feed.onResult(listener);
  }

  status(): {
    stages: Record<StageName, { queued: number; active: number; pool: number }>;
    rollouts: { total: number; done: number; failed: number; cancelled: number; in_flight: number; drifted: number };
    live_sessions: number;
    live_sandboxes: number;
    nodes: number;
  } {
    const local = this.#runner.status();
    const counts = this.#feed.counts;
    const finished = counts.done + counts.failed + counts.cancelled;
    const inFlight = Math.max(0, counts.total - finished);
    // waiting in the store for a slot here or on a node
    local.stages.init.queued += Math.max(0, inFlight - this.#scheduler.running - this.#nodes.leases);
    // the keys in the order the API sends them
    return { stages: local.stages, rollouts: { ...counts, in_flight: inFlight, drifted: this.#feed.drifted }, live_sessions: local.live_sessions, live_sandboxes: local.live_sandboxes, nodes: this.#nodes.up() };
  }

  // ----- weight versions and pauses for weight updates (asynchronous RL) ----------------------

  /** The weight state: versions announced, the newest, the pause if any, and generations in flight. */
  weightState(): WeightState & { in_flight: number } {
    const weights = this.#requireWeights();
    return { ...weights.state(), in_flight: weights.inFlight };
  }

  /** The trainer's word that `backends` (all when none are named) serve `version` now; kept in the store. */
  announceWeights(version: number, backends?: readonly string[]): Promise<WeightState & { in_flight: number }> {
    const weights = this.#requireWeights();
    return this.#changeWeights((target) => target.announce(version, backends));
  }

  /**
   * Pauses generation for a weight update (see Weights.pause); answered once no generation is in
   * flight, the pause kept in the store first (a restart stays paused).
   */
  async pauseGeneration(mode: PauseMode): Promise<PauseOutcome & { state: WeightState }> {
    const weights = this.#requireWeights();
    const started = performance.now();
    let drained!: Promise<PauseOutcome>;
    await this.#changeWeights((target) => {
      const pausing = target.pause(mode);
      if (target === weights) drained = pausing;
    });
    const own = await drained;
    // and the nodes that call the backends themselves: each says it has heard of the pause and has nothing in flight
    const nodes = await this.#coordinator.drainDirect(this.#weightsEpoch);
    const outcome = nodes === 0 ? own : { ...own, in_flight: own.in_flight + nodes, aborted: own.aborted + (mode === 'abort' ? nodes : 0), drained_ms: performance.now() - started };
    this.logger.info(outcome, 'generation paused for a weight update');
    return { ...outcome, state: weights.state() };
  }

  /** Ends a pause: with a version, the update's (announced first); without, the old weights go on (the update failed). */
  async resumeGeneration(version?: number, backends?: readonly string[]): Promise<WeightState & { in_flight: number; paused_ms: number }> {
    const weights = this.#requireWeights();
    const since = weights.state().pause?.since;
    const state = await this.#changeWeights((target) => target.resume(version, backends));
    const pausedMs = since === undefined ? 0 : Math.max(0, Date.now() - Date.parse(since));
    // the pause was nobody's time: leases' lives move on by it
    this.#nodes.extendLeases(pausedMs);
    this.logger.info({ version: version ?? null, paused_ms: pausedMs }, 'generation resumed');
    return { ...state, paused_ms: pausedMs };
  }

  /** Whether generation is paused for a weight update. */
  get generationPaused(): boolean {
    return this.#weights?.paused === true;
  }

  /** The newest weight version announced (what staleness bounds measure against); null before any. */
  get newestWeightVersion(): number | null {
    return this.#weights?.newest ?? null;
  }

  /** The weight version a backend serves as announced (null: none announced, or no weight versions here). */
  weightVersionOf(backendId: string): number | null {
    return this.#weights?.versionOf(backendId) ?? null;
  }

  #bumpWeightsEpoch(): void {
    this.#weightsEpoch = Math.max(this.#weightsEpoch + 1, Date.now());
  }

  #requireWeights(): Weights {
    if (!this.#weights) throw new RolloutError({ code: 'NOT_FOUND', message: 'this service does not route the policy\'s turns (no weight versions)' });
    return this.#weights;
  }

  /**
   * Stores a change of the weight state, then applies it; changes run one at a time. Stored
   * first: a change the store could not take fails and changes nothing (a resume that failed
   * leaves generation paused, as the store says), and a restart finds what was last answered.
   */
  #changeWeights(change: (target: Weights) => void): Promise<WeightState & { in_flight: number }> {
    const weights = this.#weights!;
    const run = this.#weightsChange.then(async () => {
      // the change on a copy first (it validates, and gives the state to store)
      const next = new Weights();
      next.restore(weights.state());
      change(next);
      await this.store.putSetting(WEIGHTS_SETTING, next.state());
      change(weights);
      this.#bumpWeightsEpoch();
      return { ...weights.state(), in_flight: weights.inFlight };
    });
    this.#weightsChange = run.catch(() => undefined);
    return run;
  }

  // ----- rollout nodes (NodeCoordinator) -----------------------------------------------------

  registerNode(registration: NodeRegistration, credential?: string, features?: readonly string[]): Promise<NodeRegistered> {
    return this.#coordinator.registerNode(registration, credential, features);
  }

  heartbeat(auth: NodeAuth, given: readonly NodeLease[], generation?: NodeGeneration): Promise<HeartbeatAnswer> {
    return this.#coordinator.heartbeat(auth, given, generation);
  }

  route(auth: NodeAuth, call: NodeRouteRequest, signal: AbortSignal): Promise<NodeRoute> {
    return this.#coordinator.route(auth, call, signal);
  }

  weightsFor(nodeId: string): NodeWeights | undefined {
    return this.#coordinator.weightsFor(nodeId);
  }

  claimForNode(auth: NodeAuth, limit: number, waitMs: number, signal?: AbortSignal): Promise<NodeClaim[]> {
    return this.#coordinator.claimForNode(auth, limit, waitMs, signal);
  }

  upcomingForNode(auth: NodeAuth, limit: number): Promise<NodeUpcoming[]> {
    return this.#coordinator.upcomingForNode(auth, limit);
  }

  commitFromNode(auth: NodeAuth, commits: readonly NodeCommit[]): Promise<NodeCommitStatus[]> {
    return this.#coordinator.commitFromNode(auth, commits);
  }

  modelTurn(auth: NodeAuth, call: NodeModelRequest, signal: AbortSignal): Promise<ModelTurn> {
    return this.#coordinator.modelTurn(auth, call, signal);
  }

  deregisterNode(auth: NodeAuth): Promise<{ released: number }> {
    return this.#coordinator.deregisterNode(auth);
  }

  nodes(): NodeView[] {
    return this.#coordinator.nodes();
  }

  // ----- reading -----------------------------------------------------------------------------

  /** A rollout's state as the API shows it: the stage it is in, or its result. */
  get(id: string): Promise<RolloutView | undefined> {
    return this.#feed.get(id);
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
  list(options: { cursor?: string; limit?: number; state?: RolloutState; taskId?: string } = {}): Promise<{ items: RolloutView[]; nextCursor: string | null }> {
    return this.#feed.list(options);
  }

  /** Resolves with the rollout's result once it is finished. */
  wait(id: string): Promise<RolloutResult> {
    return this.#feed.wait(id);
  }

  /** Cancels a rollout: it leaves its queue or stage, its session and sandbox are freed. */
  cancel(id: string): Promise<RolloutView> {
    return this.#feed.cancel(id);
  }

  /**
   * Stops accepting work and stops what the service runs itself, without storing results for it:
   * its leases are released, so the next start runs it again. Closes the store if it opened it.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const sampler = this.#sampler.close();
    for (const timer of this.#timers) clearInterval(timer);
    this.#coordinator.wake();
    await this.#scheduler.submitted();
    await sampler;
    // results that finished before the shutdown are stored; what it stops is not (it runs again)
    await this.#commits.settleOwn();
    await this.#runner.close('service shutting down');
    await this.#commits.settleLocks();
    try {
      await this.store.releaseWorker(LOCAL);
    } catch (error) {
      this.logger.warn({ err: error }, 'releasing the service\'s own leases failed: they expire instead');
    }
    this.#feed.close(unavailable);
    if (this.#ownsStore) await this.store.close();
  }
}
