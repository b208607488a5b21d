import { z } from '@hono/zod-openapi';
import { ERROR_CODES, RolloutError, type RolloutErrorCode } from '../errors.ts';
import type { RolloutService } from '../service/service.ts';
import { trainingView } from '../protocol/training-view.ts';
import { CriticalError, RolloutState, ToolCallStatus, TurnRewards, TurnStatus, type CreditRecord, type RolloutResult, type RolloutView, type StageTiming, type ToolCallRecord, type TurnRecord } from '../protocol/rollout.ts';

// Results go out snake_case, like requests come in. Internals and the store stay camelCase; these
// mappers are the one place that renames, and only rollserve's own keys: user data (verify extras,
// response, messages, metadata, credit components' params) passes through untouched.

export const WireToolCall = z
  .strictObject({
    id: z.string(),
    name: z.string(),
    /** The arguments exactly as the model wrote them. */
    arguments: z.string(),
    /** What the model read back. */
    output: z.string(),
    status: ToolCallStatus,
    /** How the call went, as the tool reports it; null when it did not run. */
    execution: z.strictObject({ exit_code: z.number().int().nullable(), timed_out: z.boolean(), exception: z.string().nullable() }).nullable(),
    /** The code the call executed, null when none. */
    code: z.string().nullable(),
    duration_ms: z.number(),
  })
  .openapi('ToolCall');
export type WireToolCall = z.infer<typeof WireToolCall>;

export const WireTurn = z
  .strictObject({
    index: z.number().int(),
    prompt_token_ids: z.array(z.number().int()).nullable(),
    generation_token_ids: z.array(z.number().int()).nullable(),
    generation_logprobs: z.array(z.number()).nullable(),
    finish_reason: z.string().nullable(),
    text: z.string().nullable(),
    reasoning: z.string().nullable(),
    tool_calls: z.array(WireToolCall),
    llm_latency_ms: z.number(),
    backend: z.string().nullable(),
    code: z.string().nullable(),
    status: TurnStatus,
    malformed: z.string().nullable(),
    /** Per-turn reward components; null: not known. */
    rewards: TurnRewards,
    reward: z.number(),
    return: z.number(),
    /** The turn's advantage; null for n = 1, filtered samples, or when shaping failed. */
    normalized_return: z.number().nullable(),
  })
  .openapi('Turn');
export type WireTurn = z.infer<typeof WireTurn>;

/** CreditRecord's keys are snake_case already; `components` (names, weights, params) passes through. */
export const WireCredit = z
  .strictObject({
    gamma: z.number(),
    normalize: z.enum(['group', 'turn']),
    components: z.record(z.string(), z.strictObject({ weight: z.number(), params: z.record(z.string(), z.unknown()) })),
    shaping: z.strictObject({ value: z.number(), similarity: z.number().nullable(), successes: z.number().int() }).nullable(),
    stats: z.array(z.strictObject({ turn: z.number().int().nullable(), count: z.number().int(), mean: z.number(), std: z.number() })).nullable(),
    error: z.string().nullable(),
  })
  .openapi('Credit');

const WireStageTiming = z.strictObject({ queued_ms: z.number(), active_ms: z.number() });

export const WireResult = z
  .strictObject({
    id: z.string(),
    task_id: z.string(),
    sample_index: z.number().int(),
    env: z.string(),
    state: RolloutState,
    reward: z.number(),
    /** Named reward components when the environment reports them. */
    reward_components: z.record(z.string(), z.number()).nullable(),
    /** The environment's verify extras, with NeMo Gym's key names (untouched). */
    verify_extras: z.record(z.string(), z.unknown()),
    critical_error: CriticalError,
    /** True for infrastructure failures: do not train on this sample as reward 0. */
    filter: z.boolean(),
    error: z.strictObject({ code: z.string(), message: z.string() }).nullable(),
    /** Group-normalised outcome advantage (n > 1), else null. */
    advantage: z.number().nullable(),
    credit: WireCredit.nullable(),
    timing: z.strictObject({ init: WireStageTiming, run: WireStageTiming, eval: WireStageTiming, total_ms: z.number() }),
    /** The NeMo Gym-shaped Responses API response (untouched). */
    response: z.record(z.string(), z.unknown()).nullable(),
    /** The chat messages as the policy saw them (untouched). */
    messages: z.array(z.record(z.string(), z.unknown())),
    turns: z.array(WireTurn),
    /** The task's metadata (untouched). */
    metadata: z.record(z.string(), z.unknown()).optional(),
    finished_at: z.string(),
  })
  .openapi('RolloutResult');
export type WireResult = z.infer<typeof WireResult>;

