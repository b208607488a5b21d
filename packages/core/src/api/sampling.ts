import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import { RolloutError } from '../errors.ts';
import { SamplingStatus } from '../protocol/sampling.ts';
import { KEEP_ENDED_SAMPLINGS } from '../service/dynamic-sampling.ts';
import type { ApiContext } from './context.ts';
import { errorResponses } from './wire.ts';

export const SamplingIdParam = z.object({
  id: z.string().min(1).openapi({ param: { name: 'id', in: 'path' }, description: "A dynamic sampling's id (`sampling.id` of the submit's 202)" }),
});

const STATUS_200 = { description: 'The sampling: its state, counts and each group tried', content: { 'application/json': { schema: SamplingStatus } } };

const getRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts/sampling/{id}',
  summary: 'A dynamic sampling (POST /v1/rollouts with `dynamic_sampling`): state, counts (tried, kept, dropped as all-equal, filtered, cancelled) and each group tried',
  request: { params: SamplingIdParam },
  responses: { 200: STATUS_200, ...errorResponses(401, 404, 422) },
});

const stopRoute = createRoute({
  method: 'delete',
  path: '/v1/rollouts/sampling/{id}',
  summary: 'Stops a dynamic sampling: no more groups start, its running groups are cancelled (their samples stay readable by id); its stream ends with what was kept',
  request: { params: SamplingIdParam },
  responses: { 200: STATUS_200, ...errorResponses(401, 404, 422) },
});

/** The 404 of a sampling id not known (never started, or ended before the last KEEP_ENDED_SAMPLINGS). */
export const unknownSampling = (id: string) =>
  new RolloutError({ code: 'NOT_FOUND', message: `no dynamic sampling "${id}" (running samplings and the last ${KEEP_ENDED_SAMPLINGS.toLocaleString('en-US')} to end are kept)` });

/** GET/DELETE /v1/rollouts/sampling/{id} (its stream is in stream.ts). */
export function samplingApi({ service }: ApiContext): OpenAPIHono {
  const app = new OpenAPIHono();

  app.openapi(getRoute, async (c) => {
    const { id } = c.req.valid('param');
    const sampling = await service.sampling(id);
    if (!sampling) throw unknownSampling(id);
    return c.json(sampling.status(), 200);
  });

  app.openapi(stopRoute, async (c) => {
    const { id } = c.req.valid('param');
    const sampling = await service.stopSampling(id);
    if (!sampling) throw unknownSampling(id);
    return c.json(sampling.status(), 200);
  });

  return app;
}
