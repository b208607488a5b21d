import { z } from '@hono/zod-openapi';
import type { ChatMessage, ChatTool, ModelTurn } from './chat.ts';
import { toCurrentResult } from './legacy-result.ts';
import { integerArray, numberArray } from './number-arrays.ts';
import { decodeResult } from './result-codec.ts';
import { RolloutResult, type RolloutTask } from './rollout.ts';

/**
 * The rollout-node protocol: what `rollserve node` and the central service say to each other
 * (HTTP routes under /v1/nodes, see api/nodes.ts; the node's client is node/client.ts). A node
 * registers, then pulls work while it has free slots (each rollout under a lease with an expiry
 * and a fencing attempt), heartbeats the leases it holds, runs each rollout's whole session
 * locally and commits the result. Only the central service talks to the store; nodes need nothing
 * but its URL.
 *
 * Each message is one zod schema here, snake_case as on the wire, and its type is inferred from
 * it: both sides use what the wire carries, unrenamed. The one exception is a policy turn, which
 * the runner and the LLM clients know as the camelCase ModelTurn (see WireModelTurn).
 *
 * Every call after a registration carries the node's credential (given by the registration) in
 * the NODE_CREDENTIAL_HEADER header, besides the service's bearer token in `Authorization`.
 */

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

/**
 * What a node says it reads beyond the protocol's first form, on every call (a header, which an
 * older service ignores), comma-separated: `weights`, a model turn's `weight_version` and
 * `paused_ms` and a heartbeat answer's `generation_paused`; `prefetch`, a claim answer's
 * `upcoming`. Without one the service answers in the older form, which an older node's strict
 * schemas take.
 */
export const NODE_FEATURES_HEADER = 'x-rollserve-node-features';

/**
 * The feature a node names in NODE_FEATURES_HEADER when it calls the policy's backends itself:
 * the service then answers its registration with `features` (and the weight state), hands it a
 * route per claimed rollout (NodeRoute: the backend the service picked, least in flight across
 * the cluster, counted as that backend's load until the rollout's lease ends), tells it the
 * weight state with every heartbeat, and waits for its generations to drain when it pauses. A
 * service that does not name it back (an older one) gets the node's turns through /model.
 */
export const DIRECT_BACKENDS_FEATURE = 'direct-backends';

/** The features a call names in NODE_FEATURES_HEADER. */
export const nodeFeatures = (header: string | undefined): string[] => (header ?? '').split(',').map((f) => f.trim()).filter((f) => f !== '');

/** Rollouts a node holds at most: its claims, heartbeats and commits are bounded by it. */
export const MAX_NODE_ROLLOUTS = 10_000;

export const NodeId = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/, 'node ids are 1-128 of [A-Za-z0-9._:-], starting alphanumeric')
  .refine((id) => !isReservedNodeId(id), 'this node id is reserved (the service\'s own worker id)');
const Slots = z.number().int().positive().max(100_000);
const Stage = z.enum(['queued', 'init', 'run', 'eval']);

/** From the Slurm job environment, when the node runs as a Slurm task (see slurmFromEnv). */
export const NodeSlurm = z.strictObject({
  job_id: z.string().optional(),
  array_job_id: z.string().optional(),
  array_task_id: z.string().optional(),
  step_id: z.string().optional(),
  node_name: z.string().optional(),
  proc_id: z.string().optional(),
  /** SLURM_RESTART_COUNT: how many times Slurm requeued the job (tells a requeued run from the one before). */
  restart_count: z.string().optional(),
});
export type NodeSlurm = z.infer<typeof NodeSlurm>;

/** What a node says about itself when it registers. */
export const NodeRegistration = z
  .strictObject({
    /**
     * The node's id, chosen by the node and kept across re-registrations (after a service restart
     * the node registers again under the same id and its leases stay its own).
     */
    node_id: NodeId,
    host: z.string().min(1),
    pid: z.number().int().nonnegative(),
    /** Worker slots per stage. */
    capacity: z.strictObject({ init: Slots, run: Slots, eval: Slots }),
    /** Rollouts the node holds at most at once: a heartbeat carries at most this many leases, a claim asks for at most this many. */
    max_rollouts: z.number().int().positive().max(MAX_NODE_ROLLOUTS),
    /** The environments it runs (a claim only hands out rollouts of these); one the service has and the node lacks is a 422 that names it. */
    environments: z.array(z.string().min(1)),
    /** From the Slurm job environment (SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, …). */
    slurm: NodeSlurm.optional(),
    /** rollserve's version on the node. */
    version: z.string().optional(),
  })
  .openapi('NodeRegistration');
