import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { ChatMessage, ChatTool, ModelTurn } from './chat.ts';
import { integerArray, numberArray } from './number-arrays.ts';
import {
  isReservedNodeId,
  NODE_CREDENTIAL_HEADER,
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
} from './nodes.ts';
import { toCurrentResult, toLegacyResult } from './legacy-result.ts';
import { decodeResult, encodeResult } from './result-codec.ts';
import { RolloutResult, RolloutTask } from './rollout.ts';

// The rollout-node protocol on HTTP (see ./nodes.ts; the routes are api/nodes.ts). Wire names are snake_case like the rest of
// the API; the results a node commits are RolloutResult as the runner made it, passed through whole. `rollserve node` (src/node/client.ts)
// speaks this with the same mappers.
//
// Every call after a registration carries the node's credential (given by the registration) in
// the NODE_CREDENTIAL_HEADER header, besides the service's bearer token in `Authorization`.

export const NodeId = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/, 'node ids are 1-128 of [A-Za-z0-9._:-], starting alphanumeric')
  .refine((id) => !isReservedNodeId(id), 'this node id is reserved (the service\'s own worker id)');
const Slots = z.number().int().positive().max(100_000);
/** Rollouts a node holds at most: its claims, heartbeats and commits are bounded by it. */
export const MAX_NODE_ROLLOUTS = 10_000;
const Stage = z.enum(['queued', 'init', 'run', 'eval']);

const WireSlurm = z.strictObject({
  job_id: z.string().optional(),
  array_job_id: z.string().optional(),
  array_task_id: z.string().optional(),
  step_id: z.string().optional(),
  node_name: z.string().optional(),
  proc_id: z.string().optional(),
  /** SLURM_RESTART_COUNT: how many times Slurm requeued the job (tells a requeued run from the one before). */
  restart_count: z.string().optional(),
});

export const WireNodeRegistration = z
  .strictObject({
    /** Chosen by the node and kept across re-registrations. */
    node_id: NodeId,
    host: z.string().min(1),
    pid: z.number().int().nonnegative(),
    /** Worker slots per stage. */
    capacity: z.strictObject({ init: Slots, run: Slots, eval: Slots }),
    /** Rollouts the node holds at most at once: a heartbeat carries at most this many leases, a claim asks for at most this many. */
    max_rollouts: z.number().int().positive().max(MAX_NODE_ROLLOUTS),
    /** The environments it runs; one the service has and the node lacks is a 422 that names it. */
    environments: z.array(z.string().min(1)),
    /** From the Slurm job environment (SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, …). */
    slurm: WireSlurm.optional(),
    version: z.string().optional(),
  })
  .openapi('NodeRegistration');
export type WireNodeRegistration = z.infer<typeof WireNodeRegistration>;

export const WireNodeRegistered = z
  .strictObject({
    node_id: z.string(),
    /**
     * The node's secret credential: sent in the `x-rollserve-node-credential` header on every
     * later call of this node, and when it registers again under the same id. The service keeps
     * only its hash. Registering again with it answers the same credential.
     */
    credential: z.string(),
    lease_ms: z.number(),
    heartbeat_ms: z.number(),
    node_timeout_ms: z.number(),
  })
  .openapi('NodeRegistered');
export type WireNodeRegistered = z.infer<typeof WireNodeRegistered>;

export const WireNodeView = WireNodeRegistration.extend({
  node_id: z.string(),
  registered_at: z.string(),
  last_seen_at: z.string(),
  /** Leases held now. */
  leases: z.number().int(),
  /** Results it committed since the service started. */
  committed: z.number().int(),
  state: z.enum(['up', 'lost', 'left']),
  /** Why a lost node was lost: no heartbeat for its timeout, or its Slurm job gone. A lost node that leaves stays lost. */
  lost_reason: z.string().optional(),
}).openapi('NodeView');
export type WireNodeView = z.infer<typeof WireNodeView>;

