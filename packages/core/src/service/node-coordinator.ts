import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import type { WeightState } from '../llm/weights.ts';
import {
  DIRECT_BACKENDS_FEATURE,
  isReservedNodeId,
  type HeartbeatAnswer,
  type NodeAuth,
  type NodeClaim,
  type NodeGeneration,
  type NodeCommit,
  type NodeCommitStatus,
  type NodeCoordinator,
  type NodeLease,
  type NodeModelRequest,
  type NodeRegistered,
  type NodeRegistration,
  type NodeUpcoming,
  type NodeRoute,
  type NodeRouteRequest,
  type NodeView,
  type NodeWeights,
} from '../protocol/nodes.ts';
import type { ModelTurn } from '../runner/agent-loop.ts';
import type { ModelProvider } from '../runner/runner.ts';
import { slurmJobOf, slurmRunOf } from '../slurm/watch.ts';
import type { RolloutStore } from '../store/types.ts';
import type { Commits } from './commits.ts';
import { unavailable } from './lifecycle.ts';
import { credentialFits, hashCredential, leaseLifeMs, notFoundNode, type NodeRegistry, type NodeState, type RemoteLease } from './node-registry.ts';

export interface CoordinatorOptions {
  store: RolloutStore;
  logger: Logger;
  nodes: NodeRegistry;
  commits: Pick<Commits, 'commit' | 'withinAttempts'>;
  models: Pick<ModelProvider, 'forRollout' | 'release' | 'route' | 'backendIds'>;
  /**
   * The weight state and its epoch (greater after every change), where the service routes turns
   * itself: then nodes that say DIRECT_BACKENDS_FEATURE are handed routes (unless `direct` is false).
   */
  weights?: () => { state: WeightState; epoch: number } | undefined;
  /** Whether nodes may call the backends themselves (see DIRECT_BACKENDS_FEATURE). @default true */
  direct?: boolean;
  closed: () => boolean;
  /** Names of the environments the service serves (a node must serve them all). */
  environments: readonly string[];
  /** Work went back to the queue: the service's pools and waiting claims take it. */
  workArrived: () => void;
  /** Whether the service runs rollouts itself now (see RolloutServiceOptions.runLocally). */
  runsLocally: () => boolean;
  /** Whether generation is paused for a weight update (no lease is overdue then). */
  paused?: () => boolean;
  /** Whether Slurm reported a run of a job gone (see NodeWatch). */
  isGoneRun: (run: string) => boolean;
  leaseMs: number;
  heartbeatMs: number;
  nodeTimeoutMs: number;
}

/** A lease as the store names it. */
const storeLease = ({ rollout_id, attempt }: NodeLease) => ({ rolloutId: rollout_id, attempt });

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
 * The service's side of the node protocol (what the node routes call): registration with a
 * credential, heartbeats renewing leases, claims as long polls, commits, and policy turns
 * through the service's backend pool.
 */
export class Coordinator implements NodeCoordinator {
  readonly #store: RolloutStore;
  readonly #logger: Logger;
  readonly #nodes: NodeRegistry;
  readonly #commits: CoordinatorOptions['commits'];
  readonly #models: CoordinatorOptions['models'];
  readonly #weights: CoordinatorOptions['weights'];
  readonly #direct: boolean;
  /** A pause waiting for nodes calling backends themselves to drain (woken by their heartbeats). */
  readonly #drainWakers = new Set<() => void>();
  readonly #closed: () => boolean;
  readonly #environments: readonly string[];
  readonly #workArrived: () => void;
  readonly #runsLocally: () => boolean;
  readonly #paused: () => boolean;
  readonly #isGoneRun: (run: string) => boolean;
  readonly #leaseMs: number;
  readonly #heartbeatMs: number;
  readonly #nodeTimeoutMs: number;
  /** Node claims waiting for work. */
  readonly #claimWakers = new Set<() => void>();
  /** Registrations one at a time: two for one id never both take it. */
  #registrations: Promise<unknown> = Promise.resolve();

  constructor(options: CoordinatorOptions) {
    this.#store = options.store;
    this.#logger = options.logger;
    this.#nodes = options.nodes;
    this.#commits = options.commits;
    this.#models = options.models;
    this.#weights = options.weights;
    this.#direct = options.direct !== false && options.models.route !== undefined && options.models.backendIds !== undefined && options.weights?.() !== undefined;
    this.#closed = options.closed;
    this.#environments = options.environments;
    this.#workArrived = options.workArrived;
    this.#runsLocally = options.runsLocally;
    this.#paused = options.paused ?? (() => false);
    this.#isGoneRun = options.isGoneRun;
    this.#leaseMs = options.leaseMs;
    this.#heartbeatMs = options.heartbeatMs;
    this.#nodeTimeoutMs = options.nodeTimeoutMs;
  }