export type NodeRegistration = z.infer<typeof NodeRegistration>;

/** Who calls: a node's id (the path's `node_id`) and the credential it was given at registration. */
export interface NodeAuth {
  node_id: string;
  credential?: string | undefined;
}

/**
 * The weight state as a node calling backends itself needs it (the service's Weights.state(),
 * see llm/weights.ts): the version each backend serves, and the pause of a weight update if one is
 * on. `epoch` orders the states a node hears (from its registration, claims and heartbeats, whose
 * answers may cross): it keeps the one with the greatest. `backends`: the ids of the service's
 * backends now (a rollout routed to one no longer there is routed again).
 */
export const NodeWeights = z
  .strictObject({
    epoch: z.number(),
    newest: z.number().int().nullable(),
    default: z.number().int().nullable(),
    versions: z.record(z.string(), z.number().int()),
    pause: z.strictObject({ mode: z.enum(['abort', 'finish']), since: z.string() }).nullable(),
    backends: z.array(z.string()),
  })
  .openapi('NodeWeights');
export type NodeWeights = z.infer<typeof NodeWeights>;

/**
 * Where a node sends a rollout's policy turns itself (DIRECT_BACKENDS_FEATURE): the backend the
 * service chose for it (sticky for the rollout, least in flight across the service and every
 * node), and what the service would send it. Good for the rollout's lease at `attempt`.
 */
export const NodeRoute = z
  .strictObject({
    rollout_id: z.string(),
    attempt: z.number().int().nonnegative(),
    backend: z.strictObject({
      id: z.string(),
      base_url: z.string(),
      model: z.string().optional(),
      api_key: z.string().optional(),
      max_concurrency: z.number().int().positive().optional(),
    }),
    /** Request headers the service sends the backend with each of the rollout's calls (`x-rollout-id`). */
    headers: z.record(z.string(), z.string()),
  })
  .openapi('NodeRoute');
export type NodeRoute = z.infer<typeof NodeRoute>;

/** A node asking for a rollout's route (again): `failed`, the backend that gave no response (it is taken out of rotation and probed, as the service does with its own). */
export const NodeRouteRequest = z
  .strictObject({
    rollout_id: z.string().min(1),
    attempt: z.number().int().nonnegative(),
    failed: z.string().optional(),
  })
  .openapi('NodeRouteRequest');
export type NodeRouteRequest = z.infer<typeof NodeRouteRequest>;

/** What the service answers to a registration: the node's credential and the timings it must keep. */
export const NodeRegistered = z
  .strictObject({
    node_id: z.string(),
    /**
     * The node's secret credential: sent in the `x-rollserve-node-credential` header on every
     * later call of this node, and when it registers again under the same id (a live node's id is
     * not taken over without it). The service keeps only its hash. Registering again with it
     * answers the same credential.
     */
    credential: z.string(),
    /** A lease lasts this long unless renewed. */
    lease_ms: z.number(),
    /** Heartbeat this often (a node missing heartbeats for `node_timeout_ms` is lost: its work re-issued). */
    heartbeat_ms: z.number(),
    node_timeout_ms: z.number(),
    /** The features of NODE_FEATURES_HEADER the service takes up with this node (absent from an older service). */
    features: z.array(z.string()).optional(),
    /** With DIRECT_BACKENDS_FEATURE: the weight state now (a node starts no turn during a pause it has not heard of). */
    weights: NodeWeights.optional(),
  })
  .openapi('NodeRegistered');
export type NodeRegistered = z.infer<typeof NodeRegistered>;

/** A registered node as GET /v1/nodes shows it. */
export const NodeView = NodeRegistration.extend({
  node_id: z.string(),
  registered_at: z.string(),
  last_seen_at: z.string(),
  /** Leases held now. */
  leases: z.number().int(),
  /** Results it committed since the service started. */
  committed: z.number().int(),
  state: z.enum(['up', 'lost', 'left']),
  /** It sends its policy turns to the backends itself, on routes the service hands it (DIRECT_BACKENDS_FEATURE taken up); else they go through the service. */
  direct_backends: z.boolean(),
  /** Why a lost node was lost: no heartbeat for its timeout, or its Slurm job gone. A lost node that leaves stays lost. */
  lost_reason: z.string().optional(),
}).openapi('NodeView');
export type NodeView = z.infer<typeof NodeView>;

