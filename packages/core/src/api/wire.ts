import { z } from '@hono/zod-openapi';
import { ERROR_CODES, RolloutError, type RolloutErrorCode } from '../errors.ts';
import { trainingView, type TrainingViewOptions } from '../protocol/training-view.ts';
import type { RolloutGroup } from '../protocol/rollout.ts';

// Results go out as protocol/rollout.ts declares them (snake_case inside as on the wire); what
// follows are the API's own bodies.

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

/** An LLM backend as `/v1/llm-backends` and `/v1/status` show it: LlmBackendStats (llm/backend-pool.ts), declared loosely. */
export const LlmBackend = z
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
    /** The weight version it serves, as the trainer announced it (`POST /v1/weights`); null before any. */
    weight_version: z.number().int().nullable(),
  })
  .openapi('LlmBackend');

/** The backends as the API lists them: each with the weight version it serves. */
export const listedBackends = ({ service, options }: { service: { weightVersionOf(id: string): number | null }; options: { backends?: { list(): unknown[] } | undefined } }) =>
  (options.backends?.list() ?? []).map((backend) => ({ ...(backend as object), weight_version: service.weightVersionOf((backend as { id: string }).id) })) as Array<
    z.infer<typeof LlmBackend>
  >;

const StageStatus = z.strictObject({ queued: z.number().int(), active: z.number().int(), pool: z.number().int() });

/** `/v1/status`: RolloutService.status(), then what the API adds (its environments, backends and warnings). */
export const Status = z
  .strictObject({
    stages: z.strictObject({ init: StageStatus, run: StageStatus, eval: StageStatus }),
    rollouts: z.strictObject({
      total: z.number().int(),
      done: z.number().int(),
      failed: z.number().int(),
      cancelled: z.number().int(),
      in_flight: z.number().int(),
      /** Results since the service started whose turns drifted (chat mode's re-tokenisation): their training views have no sequence (`sequence_error`). */
      drifted: z.number().int(),
    }),
    live_sessions: z.number().int(),
    live_sandboxes: z.number().int(),
    /** Rollout nodes up (GET /v1/nodes); 0: the service runs rollouts itself. Stages and sessions are the service's own. */
    nodes: z.number().int(),
    environments: z.array(z.string()),
    llm_backends: z.array(LlmBackend),
    /** What stops work from going on now, e.g. rollouts waiting for a policy backend when there is none. */
    warnings: z.array(z.string()),
    /** Weight versions (`GET /v1/weights`): the newest announced, whether generation is paused for a weight update; null when the service does not route the policy's turns. */
    weights: z
      .strictObject({ newest: z.number().int().nullable(), default: z.number().int().nullable(), paused: z.boolean(), in_flight: z.number().int() })
      .nullable(),
  })
  .openapi('Status');

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
    /** The last turn's finish reason ("stop", "length", "tool_calls"); each turn has its own. */
    finish_reason: z.string().nullable(),
    /** Cut by `max_response_tokens`, or the last generation stopped on "length". */
    truncated: z.boolean(),
    turns: z.array(z.record(z.string(), z.unknown())),
    credit: z.record(z.string(), z.unknown()).nullable(),
    /** The oldest and newest weight version of its turns (each turn's is `turns[].weight_version`). */
    weight_version_min: z.number().int().nullable(),
    weight_version_max: z.number().int().nullable(),
    stale: z.boolean(),
  })
  .openapi('TrainingView');

export const TrainingGroup = z.strictObject({ task_id: z.string(), results: z.array(TrainingView) }).openapi('TrainingGroup');

/** A whole group, its samples as training views (`view=training`). */
export const toTrainingGroup = (group: RolloutGroup, options: TrainingViewOptions = {}) => ({
  task_id: group.task_id,
  results: group.results.map((result) => trainingView(result, options)),
});

/** `?view=`: omitted (results as they are) or `training` (what a loss needs, each token id once). */
export const ViewParam = z
  .string()
  .optional()
  .openapi({ enum: ['training'], description: "training: training views (already snake_case): the first prompt, one response sequence with its mask, logprobs and each token's turn, per-turn credit; each token id once, where a result repeats the conversation in every turn" });

/** `max_response_tokens`: the training view's response-length cap (verl's `max_response_length`). */
export const MaxResponseTokens = z.coerce
  .number()
  .int()
  .positive()
  .optional()
  .openapi({
    type: 'integer',
    minimum: 1,
    description:
      'With `view=training`: cut each response (ids, mask, logprobs, turns, spans) to this many tokens; a view cut so, or whose last generation stopped on "length", is `truncated: true`',
  });

/**
 * `overlong`: what the training view does with a response that is `truncated` (cut by the cap, or
 * its last generation stopped on "length"): `keep` (the default) leaves its mask, `mask` zeroes it,
 * so that the sample is in the batch but takes no part in the loss: SkyRL's
 * `apply_overlong_filtering`, DAPO's overlong filtering.
 */
export const Overlong = z
  .enum(['keep', 'mask'])
  .optional()
  .openapi({
    description:
      'With `view=training`: `mask` zeroes the `response_mask` of a `truncated` view (overlong filtering: in the batch, out of the loss, as SkyRL\'s `apply_overlong_filtering`); `keep` (the default) leaves it',
  });

/** The training-view knobs a request may carry. */
export interface ViewKnobs {
  max_response_tokens?: number | undefined;
  overlong?: 'keep' | 'mask' | undefined;
}

/** The training view's options of a request; a knob without `view=training` is a 400. */
export function trainingViewOptions(training: boolean, knobs: ViewKnobs): TrainingViewOptions {
  const { max_response_tokens: cap, overlong } = knobs;
  if (cap === undefined && overlong === undefined) return {};
  if (!training) throw new RolloutError({ code: 'BAD_REQUEST', message: `${cap !== undefined ? 'max_response_tokens' : 'overlong'} applies to view=training only` });
  return { ...(cap !== undefined ? { maxResponseTokens: cap } : {}), ...(overlong === 'mask' ? { maskTruncated: true } : {}) };
}

/** Whether `?view=` asks for training views; any other value is a 400. */
export function wantsTrainingView(view: string | undefined): boolean {
  if (view !== undefined && view !== 'training') throw new RolloutError({ code: 'BAD_REQUEST', message: `view is "training" or omitted, not "${view}"` });
  return view === 'training';
}