const WireLease = z.strictObject({ rollout_id: z.string().min(1), attempt: z.number().int().nonnegative(), stage: Stage });

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
export const WireHeartbeat = z.strictObject({ leases: boundedArray(WireLease, MAX_NODE_ROLLOUTS) }).openapi('NodeHeartbeat');
export const WireHeartbeatAnswer = z
  .strictObject({
    /** Leases extended. */
    renewed: z.array(z.string()),
    /** Leases no longer held: stop their work, kill their sandboxes, do not commit them. */
    lost: z.array(z.string()),
    /** Rollouts a client cancelled: abort them and commit their cancelled results. */
    cancel: z.array(z.string()),
  })
  .openapi('NodeHeartbeatAnswer');

export const WireClaimRequest = z
  .strictObject({
    /** Free slots: rollouts the node takes at most (at most its `max_rollouts`; the service hands out no more than its free capacity). */
    limit: z.number().int().positive().max(MAX_NODE_ROLLOUTS),
    /** With no work ready, wait this long for some before answering an empty list (a long poll). */
    wait_ms: z.number().int().nonnegative().max(60_000).default(5_000),
  })
  .openapi('NodeClaimRequest');

const WireClaim = z.strictObject({
  rollout_id: z.string(),
  task_id: z.string(),
  sample_index: z.number().int(),
  /** The lease's fencing number: quoted back in heartbeats, model turns and the commit. */
  attempt: z.number().int(),
  /** Epoch milliseconds. */
  lease_expires_at: z.number(),
  /** The task as submitted (a RolloutTask, its defaults filled in). */
  task: z.record(z.string(), z.unknown()),
});
export const WireClaims = z.strictObject({ claims: z.array(WireClaim) }).openapi('NodeClaims');

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

export const WireCommits = z
  .strictObject({
    results: z
      .array(
        z.strictObject({
          rollout_id: z.string().min(1),
          attempt: z.number().int().nonnegative(),
          /**
           * RolloutResult as the node's runner made it (the API's form), its token ids possibly
           * sent once (`$tokens`: each turn's prompt as a length of the previous one and the ids
           * after it, the response's ids as a turn). An older node's camelCase result is read too.
           */
          result: z.preprocess(decodeSent, RolloutResult).meta({ id: 'NodeRolloutResult' }),
        }),
      )
      .min(1)
      .max(MAX_NODE_ROLLOUTS),
  })
  .openapi('NodeCommits');

const CommitStatus = z.enum(['committed', 'duplicate', 'stale', 'not_found']);
export const WireCommitAnswer = z
  .strictObject({ results: z.array(z.strictObject({ rollout_id: z.string(), status: CommitStatus })) })
  .openapi('NodeCommitAnswer');

export const WireModelRequest = z
  .strictObject({
    rollout_id: z.string().min(1),
    attempt: z.number().int().nonnegative(),
    /** OpenAI chat messages, as the agent loop built them. */
    messages: z.array(z.looseObject({ role: z.string() })),
    /** OpenAI chat tools. */
    tools: z.array(z.looseObject({ type: z.string() })),
  })
  .openapi('NodeModelRequest');

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
  })
  .openapi('NodeModelTurn');
export type WireModelTurn = z.infer<typeof WireModelTurn>;

// The mappers both sides use (the routes here, the node's client in src/node/client.ts).

const SLURM_KEYS = [
  ['jobId', 'job_id'],
  ['arrayJobId', 'array_job_id'],
  ['arrayTaskId', 'array_task_id'],
  ['stepId', 'step_id'],
  ['nodeName', 'node_name'],
  ['procId', 'proc_id'],
  ['restartCount', 'restart_count'],
] as const;

type Slurm = NonNullable<NodeRegistration['slurm']>;
type WireSlurm = z.infer<typeof WireSlurm>;