/** A lease as the node quotes it back, with the stage its rollout is in. */
export const NodeLease = z.strictObject({ rollout_id: z.string().min(1), attempt: z.number().int().nonnegative(), stage: Stage });
export type NodeLease = z.infer<typeof NodeLease>;

/**
 * A list of at most `max` items, its length checked before any item is: a flood of made-up items
 * costs its length, not the checking of each.
 */
function boundedArray<T extends z.ZodType>(item: T, max: number) {
  return z.preprocess((value, ctx) => {
    if (Array.isArray(value) && value.length > max) {
      ctx.addIssue({ code: 'too_big', origin: 'array', maximum: max, inclusive: true, input: value, message: `Too big: expected array to have <=${max} items (got ${value.length})` });
      return z.NEVER;
    }
    return value;
  }, z.array(item).max(max));
}

/** Every lease the node holds: at most its `max_rollouts` (a longer list is a 422 that names it). */
export const NodeHeartbeat = z
  .strictObject({
    leases: boundedArray(NodeLease, MAX_NODE_ROLLOUTS),
    /**
     * A node calling backends itself (DIRECT_BACKENDS_FEATURE, to a service that took it up): the
     * weight epoch it goes by and its policy turns in flight as it sends this. A pause waits
     * until every such node says it has heard of it and has none in flight.
     */
    generation: z
      .strictObject({
        epoch: z.number(),
        paused: z.boolean(),
        in_flight: z.number().int().nonnegative(),
        /** Turns that were in flight when it heard of the pause it is in (aborted or left to finish, as the pause said). */
        in_flight_at_pause: z.number().int().nonnegative(),
      })
      .optional(),
  })
  .openapi('NodeHeartbeat');
export type NodeGeneration = NonNullable<z.infer<typeof NodeHeartbeat>['generation']>;

export const HeartbeatAnswer = z
  .strictObject({
    /** Leases extended. */
    renewed: z.array(z.string()),
    /**
     * Leases the node no longer holds (it was declared lost and its work re-issued, or the
     * rollout finished elsewhere): stop their work and kill their sandboxes; do not commit them.
     */
    lost: z.array(z.string()),
    /** Rollouts a client cancelled: abort them and commit their cancelled results. */
    cancel: z.array(z.string()),
    /**
     * Whether generation is paused for a weight update (its time is nobody's: a node leaves it out
     * of its rollouts' time limits). Sent to a node that reads it (NODE_FEATURES_HEADER).
     */
    generation_paused: z.boolean().optional(),
    /** The weight state, to a node calling backends itself (DIRECT_BACKENDS_FEATURE). */
    weights: NodeWeights.optional(),
  })
  .openapi('NodeHeartbeatAnswer');
export type HeartbeatAnswer = z.infer<typeof HeartbeatAnswer>;

export const NodeClaimRequest = z
  .strictObject({
    /** Free slots: rollouts the node takes at most (at most its `max_rollouts`; the service hands out no more than its free capacity). */
    limit: z.number().int().positive().max(MAX_NODE_ROLLOUTS),
    /** With no work ready, wait this long for some before answering an empty list (a long poll). */
    wait_ms: z.number().int().nonnegative().max(60_000).default(5_000),
  })
  .openapi('NodeClaimRequest');

/** Work handed to a node. */
export const NodeClaim = z.strictObject({
  rollout_id: z.string(),
  task_id: z.string(),
  sample_index: z.number().int(),
  /** The lease's fencing number: quoted back in heartbeats, model turns and the commit. */
  attempt: z.number().int(),
  /** Epoch milliseconds. */
  lease_expires_at: z.number(),
  /** The task as submitted (a RolloutTask, its defaults filled in). */
  task: z.record(z.string(), z.unknown()),
  /** To a node calling backends itself: where its turns go, when a backend could be chosen at once (else it asks for one). */
  route: NodeRoute.optional(),
});
/** A claim; its task a RolloutTask (the node checks it on receipt: a version skew shows there, not mid-rollout). */
export type NodeClaim = Omit<z.infer<typeof NodeClaim>, 'task'> & { task: RolloutTask };

