import { createHash, timingSafeEqual } from 'node:crypto';
import { RolloutError } from '../errors.ts';
import { NODE_CREDENTIAL_HEADER, type NodeAuth, type NodeLease, type NodeRegistration, type NodeView } from '../protocol/nodes.ts';
import type { RolloutTask } from '../protocol/rollout.ts';
import type { CallModel } from '../runner/agent-loop.ts';
import type { RolloutStore } from '../store/types.ts';

/**
 * A lease's life, from its claim, is at most this many times its task's limits (`init_timeout_s`
 * for INIT, `time_limit_s` for RUN and EVAL; plus twice that waiting for the node's stage slots):
 * past it, a heartbeat no longer renews
 * the lease, so a node that holds work without ever committing it cannot keep it.
 */
const LEASE_LIFE_PER_TIME_LIMIT = 3;

/** How long a lease may be renewed after its claim (see LEASE_LIFE_PER_TIME_LIMIT). */
export const leaseLifeMs = (task: RolloutTask) => LEASE_LIFE_PER_TIME_LIMIT * (task.limits.init_timeout_s + task.limits.time_limit_s) * 1000;

export interface NodeState {
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
  /** It sends its policy turns to the backends itself (DIRECT_BACKENDS_FEATURE), on routes the service hands it. */
  direct?: boolean;
  /** What its last heartbeat said of its generations (a node calling backends itself): a pause waits for them. */
  generation?: { epoch: number; paused: boolean; inFlight: number; atPause: number };
}

/**
 * A rollout leased to a node, as the service tracks it: the stage the node last reported, and
 * its policy caller. `policy` and `n` come with the claim; for a lease from before a restart of
 * the service they are read from the store when its first policy turn comes (see Coordinator's #remoteLease).
 */
export interface RemoteLease {
  nodeId: string;
  attempt: number;
  stage: NodeLease['stage'];
  policy?: RolloutTask['policy'];
  /** The task's samples. */
  n?: number;
  caller?: CallModel;
  /** Its node was handed a route (the rollout counts as its backend's load until the lease ends). */
  routed?: boolean;
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

export const notFoundNode = (nodeId: string) => new RolloutError({ code: 'NOT_FOUND', message: `no node "${nodeId}" (register again)` });
const badCredential = (nodeId: string) =>
  new RolloutError({ code: 'UNAUTHORIZED', message: `node "${nodeId}": a valid node credential is required (the ${NODE_CREDENTIAL_HEADER} header, as given at its registration)` });
export const hashCredential = (credential: string) => createHash('sha256').update(credential).digest('hex');

/** Whether `credential` hashes to `hash`, compared in constant time. */
export function credentialFits(credential: string | undefined, hash: string | undefined): boolean {
  if (credential === undefined || hash === undefined) return false;
  const given = Buffer.from(hashCredential(credential), 'hex');
  const kept = Buffer.from(hash, 'hex');
  return given.length === kept.length && timingSafeEqual(given, kept);
}

export interface NodeRegistryOptions {
  heartbeatMs: number;
  /** Frees a rollout's policy caller (ModelProvider.release). */
  release: (rolloutId: string) => void;
}

/**
 * The rollout nodes as the service knows them: who registered (and with which credential), the
 * leases each holds, and the cancels waiting for their holder's next heartbeat.
 */
export class NodeRegistry {
  readonly #heartbeatMs: number;
  readonly #release: (rolloutId: string) => void;
  readonly #nodes = new Map<string, NodeState>();
  /** Rollouts leased to nodes. */
  readonly #remote = new RemoteLeases();
  /** Cancels asked for rollouts leased to a node that has not heartbeaten since (delivered with its next heartbeat). */
  readonly #cancelRequests = new Set<string>();

  constructor(options: NodeRegistryOptions) {
    this.#heartbeatMs = options.heartbeatMs;
    this.#release = options.release;
  }

  get(nodeId: string): NodeState | undefined {
    return this.#nodes.get(nodeId);
  }

  set(nodeId: string, node: NodeState): void {
    this.#nodes.set(nodeId, node);
  }

  delete(nodeId: string): void {
    this.#nodes.delete(nodeId);
  }

  entries(): IterableIterator<[string, NodeState]> {
    return this.#nodes.entries();
  }

  /**
   * The node a call comes from, authenticated: registered (a placeholder from before a restart
   * must register again first), and with its credential. Not yet whether it is lost.
   */
  auth({ node_id: nodeId, credential }: NodeAuth): NodeState {
    const node = this.#nodes.get(nodeId);
    if (!node || node.state === 'left' || node.registration.max_rollouts === 0) throw notFoundNode(nodeId);
    if (!credentialFits(credential, node.credentialHash)) throw badCredential(nodeId);
    return node;
  }

