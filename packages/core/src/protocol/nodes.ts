import type { ChatMessage, ChatTool, ModelTurn } from './chat.ts';
import type { RolloutResult, RolloutTask, StageName } from './rollout.ts';

/**
 * The rollout-node protocol: what `rollserve node` and the central service say to each other
 * (HTTP routes under /v1/nodes, see api/nodes.ts). A node registers, then pulls work while it has
 * free slots (each rollout under a lease with an expiry and a fencing attempt), heartbeats the
 * leases it holds, runs each rollout's whole session locally and commits the result. Only the
 * central service talks to the store; nodes need nothing but its URL.
 */

/** What a node says about itself when it registers. */
export interface NodeRegistration {
  /**
   * The node's id, chosen by the node and kept across re-registrations (after a service restart
   * the node registers again under the same id and its leases stay its own).
   */
  nodeId: string;
  host: string;
  pid: number;
  /** Worker slots per stage. */
  capacity: Record<StageName, number>;
  /** Rollouts the node holds at most at once (claims stop there). */
  maxRollouts: number;
  /** The environments the node can run (a claim only hands out rollouts of these). */
  environments: string[];
  /** From the Slurm job environment, when the node runs as a Slurm task. */
  slurm?: { jobId?: string; arrayJobId?: string; arrayTaskId?: string; stepId?: string; nodeName?: string; procId?: string; restartCount?: string };
  /** rollserve's version on the node. */
  version?: string;
}

/**
 * The id under which the central service leases what its own pools run. No node may register
 * under it (in any letter case): a node by that name could commit the service's own work.
 */
export const SERVICE_WORKER_ID = 'service';

/** Whether `nodeId` is one a node may not take (it names a worker of the service itself). */
export const isReservedNodeId = (nodeId: string): boolean => nodeId.toLowerCase() === SERVICE_WORKER_ID;

/**
 * The header that carries a node's credential on every call after its registration (and on a
 * registration again under the same id). `Authorization` carries the service's bearer token.
 */
export const NODE_CREDENTIAL_HEADER = 'x-rollserve-node-credential';

/** Who calls: a node's id and the credential it was given at registration. */
export interface NodeAuth {
  nodeId: string;
  credential?: string | undefined;
}

/** What the service answers to a registration: the node's credential and the timings it must keep. */
export interface NodeRegistered {
  nodeId: string;
  /**
   * The node's secret credential (random; the service keeps only its hash): sent in
   * NODE_CREDENTIAL_HEADER on every later call, and on registering again under the same id (a
   * live node's id is not taken over without it). The one the node presented, when it did.
   */
  credential: string;
  /** A lease lasts this long unless renewed. */
  leaseMs: number;
  /** Heartbeat this often (a node missing heartbeats for `nodeTimeoutMs` is lost: its work re-issued). */
  heartbeatMs: number;
  nodeTimeoutMs: number;
}

/** A lease as the node quotes it back, with the stage its rollout is in. */
export interface NodeLease {
  rolloutId: string;
  attempt: number;
  stage: StageName | 'queued';
}

export interface HeartbeatAnswer {
  /** Leases extended. */
  renewed: string[];
  /**
   * Leases the node no longer holds (it was declared lost and its work re-issued, or the
   * rollout finished elsewhere): stop their work and kill their sandboxes; do not commit them.
   */
  lost: string[];
  /** Rollouts a client cancelled: abort them and commit their cancelled results. */
  cancel: string[];
}

/** Work handed to a node. */
export interface NodeClaim {
  rolloutId: string;
  taskId: string;
  sampleIndex: number;
  attempt: number;
  leaseExpiresAt: number;
  task: RolloutTask;
}

export interface NodeCommit {
  rolloutId: string;
  attempt: number;
  /** The finished result (group credit is the service's business: it is added there). */
  result: RolloutResult;
}

export type NodeCommitStatus = 'committed' | 'duplicate' | 'stale' | 'not_found';

/** A policy turn asked of the service, which routes it (least in flight, sticky per rollout). */
export interface NodeModelRequest {
  rolloutId: string;
  attempt: number;
  request: { messages: ChatMessage[]; tools: ChatTool[] };
}

/** A registered node as GET /v1/nodes shows it. */
export interface NodeView extends NodeRegistration {
  registeredAt: string;
  lastSeenAt: string;
  /** Leases held now. */
  leases: number;
  /** Results it committed (since the service started). */
  committed: number;
  state: 'up' | 'lost' | 'left';
  /** Why it was lost (no heartbeat for its timeout, or its Slurm job gone). */
  lostReason?: string;
}

/**
 * The service's side of the protocol (implemented by RolloutService; the HTTP routes call it).
 * Unknown node ids are a NOT_FOUND RolloutError: the node registers again. Every call after the
 * registration names the node with the credential it was given (NodeAuth); a missing or wrong one
 * is an UNAUTHORIZED RolloutError.
 */
export interface NodeCoordinator {
  /**
   * Registers a node, or registers it again under the same id. `credential`: the one it was given
   * before; without it, an id that is in use (a node up, or holding leases) is a CONFLICT.
   */
  registerNode(registration: NodeRegistration, credential?: string): Promise<NodeRegistered>;
  /** Renews what the node holds (at most its `maxRollouts` leases); tells it what it lost and what to cancel. */
  heartbeat(node: NodeAuth, leases: readonly NodeLease[]): Promise<HeartbeatAnswer>;
  /**
   * Leases up to `limit` rollouts (at most the node's free capacity) of the node's environments.
   * When there are none, waits up to `waitMs` for work to arrive (a long poll) before answering
   * an empty list.
   */
  claimForNode(node: NodeAuth, limit: number, waitMs: number, signal?: AbortSignal): Promise<NodeClaim[]>;
  /** Commits results in order; each gets its own outcome (a stale one, or one for a lease the node does not hold, changes nothing). */
  commitFromNode(node: NodeAuth, commits: readonly NodeCommit[]): Promise<NodeCommitStatus[]>;
  /** One policy turn through the service's backend pool, for a rollout the node holds. */
  modelTurn(node: NodeAuth, call: NodeModelRequest, signal: AbortSignal): Promise<ModelTurn>;
  /** A node leaving: what it still holds is re-queued at once. */
  deregisterNode(node: NodeAuth): Promise<{ released: number }>;
  nodes(): NodeView[];
}