/** Tasks a claim answer names as queued next (`upcoming`): at most this many. */
export const NODE_UPCOMING_MAX = 4;

/** A task queued next: a hint for the node to ready its sandbox's image; nothing is leased. */
export const NodeUpcoming = z
  .strictObject({
    task_id: z.string(),
    /** The task as submitted (a RolloutTask, its defaults filled in). */
    task: z.record(z.string(), z.unknown()),
  })
  .openapi('NodeUpcoming');
export type NodeUpcoming = Omit<z.infer<typeof NodeUpcoming>, 'task'> & { task: RolloutTask };

export const NodeClaims = z
  .strictObject({
    claims: z.array(NodeClaim),
    /**
     * To a node that reads `prefetch` (NODE_FEATURES_HEADER), with a claim that handed it work: the
     * tasks of the rollouts queued next (distinct, in the order they would be claimed; at most
     * NODE_UPCOMING_MAX shared among the nodes up, at least one), whose images it may ready while
     * it runs what it holds. A hint: another node may claim them.
     */
    upcoming: z.array(NodeUpcoming).optional(),
    /** To a node calling backends itself: the weight state as the claims were made. */
    weights: NodeWeights.optional(),
  })
  .openapi('NodeClaims');

/**
 * A sent result's token ids whole again before it is checked (a malformed encoding is a 422 naming
 * where), an older node's camelCase result in today's form, and keys rollserve does not know
 * dropped (as they always were: a newer node's result is read as far as this service knows it).
 */
function decodeSent(value: unknown, ctx: { addIssue(issue: { code: 'custom'; message: string; input: unknown }): void }): unknown {
  try {
    return toCurrentResult(decodeResult(value));
  } catch (error) {
    ctx.addIssue({ code: 'custom', message: (error as Error).message, input: value });
    return z.NEVER;
  }
}

/** A finished rollout a node commits under its lease's attempt. */
export const NodeCommit = z.strictObject({
  rollout_id: z.string().min(1),
  attempt: z.number().int().nonnegative(),
  /**
   * RolloutResult as the node's runner made it (the API's form; group credit is the service's
   * business: it is added there), its token ids possibly sent once (`$tokens`: each turn's prompt
   * as a length of the previous one and the ids after it, the response's ids as a turn). An older
   * node's camelCase result is read too.
   */
  result: z.preprocess(decodeSent, RolloutResult).meta({ id: 'NodeRolloutResult' }),
});
export type NodeCommit = z.infer<typeof NodeCommit>;
export const NodeCommits = z.strictObject({ results: z.array(NodeCommit).min(1).max(MAX_NODE_ROLLOUTS) }).openapi('NodeCommits');

export const NodeCommitStatus = z.enum(['committed', 'duplicate', 'stale', 'not_found']);
export type NodeCommitStatus = z.infer<typeof NodeCommitStatus>;
export const NodeCommitAnswer = z
  .strictObject({ results: z.array(z.strictObject({ rollout_id: z.string(), status: NodeCommitStatus })) })
  .openapi('NodeCommitAnswer');

/** A policy turn asked of the service, which routes it (least in flight, sticky per rollout). */
export const NodeModelRequest = z
  .strictObject({
    rollout_id: z.string().min(1),
    attempt: z.number().int().nonnegative(),
    /** OpenAI chat messages, as the agent loop built them. */
    messages: z.array(z.looseObject({ role: z.string() })),
    /** OpenAI chat tools. */
    tools: z.array(z.looseObject({ type: z.string() })),
  })
  .openapi('NodeModelRequest');
/** A policy turn's request; its messages and tools as the agent loop built them (the schema checks only their shape). */
export type NodeModelRequest = Omit<z.infer<typeof NodeModelRequest>, 'messages' | 'tools'> & { messages: ChatMessage[]; tools: ChatTool[] };

/**
 * A policy turn on the wire. The runner, the agent loop and the LLM clients know it as the
 * camelCase ModelTurn (protocol/chat.ts), so this one message is mapped at both ends.
 */