export const WireView = z
  .strictObject({
    id: z.string(),
    task_id: z.string(),
    sample_index: z.number().int(),
    env: z.string(),
    /** The stage the rollout is in (waiting for a slot counts), or how it ended. */
    state: RolloutState,
    /** Whether it holds a slot of its stage now. */
    active: z.boolean(),
    result: WireResult.nullable(),
  })
  .openapi('RolloutView');
export type WireView = z.infer<typeof WireView>;

/** One whole group, as `GET /v1/rollouts/groups/stream` sends it. */
export const WireGroup = z.strictObject({ task_id: z.string(), results: z.array(WireResult) }).openapi('RolloutGroup');
export type WireGroup = z.infer<typeof WireGroup>;

export function toWireToolCall(call: ToolCallRecord): WireToolCall {
  return {
    id: call.id,
    name: call.name,
    arguments: call.arguments,
    output: call.output,
    status: call.status,
    execution: call.execution && { exit_code: call.execution.exitCode, timed_out: call.execution.timedOut, exception: call.execution.exception },
    code: call.code,
    duration_ms: call.durationMs,
  };
}

export function toWireTurn(turn: TurnRecord): WireTurn {
  return {
    index: turn.index,
    prompt_token_ids: turn.promptTokenIds,
    generation_token_ids: turn.generationTokenIds,
    generation_logprobs: turn.generationLogprobs,
    finish_reason: turn.finishReason,
    text: turn.text,
    reasoning: turn.reasoning,
    tool_calls: turn.toolCalls.map(toWireToolCall),
    llm_latency_ms: turn.llmLatencyMs,
    backend: turn.backend,
    code: turn.code,
    status: turn.status,
    malformed: turn.malformed,
    rewards: turn.rewards,
    reward: turn.reward,
    return: turn.return,
    normalized_return: turn.normalizedReturn,
  };
}

const toWireTiming = (t: StageTiming) => ({ queued_ms: t.queuedMs, active_ms: t.activeMs });

/** A result as the API sends it (snake_case keys; user data untouched). */
export function toWireResult(result: RolloutResult): WireResult {
  return {
    id: result.id,
    task_id: result.taskId,
    sample_index: result.sampleIndex,
    env: result.env,
    state: result.state,
    reward: result.reward,
    reward_components: result.rewardComponents,
    verify_extras: result.verifyExtras,
    critical_error: result.criticalError,
    filter: result.filter,
    error: result.error,
    advantage: result.advantage,
    credit: result.credit satisfies CreditRecord | null,
    timing: { init: toWireTiming(result.timing.init), run: toWireTiming(result.timing.run), eval: toWireTiming(result.timing.eval), total_ms: result.timing.totalMs },
    response: result.response,
    messages: result.messages,
    turns: result.turns.map(toWireTurn),
    ...(result.metadata !== undefined ? { metadata: result.metadata } : {}),
    finished_at: result.finishedAt,
  };
}

/** A rollout view as the API sends it. */
export function toWireView(view: RolloutView): WireView {
  return {
    id: view.id,
    task_id: view.taskId,
    sample_index: view.sampleIndex,
    env: view.env,
    state: view.state,
    active: view.active,
    result: view.result && toWireResult(view.result),
  };
}

/** A whole group as the API sends it. */
export function toWireGroup(group: { taskId: string; results: RolloutResult[] }): WireGroup {
  return { task_id: group.taskId, results: group.results.map(toWireResult) };
}

/** Every error body: RolloutError.toJSON(). */
export const ErrorBody = z
  .strictObject({
    error: z.strictObject({
      code: z.enum(Object.keys(ERROR_CODES) as [RolloutErrorCode, ...RolloutErrorCode[]]),
      message: z.string(),
      retryable: z.boolean(),
      /** Structured detail, e.g. the zod issues of a 422 (each with its `path`). */
      details: z.unknown().optional(),
    }),
  })
  .openapi('Error');

const ERROR_RESPONSES = {
  400: 'Malformed request (not JSON, a bad query value)',
  401: 'Missing or wrong bearer token',
  404: 'Unknown rollout, task, environment or backend',
  409: 'Conflict (a task id submitted before with another body, a rollout not finished yet, a backend id in use)',
  413: 'The body is larger than the service reads (`--max-body-mib`); refused before it is read whole, `details.max_bytes` says how much it takes',
  422: 'The body or query does not fit the schema; the message and `details` name the fields',
  503: 'The service is shutting down',
} as const;

/** The declared error responses of a route (every route that needs the token also answers 401). */
export function errorResponses<S extends keyof typeof ERROR_RESPONSES>(...statuses: S[]) {
  return Object.fromEntries(
    statuses.map((status) => [status, { description: ERROR_RESPONSES[status], content: { 'application/json': { schema: ErrorBody } } }]),
  ) as unknown as Record<S, { description: string; content: { 'application/json': { schema: typeof ErrorBody } } }>;
}