  /** Wakes the node claims waiting for work (work arrived, or the service is closing). */
  wake(): void {
    for (const wake of [...this.#claimWakers]) wake();
  }

  registerNode(registration: NodeRegistration, credential?: string, features: readonly string[] = []): Promise<NodeRegistered> {
    const registered = this.#registrations.then(() => this.#register(registration, credential, this.#direct && features.includes(DIRECT_BACKENDS_FEATURE)));
    this.#registrations = registered.catch(() => undefined);
    return registered;
  }

  async #register(registration: NodeRegistration, credential: string | undefined, direct: boolean): Promise<NodeRegistered> {
    if (this.#closed()) throw unavailable();
    const { node_id: nodeId } = registration;
    if (isReservedNodeId(nodeId)) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `node_id: "${nodeId}" is reserved (the service's own worker id); choose another` });
    }
    const missing = this.#environments.filter((name) => !registration.environments.includes(name));
    if (missing.length > 0) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `node "${nodeId}" does not serve environment${missing.length === 1 ? '' : 's'} ${missing.join(', ')} that the service does` });
    }
    const run = slurmRunOf(registration);
    if (run && this.#isGoneRun(run)) {
      throw new RolloutError({ code: 'CONFLICT', message: `node "${nodeId}" belongs to a run of Slurm job ${slurmJobOf(registration)} that Slurm reported gone: this process should exit (a requeued job starts a new node)` });
    }
    const known = this.#nodes.get(nodeId);
    const stored = known?.credentialHash ?? (await this.#store.getNodeCredential(nodeId))?.credentialHash;
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
      await this.#store.putNodeCredential({ nodeId, credentialHash: hash, issuedAt: Date.now() });
    }
    const now = Date.now();
    // the same object when known: a claim of it still open counts itself out of that one
    const state: NodeState = known ?? { registration, registeredAt: now, lastSeen: now, state: 'up', committed: 0, claims: 0, lastClaimAt: 0 };
    Object.assign(state, { registration, lastSeen: now, state: 'up', credentialHash: hash! });
    delete state.lostReason;
    delete state.generation;
    if (direct) state.direct = true;
    else delete state.direct;
    this.#nodes.set(nodeId, state);
    this.#logger.info({ node: nodeId, host: registration.host, capacity: registration.capacity, slurm: registration.slurm }, known ? 'node registered again' : 'node registered');
    const answer: NodeRegistered = { node_id: nodeId, credential: credential!, lease_ms: this.#leaseMs, heartbeat_ms: this.#heartbeatMs, node_timeout_ms: this.#nodeTimeoutMs };
    return direct ? { ...answer, features: [DIRECT_BACKENDS_FEATURE], weights: this.#nodeWeights()! } : answer;
  }

  /** The weight state as a node calling backends itself reads it. */
  #nodeWeights(): NodeWeights | undefined {
    const weights = this.#weights?.();
    if (!weights) return undefined;
    const { state, epoch } = weights;
    return { epoch, newest: state.newest, default: state.default, versions: state.backends, pause: state.pause, backends: this.#models.backendIds?.() ?? [] };
  }

  /** The weight state for `nodeId` when it calls backends itself (else undefined: it reads none). */
  weightsFor(nodeId: string): NodeWeights | undefined {
    return this.#nodes.get(nodeId)?.direct ? this.#nodeWeights() : undefined;
  }

  /**
   * Waits until every node up that calls backends itself has said (with a heartbeat) that it has
   * heard of the weight state of `epoch` or later, is paused and has no generation in flight (or
   * the pause ended, or the node is gone). Answers how many generations they had in flight when
   * they heard of it.
   */
  async drainDirect(epoch: number): Promise<number> {
    const direct = () => [...this.#nodes.entries()].filter(([, node]) => node.state === 'up' && node.direct);
    const heard = () => direct().reduce((sum, [, { generation: g }]) => sum + (g && g.epoch >= epoch && g.paused ? g.atPause : 0), 0);
    for (;;) {
      if (!this.#paused() || this.#closed()) return heard();
      const waiting = direct().filter(([, { generation: g }]) => !(g && g.epoch >= epoch && g.paused && g.inFlight === 0));
      if (waiting.length === 0) return heard();
      await sleepUntilWoken(this.#heartbeatMs, this.#drainWakers);
    }
  }

  async heartbeat(auth: NodeAuth, given: readonly NodeLease[], generation?: NodeGeneration): Promise<HeartbeatAnswer> {
    if (this.#closed()) throw unavailable();
    const node = this.#nodes.auth(auth);
    const { node_id: nodeId } = auth;
    const max = node.registration.max_rollouts;
    if (given.length > max) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `leases: a heartbeat carries at most the node's max_rollouts (${max}) leases, not ${given.length}` });
    }
    // one entry per rollout (the last one given)
    const leases = [...new Map(given.map((lease) => [lease.rollout_id, lease])).values()];
    if (node.state === 'lost') {
      // declared lost: its work was re-issued. It hears so, and must register again.
      return { renewed: [], lost: leases.map((lease) => lease.rollout_id), cancel: [] };
    }
    node.lastSeen = Date.now();
    if (node.direct && generation) {
      node.generation = { epoch: generation.epoch, paused: generation.paused, inFlight: generation.in_flight, atPause: generation.in_flight_at_pause };
      for (const wake of [...this.#drainWakers]) wake();
    }
    // a lease past its life is not renewed: it runs out, and its rollout is re-issued
    const now = Date.now();
    // while generation is paused for a weight update, rollouts wait through no fault of their own
    const overdue = this.#paused() ? [] : leases.filter((lease) => {
      const known = this.#nodes.lease(lease.rollout_id);
      return known?.nodeId === nodeId && known.attempt === lease.attempt && known.renewUntil !== undefined && now > known.renewUntil;
    });
    const late = new Set(overdue);
    const renewable = overdue.length === 0 ? leases : leases.filter((lease) => !late.has(lease));
    if (overdue.length > 0) {
      const released = await this.#store.releaseLeases(nodeId, overdue.map(storeLease));
      for (const id of released) this.#nodes.forgetLease(id, nodeId);
      this.#logger.warn({ node: nodeId, rollouts: released }, "leases held past their life (3× their task's time limit) without a commit: re-queued");
      if (released.length > 0) this.#workArrived();
    }
    const { renewed, lost } = await this.#store.renewLeases(nodeId, renewable.map(storeLease), this.#leaseMs);
    const reported = new Map(leases.map((lease) => [lease.rollout_id, lease]));
    for (const id of renewed) {
      const { attempt, stage } = reported.get(id)!;
      const lease = this.#nodes.lease(id);
      if (lease?.nodeId === nodeId && lease.attempt === attempt) lease.stage = stage;
      else this.#nodes.setLease(id, { nodeId, attempt, stage }); // held from before a restart of the service
    }
    for (const id of lost) this.#nodes.forgetLease(id, nodeId);
    const cancel = renewed.filter((id) => this.#nodes.cancelRequested(id));
    const answer: HeartbeatAnswer = { renewed, lost: [...lost, ...overdue.map((lease) => lease.rollout_id)], cancel };
    const weights = node.direct ? this.#nodeWeights() : undefined;
    return weights ? { ...answer, weights } : answer;
  }

  async claimForNode(auth: NodeAuth, limit: number, waitMs: number, signal?: AbortSignal): Promise<NodeClaim[]> {
    const { node_id: nodeId } = auth;
    const first = this.#nodes.auth(auth);
    if (limit > first.registration.max_rollouts) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `limit: a claim asks for at most the node's max_rollouts (${first.registration.max_rollouts}), not ${limit}` });
    }
    const until = Date.now() + Math.max(0, waitMs);
    first.claims++;
    try {
      for (;;) {
        if (this.#closed()) throw unavailable();
        const node = this.#nodes.auth(auth);
        if (node.state === 'lost') throw notFoundNode(nodeId);
        node.lastSeen = Date.now();
        // at most its free capacity, as the service counts its leases
        const room = Math.min(limit, node.registration.max_rollouts - this.#nodes.heldBy(nodeId));
        const claimed = room > 0 ? await this.#commits.withinAttempts(nodeId, await this.#store.claim({ workerId: nodeId, limit: room, leaseMs: this.#leaseMs })) : [];
        if (claimed.length > 0) {
          const now = Date.now();
          const answer: NodeClaim[] = [];
          for (const work of claimed) {
            const { taskId, sampleIndex } = work;
            const lease: RemoteLease = { nodeId, attempt: work.attempt, stage: 'queued', policy: work.task.policy, n: work.task.n, renewUntil: now + leaseLifeMs(work.task), taskId, sampleIndex };
            this.#nodes.setLease(work.id, lease);
            const claim: NodeClaim = { rollout_id: work.id, task_id: work.taskId, sample_index: work.sampleIndex, attempt: work.attempt, lease_expires_at: work.leaseExpiresAt, task: work.task };
            // a node calling backends itself gets the rollout's backend now, if one is healthy (else it asks when its first turn comes)
            const route = node.direct ? await this.#route(lease, work.id, {}) : undefined;
            answer.push(route ? { ...claim, route } : claim);
          }
          return answer;
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

  async upcomingForNode(auth: NodeAuth, limit: number): Promise<NodeUpcoming[]> {
    this.#nodes.auth(auth);
    // whichever node frees a slot first takes the head of the queue: the more nodes are up, the
    // likelier the hinted work goes elsewhere, so each is told less (the whole limit with one)
    const share = Math.max(1, Math.ceil(limit / Math.max(1, this.#nodes.up())));
    // a group's samples are one task: a page of rollouts a few groups deep, its first tasks
    const { items } = await this.#store.listRollouts({ state: 'queued', limit: Math.min(1_000, share * 64) });
    const taskIds = [...new Set(items.map((rollout) => rollout.taskId))].slice(0, share);
    const tasks = await Promise.all(taskIds.map((taskId) => this.#store.getTask(taskId)));
    return tasks.filter((stored) => stored !== undefined).map((stored) => ({ task_id: stored.id, task: stored.task }));
  }

  async commitFromNode(auth: NodeAuth, commits: readonly NodeCommit[]): Promise<NodeCommitStatus[]> {
    const node = this.#nodes.auth(auth);
    const { node_id: nodeId } = auth;
    if (commits.length > node.registration.max_rollouts) {
      throw new RolloutError({ code: 'UNPROCESSABLE', message: `results: a node commits at most its max_rollouts (${node.registration.max_rollouts}) results at once, not ${commits.length}` });
    }
    if (node.state === 'up') node.lastSeen = Date.now();
    for (const { rollout_id: rolloutId, result } of commits) {
      if (result.id !== rolloutId) throw new RolloutError({ code: 'UNPROCESSABLE', message: `result id "${result.id}" is not rollout "${rolloutId}"` });
      // (a rollout's task and sample are the store's: a result naming others would be stored under them)
      const lease = this.#nodes.lease(rolloutId);
      if (lease?.nodeId === nodeId && lease.taskId !== undefined && (result.task_id !== lease.taskId || result.sample_index !== lease.sampleIndex)) {
        throw new RolloutError({ code: 'UNPROCESSABLE', message: `result "${rolloutId}" names task "${result.task_id}" sample ${result.sample_index}; the rollout is task "${lease.taskId}" sample ${lease.sampleIndex}` });
      }
    }
    const outcomes: NodeCommitStatus[] = [];
    for (const { rollout_id: rolloutId, attempt, result } of commits) {
      const lease = this.#nodes.lease(rolloutId);
      // the store takes it only from this node's lease at this attempt (one statement)
      const status = await this.#commits.commit(nodeId, attempt, result, lease?.nodeId === nodeId && lease.attempt === attempt ? lease.n : undefined);
      if (status === 'committed') node.committed++;
      outcomes.push(status);
    }
    return outcomes;
  }

  async modelTurn(auth: NodeAuth, call: NodeModelRequest, signal: AbortSignal): Promise<ModelTurn> {
    this.#nodes.auth(auth);
    const { node_id: nodeId } = auth;
    const lease = await this.#remoteLease(nodeId, call.rollout_id, call.attempt);
    if (!lease?.policy) {
      throw new RolloutError({ code: 'CONFLICT', message: `node "${nodeId}" does not hold rollout "${call.rollout_id}" at attempt ${call.attempt}: its lease was lost` });
    }
    lease.caller ??= this.#models.forRollout(call.rollout_id, lease.policy);
    return lease.caller({ messages: call.messages, tools: call.tools }, signal);
  }

  /**
   * A route for a rollout a node holds and calls the backends for itself: asked when its claim
   * came without one, or when its backend failed (`failed`), was removed, or its lease is new.
   * Waits for a healthy backend as a turn at the service would.
   */
  async route(auth: NodeAuth, call: NodeRouteRequest, signal: AbortSignal): Promise<NodeRoute> {
    const node = this.#nodes.auth(auth);
    const { node_id: nodeId } = auth;
    if (!node.direct) {
      throw new RolloutError({ code: 'CONFLICT', message: `node "${nodeId}" did not register as one that calls the policy's backends itself (${DIRECT_BACKENDS_FEATURE}): its turns go through /model` });
    }
    const lease = await this.#remoteLease(nodeId, call.rollout_id, call.attempt);
    if (!lease?.policy) {
      throw new RolloutError({ code: 'CONFLICT', message: `node "${nodeId}" does not hold rollout "${call.rollout_id}" at attempt ${call.attempt}: its lease was lost` });
    }
    const route = await this.#route(lease, call.rollout_id, { failed: call.failed, wait: true, signal });
    if (!route) throw new RolloutError({ code: 'UNAVAILABLE', message: 'no healthy policy backend', retryable: true });
    // the lease may have ended while the route was waited for: its backend is not held for it then
    const current = this.#nodes.lease(call.rollout_id);
    if (current !== lease) {
      if (!current) this.#models.release(call.rollout_id);
      throw new RolloutError({ code: 'CONFLICT', message: `node "${nodeId}" does not hold rollout "${call.rollout_id}" at attempt ${call.attempt}: its lease was lost` });
    }
    return route;
  }

  /** The route of a leased rollout (its backend counted as held by it until the lease ends). */
  async #route(lease: RemoteLease, rolloutId: string, options: { failed?: string | undefined; wait?: boolean; signal?: AbortSignal }): Promise<NodeRoute | undefined> {
    lease.routed = true;
    const routed = await this.#models.route!(rolloutId, lease.policy!, options);
    if (!routed) return undefined;
    const { backend, headers } = routed;
    return {
      rollout_id: rolloutId,
      attempt: lease.attempt,
      backend: {
        id: backend.id,
        base_url: backend.baseUrl,
        ...(backend.model === undefined ? {} : { model: backend.model }),
        ...(backend.apiKey === undefined ? {} : { api_key: backend.apiKey }),
        ...(backend.maxConcurrency === undefined ? {} : { max_concurrency: backend.maxConcurrency }),
      },
      headers,
    };
  }

  /**
   * The lease a node holds on a rollout at `attempt`, with its policy. A lease from before a
   * restart of the service is known by the store: its policy is read from there, once.
   */
  async #remoteLease(nodeId: string, rolloutId: string, attempt: number): Promise<RemoteLease | undefined> {
    const known = this.#nodes.lease(rolloutId);
    if (known && (known.nodeId !== nodeId || known.attempt !== attempt)) return undefined;
    if (known?.policy) return known;
    if (this.#nodes.get(nodeId)?.state !== 'up') return undefined;
    const rollout = await this.#store.getRollout(rolloutId);
    if (rollout?.state !== 'leased' || rollout.workerId !== nodeId || rollout.attempt !== attempt) return undefined;
    const task = await this.#store.getTask(rollout.taskId);
    if (!task) return undefined;
    const lease: RemoteLease = { ...(this.#nodes.lease(rolloutId) ?? { nodeId, attempt, stage: 'run' }), policy: task.task.policy, n: task.task.n };
    lease.renewUntil ??= Date.now() + leaseLifeMs(task.task);
    this.#nodes.setLease(rolloutId, lease);
    return lease;
  }

  async deregisterNode(auth: NodeAuth): Promise<{ released: number }> {
    const node = this.#nodes.auth(auth);
    const { node_id: nodeId } = auth;
    if (node.state === 'lost') {
      // its work was re-issued when it was lost; it stays listed as lost, with why
      this.#logger.info({ node: nodeId, reason: node.lostReason }, 'a lost node left');
      return { released: 0 };
    }
    node.state = 'left';
    const ids = await this.#store.releaseWorker(nodeId);
    this.#nodes.dropNode(nodeId);
    this.#logger.info({ node: nodeId, released: ids.length }, 'node left');
    if (ids.length > 0 || this.#runsLocally()) this.#workArrived();
    return { released: ids.length };
  }

  nodes(): NodeView[] {
    return this.#nodes.views();
  }
}