export const WireModelTurn = z
  .strictObject({
    content: z.string().nullable(),
    reasoning: z.string().nullable(),
    tool_calls: z.array(z.strictObject({ id: z.string(), name: z.string(), arguments: z.string() })),
    finish_reason: z.string().nullable(),
    prompt_token_ids: integerArray.nullable(),
    generation_token_ids: integerArray.nullable(),
    generation_logprobs: numberArray.nullable(),
    usage: z.strictObject({ prompt_tokens: z.number(), completion_tokens: z.number() }),
    backend: z.string().nullable(),
    latency_ms: z.number(),
    /** The generating backend's weight version; absent from an older service (read as null). */
    weight_version: z.number().int().nullable().optional(),
    /** How long the turn waited at the service for a pause of generation to end; absent from an older service. */
    paused_ms: z.number().nonnegative().optional(),
  })
  .openapi('NodeModelTurn');
export type WireModelTurn = z.infer<typeof WireModelTurn>;

/** A turn on the wire; `weights`: with its weight version and pause time (a node that reads them, see NODE_FEATURES_HEADER). */
export const toWireModelTurn = (t: ModelTurn, weights = true): WireModelTurn => ({
  content: t.content,
  reasoning: t.reasoning,
  tool_calls: t.toolCalls,
  finish_reason: t.finishReason,
  prompt_token_ids: t.promptTokenIds,
  generation_token_ids: t.generationTokenIds,
  generation_logprobs: t.generationLogprobs,
  usage: { prompt_tokens: t.usage.promptTokens, completion_tokens: t.usage.completionTokens },
  backend: t.backend,
  latency_ms: t.latencyMs,
  ...(weights ? { weight_version: t.weightVersion, paused_ms: t.pausedMs } : {}),
});

export const fromWireModelTurn = (w: WireModelTurn): ModelTurn => ({
  content: w.content,
  reasoning: w.reasoning,
  toolCalls: w.tool_calls,
  finishReason: w.finish_reason,
  promptTokenIds: w.prompt_token_ids,
  generationTokenIds: w.generation_token_ids,
  generationLogprobs: w.generation_logprobs,
  usage: { promptTokens: w.usage.prompt_tokens, completionTokens: w.usage.completion_tokens },
  backend: w.backend,
  latencyMs: w.latency_ms,
  weightVersion: w.weight_version ?? null,
  pausedMs: w.paused_ms ?? 0,
});

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
  registerNode(registration: NodeRegistration, credential?: string, features?: readonly string[]): Promise<NodeRegistered>;
  /**
   * Renews what the node holds (at most its `max_rollouts` leases); tells it what it lost and what
   * to cancel. `generation`: what a node calling backends itself says of its turns in flight.
   */
  heartbeat(node: NodeAuth, leases: readonly NodeLease[], generation?: NodeGeneration): Promise<HeartbeatAnswer>;
  /** The route of a rollout the node holds and calls the backends for itself (DIRECT_BACKENDS_FEATURE). */
  route(node: NodeAuth, call: NodeRouteRequest, signal: AbortSignal): Promise<NodeRoute>;
  /** The weight state for a node that calls backends itself (undefined for any other). */
  weightsFor(nodeId: string): NodeWeights | undefined;
  /**
   * Leases up to `limit` rollouts (at most the node's free capacity) of the node's environments.
   * When there are none, waits up to `waitMs` for work to arrive (a long poll) before answering
   * an empty list.
   */
  claimForNode(node: NodeAuth, limit: number, waitMs: number, signal?: AbortSignal): Promise<NodeClaim[]>;
  /** The tasks of the rollouts queued next (distinct, at most `limit`): a hint, nothing leased (see NodeClaims' `upcoming`). */
  upcomingForNode(node: NodeAuth, limit: number): Promise<NodeUpcoming[]>;
  /** Commits results in order; each gets its own outcome (a stale one, or one for a lease the node does not hold, changes nothing). */
  commitFromNode(node: NodeAuth, commits: readonly NodeCommit[]): Promise<NodeCommitStatus[]>;
  /** One policy turn through the service's backend pool, for a rollout the node holds. */
  modelTurn(node: NodeAuth, call: NodeModelRequest, signal: AbortSignal): Promise<ModelTurn>;
  /** A node leaving: what it still holds is re-queued at once. */
  deregisterNode(node: NodeAuth): Promise<{ released: number }>;
  nodes(): NodeView[];
}
