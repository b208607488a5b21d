import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import { RolloutError } from '../errors.ts';
import type { ApiContext } from './context.ts';
import { errorResponses } from './wire.ts';

const Version = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const BackendIds = z.array(z.string().min(1)).min(1).max(10_000);

/** The weight state (llm/weights.ts's WeightState) and generations in flight. */
export const WeightStateBody = z
  .strictObject({
    /** The greatest version announced so far: what staleness bounds are measured against. */
    newest: z.number().int().nullable(),
    /** The version every backend serves unless `backends` names it (the last announcement to all). */
    default: z.number().int().nullable(),
    /** Versions announced for named backends since the last announcement to all. */
    backends: z.record(z.string(), z.number().int()),
    /** Set while generation is paused for a weight update (kept across a restart of the service). */
    pause: z.strictObject({ mode: z.enum(['abort', 'finish']), since: z.string() }).nullable(),
    /** Policy generations in flight now. */
    in_flight: z.number().int(),
  })
  .openapi('WeightState');

export const AnnounceWeights = z
  .strictObject({
    /** The integer version the backends serve now (e.g. the trainer's step after a weight sync). */
    version: Version,
    /** The backends (ids, `GET /v1/llm-backends`) that serve it; omitted: all of them, and any added later. */
    backends: BackendIds.optional(),
  })
  .openapi('AnnounceWeights');

export const PauseGeneration = z
  .strictObject({
    /**
     * abort (the default, as vLLM's `/pause` and AReaL's `pause_generation`): generations in flight
     * are aborted and generated again on the new weights after the resume, recorded once.
     * finish: they end on the old weights (and keep that version).
     */
    mode: z.enum(['abort', 'finish']).default('abort'),
  })
  .openapi('PauseGeneration');

export const PauseOutcomeBody = z
  .strictObject({
    mode: z.enum(['abort', 'finish']),
    /** Generations in flight when the pause began. */
    in_flight: z.number().int(),
    /** Of those, aborted (each is generated again after the resume). */
    aborted: z.number().int(),
    /** How long the pause waited for them to end: none is in flight once it answers. */
    drained_ms: z.number(),
    state: WeightStateBody.omit({ in_flight: true }),
  })
  .openapi('PauseOutcome');

export const ResumeGeneration = z
  .strictObject({
    /** The version the update loaded (announced, then generation resumes on it); omitted: the update failed, the old weights go on. */
    version: Version.optional(),
    /** With `version`: the backends it was loaded into; omitted: all. */
    backends: BackendIds.optional(),
  })
  .openapi('ResumeGeneration');

export const ResumeOutcome = WeightStateBody.extend({
  /** How long generation was paused. */
  paused_ms: z.number(),
}).openapi('ResumeOutcome');

const json = <T extends z.ZodType>(schema: T) => ({ 'application/json': { schema } });

const getRoute = createRoute({
  method: 'get',
  path: '/v1/weights',
  summary: 'Weight versions announced, the newest, and whether generation is paused for a weight update',
  responses: { 200: { description: 'The weight state', content: json(WeightStateBody) }, ...errorResponses(401, 404) },
});

const announceRoute = createRoute({
  method: 'post',
  path: '/v1/weights',
  summary: 'Announce the weight version the backends serve (after a weight sync); every turn records its backend\'s version',
  request: { body: { required: true, content: json(AnnounceWeights) } },
  responses: { 200: { description: 'The weight state', content: json(WeightStateBody) }, ...errorResponses(400, 401, 404, 422) },
});

const pauseRoute = createRoute({
  method: 'post',
  path: '/v1/weights/pause',
  summary: 'Pause generation for a weight update: no new policy call starts; in-flight ones are aborted or finish. Answers once none is in flight',
  request: { body: { required: false, content: json(PauseGeneration) } },
  responses: { 200: { description: 'Paused', content: json(PauseOutcomeBody) }, ...errorResponses(400, 401, 404, 422) },
});

const resumeRoute = createRoute({
  method: 'post',
  path: '/v1/weights/resume',
  summary: 'Resume generation: with a version, on the new weights; without, on the old ones (the update failed)',
  request: { body: { required: false, content: json(ResumeGeneration) } },
  responses: { 200: { description: 'Resumed', content: json(ResumeOutcome) }, ...errorResponses(400, 401, 404, 422) },
});

/**
 * /v1/weights: the trainer's side of asynchronous RL (weight versions, pauses for weight updates).
 * These are the trainer's routes: with a token set, they take it and refuse a node's.
 */
export function weightsApi({ service, options }: ApiContext): OpenAPIHono {
  const app = new OpenAPIHono();
  // the backends a body names must be the service's
  const known = (backends: readonly string[] | undefined) => {
    if (!backends || !options.backends) return;
    const ids = new Set(options.backends.list().map((backend) => (backend as { id: string }).id));
    const unknown = backends.filter((id) => !ids.has(id));
    if (unknown.length > 0) throw new RolloutError({ code: 'NOT_FOUND', message: `no LLM backend ${unknown.map((id) => JSON.stringify(id)).join(', ')}` });
  };

  app.openapi(getRoute, (c) => c.json(service.weightState(), 200));

  app.openapi(announceRoute, async (c) => {
    const { version, backends } = c.req.valid('json');
    known(backends);
    return c.json(await service.announceWeights(version, backends), 200);
  });

  app.openapi(pauseRoute, async (c) => {
    const body = optionalBody(await c.req.text(), PauseGeneration);
    return c.json(await service.pauseGeneration(body.mode), 200);
  });

  app.openapi(resumeRoute, async (c) => {
    const body = optionalBody(await c.req.text(), ResumeGeneration);
    if (body.backends && body.version === undefined) throw new RolloutError({ code: 'UNPROCESSABLE', message: 'backends: named only with a version' });
    known(body.backends);
    return c.json(await service.resumeGeneration(body.version, body.backends), 200);
  });

  return app;
}

/** A body that may be absent (then `{}`): a bare `POST /v1/weights/pause` pauses with the defaults. */
function optionalBody<T extends z.ZodType>(text: string, schema: T): z.output<T> {
  let value: unknown = {};
  if (text.trim() !== '') {
    try {
      value = JSON.parse(text);
    } catch {
      throw new RolloutError({ code: 'BAD_REQUEST', message: 'the body is not JSON' });
    }
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) {
    throw new RolloutError({ code: 'UNPROCESSABLE', message: z.prettifyError(parsed.error), details: parsed.error.issues });
  }
  return parsed.data;
}