function renamed<From extends object, To extends object>(value: From, pairs: ReadonlyArray<readonly [string, string]>): To {
  const out: Record<string, string> = {};
  for (const [from, to] of pairs) {
    const v = (value as Record<string, string | undefined>)[from];
    if (v !== undefined) out[to] = v;
  }
  return out as To;
}

export function toWireRegistration(r: NodeRegistration): WireNodeRegistration {
  return {
    node_id: r.nodeId,
    host: r.host,
    pid: r.pid,
    capacity: { ...r.capacity },
    max_rollouts: r.maxRollouts,
    environments: r.environments,
    ...(r.slurm ? { slurm: renamed<Slurm, WireSlurm>(r.slurm, SLURM_KEYS) } : {}),
    ...(r.version !== undefined ? { version: r.version } : {}),
  };
}

export function fromWireRegistration(w: WireNodeRegistration): NodeRegistration {
  return {
    nodeId: w.node_id,
    host: w.host,
    pid: w.pid,
    capacity: { ...w.capacity },
    maxRollouts: w.max_rollouts,
    environments: w.environments,
    ...(w.slurm ? { slurm: renamed<WireSlurm, Slurm>(w.slurm, SLURM_KEYS.map(([a, b]) => [b, a] as const)) } : {}),
    ...(w.version !== undefined ? { version: w.version } : {}),
  };
}

export const toWireRegistered = (r: NodeRegistered): WireNodeRegistered => ({
  node_id: r.nodeId,
  credential: r.credential,
  lease_ms: r.leaseMs,
  heartbeat_ms: r.heartbeatMs,
  node_timeout_ms: r.nodeTimeoutMs,
});
export const fromWireRegistered = (w: WireNodeRegistered): NodeRegistered => ({
  nodeId: w.node_id,
  credential: w.credential,
  leaseMs: w.lease_ms,
  heartbeatMs: w.heartbeat_ms,
  nodeTimeoutMs: w.node_timeout_ms,
});

export const toWireNodeView = (v: NodeView): WireNodeView => ({
  ...toWireRegistration(v),
  registered_at: v.registeredAt,
  last_seen_at: v.lastSeenAt,
  leases: v.leases,
  committed: v.committed,
  state: v.state,
  ...(v.lostReason !== undefined ? { lost_reason: v.lostReason } : {}),
});

export const toWireLease = (l: NodeLease) => ({ rollout_id: l.rolloutId, attempt: l.attempt, stage: l.stage });

export const toWireClaim = (c: NodeClaim): z.infer<typeof WireClaim> => ({
  rollout_id: c.rolloutId,
  task_id: c.taskId,
  sample_index: c.sampleIndex,
  attempt: c.attempt,
  lease_expires_at: c.leaseExpiresAt,
  task: c.task as unknown as Record<string, unknown>,
});

/** A claim as the node reads it; the task is checked against RolloutTask (a version skew shows here, not mid-rollout). */
export const fromWireClaim = (w: z.infer<typeof WireClaim>): NodeClaim => ({
  rolloutId: w.rollout_id,
  taskId: w.task_id,
  sampleIndex: w.sample_index,
  attempt: w.attempt,
  leaseExpiresAt: w.lease_expires_at,
  task: RolloutTask.parse(w.task),
});

/**
 * A commit as a node sends it: the result with each token id once (its ids, whole in every turn,
 * would be most of the body), or `whole` for a service that does not read that form: an older
 * rollserve, which reads results whole in their camelCase form (today's service reads that too).
 */
export const toWireCommit = (c: NodeCommit, whole = false) => ({ rollout_id: c.rolloutId, attempt: c.attempt, result: whole ? toLegacyResult(c.result) : encodeResult(c.result) });

export const toWireModelRequest = (r: NodeModelRequest) => ({ rollout_id: r.rolloutId, attempt: r.attempt, messages: r.request.messages, tools: r.request.tools });

export const toWireModelTurn = (t: ModelTurn): WireModelTurn => ({
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
});
