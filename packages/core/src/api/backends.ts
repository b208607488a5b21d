import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import { RolloutError } from '../errors.ts';
import type { ApiContext } from './context.ts';
import { errorResponses, LlmBackend, listedBackends } from './wire.ts';

export const AddBackend = z
  .strictObject({
    /** Default: the URL's host:port. */
    id: z.string().min(1).optional(),
    /** An OpenAI-compatible base URL (`http://host:port/v1`). */
    base_url: z.url(),
    model: z.string().optional(),
    api_key: z.string().optional(),
    max_concurrency: z.number().int().positive().optional(),
  })
  .openapi('AddBackend');

const listRoute = createRoute({
  method: 'get',
  path: '/v1/llm-backends',
  summary: 'The policy inference servers and their health',
  responses: {
    200: { description: 'Backends', content: { 'application/json': { schema: z.strictObject({ backends: z.array(LlmBackend) }) } } },
    ...errorResponses(401),
  },
});

const addRoute = createRoute({
  method: 'post',
  path: '/v1/llm-backends',
  summary: 'Add an OpenAI-compatible inference server (a vLLM replica)',
  request: { body: { required: true, content: { 'application/json': { schema: AddBackend } } } },
  responses: {
    201: { description: 'Added', content: { 'application/json': { schema: z.strictObject({ id: z.string() }) } } },
    ...errorResponses(400, 401, 404, 409, 422, 503),
  },
});

const removeRoute = createRoute({
  method: 'delete',
  path: '/v1/llm-backends/{id}',
  summary: 'Remove a backend; its rollouts move on their next turn',
  request: { params: z.object({ id: z.string().min(1).openapi({ param: { name: 'id', in: 'path' } }) }) },
  responses: {
    200: { description: 'Removed', content: { 'application/json': { schema: z.strictObject({ removed: z.string() }) } } },
    ...errorResponses(401, 404),
  },
});

/** /v1/llm-backends: the policy's inference servers, managed at run time. */
export function backendsApi(ctx: ApiContext): OpenAPIHono {
  const { options } = ctx;
  const app = new OpenAPIHono();

  app.openapi(listRoute, (c) => c.json({ backends: listedBackends(ctx) }, 200));

  app.openapi(addRoute, (c) => {
    if (!options.backends) throw new RolloutError({ code: 'NOT_FOUND', message: 'this service manages no LLM backends' });
    const request = c.req.valid('json');
    const added = options.backends.add({
      baseUrl: request.base_url,
      ...(request.id ? { id: request.id } : {}),
      ...(request.model ? { model: request.model } : {}),
      ...(request.api_key ? { apiKey: request.api_key } : {}),
      ...(request.max_concurrency ? { maxConcurrency: request.max_concurrency } : {}),
    });
    return c.json({ id: added.id }, 201);
  });

  app.openapi(removeRoute, (c) => {
    const { id } = c.req.valid('param');
    if (!options.backends?.remove(id)) throw new RolloutError({ code: 'NOT_FOUND', message: `no LLM backend "${id}"` });
    return c.json({ removed: id }, 200);
  });

  return app;
}
