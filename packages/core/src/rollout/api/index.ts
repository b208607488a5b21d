import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { MiddlewareHandler } from 'hono';
import { bearerAuth } from 'hono/bearer-auth';
import { HTTPException } from 'hono/http-exception';
import { RolloutError } from '../../errors.ts';
import { checkToken } from '../../gym/bind-policy.ts';
import { rolloutOpenApi } from '../openapi.ts';
import type { RolloutService } from '../service.ts';
import { backendsApi } from './backends.ts';
import type { ApiContext, RolloutApiOptions } from './context.ts';
import { docsApi } from './docs.ts';
import { errorResponses } from './wire.ts';
import { gymAgentApi } from './gym-agent.ts';
import { nodesApi } from './nodes.ts';
import { prorlApi } from './prorl.ts';
import { BackendWarnings, rolloutsApi } from './rollouts.ts';
import { statusApi } from './status.ts';
import { streamApi } from './stream.ts';

export type { ApiContext, BackendRegistry, RolloutApiOptions } from './context.ts';
export * from './wire.ts';

/** Routes that answer without the token. */
const PUBLIC = new Set(['/health', '/openapi.json', '/docs']);
const isPublic = (path: string) => PUBLIC.has(path) || path.startsWith('/docs/');

/** A validation failure is a 422 naming each offending field (in its message and `details`). */
function validationHook(result: { success: boolean; error?: z.ZodError }): void {
  if (!result.success && result.error) {
    throw new RolloutError({ code: 'UNPROCESSABLE', message: z.prettifyError(result.error), details: result.error.issues });
  }
}

/** What an HTTPException thrown by a validator (body not JSON, wrong content-type) is, as a RolloutError. */
function fromHttpException(error: HTTPException): RolloutError {
  if (error.status === 415) return new RolloutError({ code: 'BAD_REQUEST', message: 'the body must be JSON, sent with content-type: application/json' });
  if (error.status === 413) return new RolloutError({ code: 'PAYLOAD_TOO_LARGE', message: error.message || 'the body is too large' });
  if (error.status === 400) return new RolloutError({ code: 'BAD_REQUEST', message: `the body is not JSON: ${error.message}` });
  return RolloutError.from(error);
}

function auth(token: string): MiddlewareHandler {
  // A 401 for a malformed header too (bearerAuth's own is a 400), in the one error shape.
  const body = JSON.stringify(new RolloutError({ code: 'UNAUTHORIZED', message: 'a valid bearer token is required' }).toJSON());
  const unauthorized = () => new Response(body, { status: 401, headers: { 'content-type': 'application/json' } });
  const check = bearerAuth({
    token: checkToken(token),
    noAuthenticationHeader: { message: unauthorized },
    invalidAuthenticationHeader: { message: unauthorized },
    invalidToken: { message: unauthorized },
  });
  return (c, next) => (isPublic(c.req.path) ? next() : check(c, next));
}

const OpenApiDocument = z.looseObject({ openapi: z.string(), info: z.looseObject({ title: z.string() }), paths: z.record(z.string(), z.unknown()) });

const documentRoute = createRoute({
  method: 'get',
  path: '/openapi.json',
  summary: 'This document (OpenAPI 3.1), generated from the routes and their schemas',
  security: [],
  responses: {
    200: {
      description: 'OpenAPI 3.1',
      content: { 'application/json': { schema: OpenApiDocument } },
    },
  },
});

/**
 * The rollout service's HTTP API (JSON; results also as NDJSON or SSE streams), one module per
 * group of routes, each route declared with its schemas: /openapi.json is generated from them.
 * Every error body is `{"error": {code, message, retryable, details?}}`, built from RolloutError.
 */
export function createRolloutApi(service: RolloutService, options: RolloutApiOptions = {}): OpenAPIHono {
  const app = new OpenAPIHono({ defaultHook: validationHook });
  const ctx: ApiContext = { service, options };

  app.onError((error, c) => {
    if (error instanceof HTTPException && error.status === 401) return error.getResponse(); // bearerAuth's
    const wrapped = error instanceof HTTPException ? fromHttpException(error) : RolloutError.from(error);
    if (wrapped.status >= 500) service.logger.error({ err: error, path: c.req.path }, 'request failed');
    return c.json(wrapped.toJSON(), wrapped.status as 500);
  });
  app.notFound((c) => c.json(new RolloutError({ code: 'NOT_FOUND', message: `no route ${c.req.method} ${c.req.path}` }).toJSON(), 404));
  if (options.token) app.use('*', auth(options.token));

  const warnings = new BackendWarnings(ctx);
  app.route('/', statusApi(ctx, warnings));
  app.route('/', streamApi(ctx)); // before /v1/rollouts/{id}, which would take /v1/rollouts/stream
  app.route('/', rolloutsApi(ctx, warnings));
  app.route('/', backendsApi(ctx));
  app.route('/', docsApi());
  app.route('/', prorlApi(ctx));
  app.route('/', gymAgentApi(ctx));
  app.route('/', nodesApi(ctx));

  // bearerAuth guards every route but the public ones, so each of them answers 401 too.
  const unauthorized = errorResponses(401)[401];
  for (const def of app.openAPIRegistry.definitions) {
    if (def.type === 'route' && !isPublic(def.route.path) && !def.route.responses[401]) def.route = { ...def.route, responses: { ...def.route.responses, 401: unauthorized } };
  }

  let document: z.infer<typeof OpenApiDocument> | undefined; // generated once, on first request: every module is mounted by then
  app.openapi(documentRoute, (c) => c.json((document ??= rolloutOpenApi(app) as z.infer<typeof OpenApiDocument>), 200));
  return app;
}