  up(): number {
    let up = 0;
    for (const node of this.#nodes.values()) if (node.state === 'up' && node.registration.max_rollouts > 0) up++;
    return up;
  }

  /** Whether any node takes work now (see #takesWork). */
  anyTakesWork(now: number): boolean {
    for (const node of this.#nodes.values()) if (this.#takesWork(node, now)) return true;
    return false;
  }

  /**
   * Whether a node takes work: up, and asking for it (a claim open, or one answered within the
   * last few heartbeats: a node's claim loop asks again at once) or full (as many leases as its
   * capacity). A node that is up but never claims does not count, so it cannot stop the service
   * from running rollouts itself under `runLocally: 'auto'`.
   */
  #takesWork(node: NodeState, now: number): boolean {
    if (node.state !== 'up' || node.registration.max_rollouts === 0) return false;
    if (node.claims > 0 || now - node.lastClaimAt <= Math.max(5_000, 2 * this.#heartbeatMs)) return true;
    return this.heldBy(node.registration.node_id) >= node.registration.max_rollouts;
  }

  lease(rolloutId: string): RemoteLease | undefined {
    return this.#remote.get(rolloutId);
  }

  setLease(rolloutId: string, lease: RemoteLease): void {
    this.#remote.set(rolloutId, lease);
  }

  /** Moves every lease's life on by `ms` (a pause of generation: nobody's time). */
  extendLeases(ms: number): void {
    for (const lease of this.#remote.values()) if (lease.renewUntil !== undefined) lease.renewUntil += ms;
  }

  /** Leases to nodes, all told. */
  get leases(): number {
    return this.#remote.size;
  }

  /** Leases a node holds, as the service counts them. */
  heldBy(nodeId: string): number {
    return this.#remote.heldBy(nodeId);
  }

  /** The stage a rollout leased to `workerId` is in, as its node last reported it. */
  stage(rolloutId: string, workerId: string | null | undefined): NodeLease['stage'] {
    const lease = this.#remote.get(rolloutId);
    return lease && lease.nodeId === workerId ? lease.stage : 'queued';
  }

  /** Forgets what a node held (its policy callers freed). */
  dropNode(nodeId: string): void {
    for (const [id, lease] of this.#remote) if (lease.nodeId === nodeId) this.forgetLease(id);
  }

  /** Forgets a lease to a node (its policy caller freed). */
  forgetLease(rolloutId: string, nodeId?: string): void {
    const lease = this.#remote.get(rolloutId);
    if (!lease || (nodeId !== undefined && lease.nodeId !== nodeId)) return;
    this.#remote.delete(rolloutId);
    if (lease.caller || lease.routed) this.#release(rolloutId);
  }

  /** A cancel for a rollout on a node: it hears so at its next heartbeat. */
  requestCancel(rolloutId: string): void {
    this.#cancelRequests.add(rolloutId);
  }

  cancelRequested(rolloutId: string): boolean {
    return this.#cancelRequests.has(rolloutId);
  }

  /** A rollout has its result: its lease and any cancel asked for it are done with. */
  finished(rolloutId: string): void {
    this.forgetLease(rolloutId);
    this.#cancelRequests.delete(rolloutId);
  }

  /**
   * After a restart of the service: the leases the store says nodes hold are known again, and
   * their nodes listed as placeholders until they register again. Returns how many nodes.
   */
  async restore(store: RolloutStore): Promise<number> {
    const holders = new Set<string>();
    const now = Date.now();
    const tasks = new Map<string, RolloutTask | undefined>();
    for (let cursor: string | null = null; ; ) {
      const page = await store.listRollouts({ state: 'leased', cursor, limit: 10_000 });
      for (const rollout of page.items) {
        if (!rollout.workerId) continue;
        holders.add(rollout.workerId);
        // its lease's life starts again now (when it was claimed is not kept)
        if (!tasks.has(rollout.taskId)) tasks.set(rollout.taskId, (await store.getTask(rollout.taskId))?.task);
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
      const registration: NodeRegistration = { node_id: nodeId, host: '', pid: 0, capacity: { init: 0, run: 0, eval: 0 }, max_rollouts: 0, environments: [] };
      this.#nodes.set(nodeId, { registration, registeredAt: now, lastSeen: now, state: 'up', committed: 0, claims: 0, lastClaimAt: 0 });
    }
    return holders.size;
  }

  views(): NodeView[] {
    const leases = new Map<string, number>();
    for (const lease of this.#remote.values()) leases.set(lease.nodeId, (leases.get(lease.nodeId) ?? 0) + 1);
    return [...this.#nodes.values()]
      .filter((node) => node.registration.max_rollouts > 0)
      .map((node) => ({
        ...node.registration,
        registered_at: new Date(node.registeredAt).toISOString(),
        last_seen_at: new Date(node.lastSeen).toISOString(),
        leases: leases.get(node.registration.node_id) ?? 0,
        committed: node.committed,
        state: node.state,
        direct_backends: node.direct === true,
        ...(node.lostReason ? { lost_reason: node.lostReason } : {}),
      }));
  }
}