const camelToSnake = (key: string) => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** An LLM backend as `/v1/llm-backends` and `/v1/status` show it (LlmBackendStats, snake_case). */
export const WireBackend = z
  .looseObject({
    id: z.string(),
    base_url: z.string(),
    model: z.string().nullable(),
    max_concurrency: z.number().int().nullable(),
    healthy: z.boolean(),
    /** Rollouts stuck to this backend. */
    rollouts_in_flight: z.number().int(),
    requests_in_flight: z.number().int(),
    requests: z.number().int(),
    failures: z.number().int(),
    connect_failures: z.number().int(),
    latency_ms: z.strictObject({ last: z.number().nullable(), mean: z.number().nullable() }),
    last_error: z.string().nullable(),
    /** When an unhealthy backend is probed next. */
    next_probe_in_ms: z.number().nullable(),
  })
  .openapi('LlmBackend');
export type WireBackend = z.infer<typeof WireBackend>;

/** A backend registry's entry with its top-level keys in snake_case (they are rollserve's own). */
export function toWireBackend(stats: unknown): WireBackend {
  return Object.fromEntries(Object.entries(stats as Record<string, unknown>).map(([key, value]) => [camelToSnake(key), value])) as WireBackend;
}

const StageStatus = z.strictObject({ queued: z.number().int(), active: z.number().int(), pool: z.number().int() });

export const WireStatus = z
  .strictObject({
    stages: z.strictObject({ init: StageStatus, run: StageStatus, eval: StageStatus }),
    rollouts: z.strictObject({ total: z.number().int(), done: z.number().int(), failed: z.number().int(), cancelled: z.number().int(), in_flight: z.number().int() }),
    live_sessions: z.number().int(),
    live_sandboxes: z.number().int(),
    /** Rollout nodes up (GET /v1/nodes); 0: the service runs rollouts itself. Stages and sessions are the service's own. */
    nodes: z.number().int(),
    environments: z.array(z.string()),
    llm_backends: z.array(WireBackend),
    /** What stops work from going on now, e.g. rollouts waiting for a policy backend when there is none. */
    warnings: z.array(z.string()),
  })
  .openapi('Status');
export type WireStatus = z.infer<typeof WireStatus>;

/** The service's status as `/v1/status` sends it. */
export function toWireStatus(status: ReturnType<RolloutService['status']>, extra: { environments: string[]; backends: unknown[]; warnings: string[] }): WireStatus {
  const { inFlight, ...rollouts } = status.rollouts;
  return {
    stages: status.stages,
    rollouts: { ...rollouts, in_flight: inFlight },
    live_sessions: status.liveSessions,
    live_sandboxes: status.liveSandboxes,
    nodes: status.nodes,
    environments: extra.environments,
    llm_backends: extra.backends.map(toWireBackend),
    warnings: extra.warnings,
  };
}

/** ?view=training: already snake_case (training-view.ts); declared loosely, as its own module documents it. */
export const TrainingView = z
  .looseObject({
    id: z.string(),
    task_id: z.string(),
    sample_index: z.number().int(),
    reward: z.number(),
    advantage: z.number().nullable(),
    filter: z.boolean(),
    prompt_ids: z.array(z.number().int()).nullable(),
    response_ids: z.array(z.number().int()).nullable(),
    response_mask: z.array(z.number().int()).nullable(),
    response_logprobs: z.array(z.number()).nullable(),
    response_turn: z.array(z.number().int()).nullable(),
    sequence_error: z.string().nullable(),
    turns: z.array(z.record(z.string(), z.unknown())),
    credit: z.record(z.string(), z.unknown()).nullable(),
  })
  .openapi('TrainingView');

export const TrainingGroup = z.strictObject({ task_id: z.string(), results: z.array(TrainingView) }).openapi('TrainingGroup');

/** A whole group, its samples as training views (`view=training`). */
export const toTrainingGroup = (group: { taskId: string; results: RolloutResult[] }) => ({ task_id: group.taskId, results: group.results.map(trainingView) });

/** `?view=`: omitted (results as they are) or `training` (what a loss needs, each token id once). */
export const ViewParam = z
  .string()
  .optional()
  .openapi({ enum: ['training'], description: "training: training views (already snake_case): the first prompt, one response sequence with its mask, logprobs and each token's turn, per-turn credit; each token id once, where a result repeats the conversation in every turn" });

/** Whether `?view=` asks for training views; any other value is a 400. */
export function wantsTrainingView(view: string | undefined): boolean {
  if (view !== undefined && view !== 'training') throw new RolloutError({ code: 'BAD_REQUEST', message: `view is "training" or omitted, not "${view}"` });
  return view === 'training';
}
