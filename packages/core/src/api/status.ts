import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { ApiContext } from './context.ts';
import type { BackendWarnings } from './rollouts.ts';
import { errorResponses, listedBackends, Status } from './wire.ts';

const statusRoute = createRoute({
  method: 'get',
  path: '/v1/status',
  summary: 'Per stage: queued, active, pool size; rollout counts; live sessions and sandboxes; LLM backends; warnings',
  responses: {
    200: { description: 'Status', content: { 'application/json': { schema: Status } } },
    ...errorResponses(401),
  },
});

const metricsRoute = createRoute({
  method: 'get',
  path: '/metrics',
  summary: 'Prometheus metrics',
  responses: {
    200: { description: 'Text exposition format', content: { 'text/plain': { schema: z.string() } } },
    ...errorResponses(401),
  },
});

const healthRoute = createRoute({
  method: 'get',
  path: '/health',
  summary: 'Liveness (no token needed)',
  security: [],
  responses: { 200: { description: 'ok', content: { 'application/json': { schema: z.strictObject({ status: z.literal('ok') }) } } } },
});

/** /v1/status, /metrics and /health. */
export function statusApi(ctx: ApiContext, warnings: BackendWarnings): OpenAPIHono {
  const { service } = ctx;
  const app = new OpenAPIHono();
  app.openapi(healthRoute, (c) => c.json({ status: 'ok' as const }, 200));
  app.openapi(statusRoute, async (c) => {
    const llm_backends = listedBackends(ctx);
    return c.json({ ...service.status(), environments: service.environments, llm_backends, warnings: await warnings.current(), weights: weightsStatus(service) }, 200);
  });
  app.openapi(metricsRoute, async (c) => c.text(await service.metrics.registry.metrics(), 200, { 'content-type': service.metrics.registry.contentType }));
  return app;
}

function weightsStatus(service: ApiContext['service']) {
  try {
    const { newest, default: version, pause, in_flight } = service.weightState();
    return { newest, default: version, paused: pause !== null, in_flight };
  } catch {
    return null; // no weight versions where the service does not route the policy's turns
  }
}
