import { createHash, timingSafeEqual } from 'node:crypto';
import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { Context, MiddlewareHandler } from 'hono';
import { bearerAuth } from 'hono/bearer-auth';
import { HTTPException } from 'hono/http-exception';
import { RolloutError } from '../errors.ts';
import { checkToken } from '../server/bind-policy.ts';
import { bodyTooLargeBody } from '../server/fastapi-errors.ts';
import { stripRolloutPrefix } from '../server/fastapi.ts';
import { nodeBindings, readBodyBytes, requestHeader } from '../server/fastapi-hono.ts';
import { BodyTooLargeError, decodeInTurn, DEFAULT_MAX_BODY_BYTES, LARGE_BODY_BYTES } from '../server/read-body.ts';
import { operationOf, rolloutOpenApi } from './openapi.ts';
import type { RolloutService } from '../service/service.ts';
import { backendsApi } from './backends.ts';
import { weightsApi } from './weights.ts';
import type { ApiContext, RolloutApiOptions } from './context.ts';
import { docsApi } from './docs.ts';
import { notJson, unprocessable } from './parse.ts';
import { errorResponses } from './wire.ts';
import { gymAgentApi } from './gym-agent.ts';
import { nodesApi } from './nodes.ts';
import { prorlApi } from './prorl.ts';
import { BackendWarnings, rolloutsApi } from './rollouts.ts';
import { samplingApi } from './sampling.ts';
import { statusApi } from './status.ts';
import { streamApi } from './stream.ts';

export type { ApiContext, BackendRegistry, RolloutApiOptions } from './context.ts';
export * from './wire.ts';

/** Routes that answer without the token. */
const PUBLIC = new Set(['/health', '/openapi.json', '/docs']);
const isPublic = (path: string) => PUBLIC.has(path) || path.startsWith('/docs/');

/** A validation failure is a 422 naming each offending field (in its message and `details`). */
function validationHook(result: { success: boolean; error?: z.ZodError }): void {
  if (!result.success && result.error) throw unprocessable(result.error);
}

/** What an HTTPException thrown by a validator (body not JSON, wrong content-type) is, as a RolloutError. */
function fromHttpException(error: HTTPException): RolloutError {
  if (error.status === 415) return new RolloutError({ code: 'BAD_REQUEST', message: 'the body must be JSON, sent with content-type: application/json' });
  if (error.status === 413) return new RolloutError({ code: 'PAYLOAD_TOO_LARGE', message: error.message || 'the body is too large' });
  if (error.status === 400) return notJson(error);
  return RolloutError.from(error);
}

/** The rollout-node routes: registering, and every call of a node (listing the nodes is the trainer's). */
const isNodeRoute = (method: string, path: string) => path.startsWith('/v1/nodes/') || (path === '/v1/nodes' && method === 'POST');

const digest = (text: string) => createHash('sha256').update(text).digest();

/**
 * The password of an HTTP Basic header. NeMo Gym's and ProRL's clients send no header of their
 * own: they call `http://{host}:{port}`, and aiohttp (as requests) sends the credentials of a URL
 * such as `http://rollserve:TOKEN@host:port` as Basic, so a host configured as `rollserve:TOKEN@host`
 * carries the token.
 */
function basicPassword(c: Context): string | undefined {
  const match = /^Basic +([A-Za-z0-9+/]+=*) *$/i.exec(requestHeader(c, 'authorization') ?? '');
  if (!match) return undefined;
  const decoded = Buffer.from(match[1]!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon < 0 ? undefined : decoded.slice(colon + 1);
}

function auth(token: string | undefined, nodeToken: string | undefined): MiddlewareHandler {
  // A 401 for a malformed header too (bearerAuth's own is a 400), in the one error shape; on the
  // faces that stand in for FastAPI servers, FastAPI's (HTTPBearer's detail and challenge, as the
  // environments' resources servers answer), since their clients read `detail`.
  const body = JSON.stringify(new RolloutError({ code: 'UNAUTHORIZED', message: 'a valid bearer token is required' }).toJSON());
  const unauthorized = (c: Context, detail: string) =>
    isFastApiPath(c.req.path)
      ? new Response(JSON.stringify({ detail }), { status: 401, headers: { 'content-type': 'application/json', 'www-authenticate': 'Bearer' } })
      : new Response(body, { status: 401, headers: { 'content-type': 'application/json' } });
  const missing = (c: Context) => unauthorized(c, FASTAPI_NOT_AUTHENTICATED);
  const invalid = (c: Context) => unauthorized(c, FASTAPI_INVALID_CREDENTIALS);
  const bearer = (value: string) =>
    bearerAuth({
      token: checkToken(value),
      noAuthenticationHeader: { message: missing },
      invalidAuthenticationHeader: { message: invalid },
      invalidToken: { message: invalid },
    });
  const check = token ? bearer(token) : undefined;
  const checkNode = nodeToken ? bearer(nodeToken) : check;
  const tokenDigest = token ? digest(token) : undefined;
  return (c, next) => {
    if (isPublic(c.req.path)) return next();
    if (tokenDigest && isFastApiPath(c.req.path)) {
      const password = basicPassword(c);
      if (password !== undefined && timingSafeEqual(digest(password), tokenDigest)) return next();
    }
    const guard = isNodeRoute(c.req.method, c.req.path) ? checkNode : check;
    return guard ? guard(c, next) : next();
  };
}

/** FastAPI's HTTPBearer details: no credentials, and credentials that are not the token. */
const FASTAPI_NOT_AUTHENTICATED = 'Not authenticated';
const FASTAPI_INVALID_CREDENTIALS = 'Invalid authentication credentials';

/** The faces that stand in for Python servers (ProRL's, a NeMo Gym agent's) answer as FastAPI does. */
const FASTAPI_PATHS = new Set(['/start', '/stop', '/status', '/process', '/cancel', '/add_llm_server', '/clear_llm_server', '/run', '/aggregate_metrics']);
const isFastApiPath = (path: string) => FASTAPI_PATHS.has(stripRolloutPrefix(path).path);
/** A node's batch of results, token ids and all: room for several 20-turn rollouts. */
const NODE_RESULTS = /^\/v1\/nodes\/[^/]+\/results$/;
const RESULTS_FACTOR = 4;

/**
 * Every request body is read here, before any route sees it, and at most `maxBytes` of it (4 times
 * that for a node's results): a Content-Length above the cap is a 413 before a byte is read, a
 * chunked body is counted as it streams and cut at the cap (see readNodeBody). The bytes are then
 * the request's body for the route (@hono/node-server's `rawBody`); a large JSON body is parsed in
 * its turn (decodeInTurn), so that many of them at once hold other requests up for one parse,
 * not all.
 */
function bodyLimit(maxBytes: number): MiddlewareHandler {
  return async (c, next) => {
    const path = c.req.path;
    const cap = NODE_RESULTS.test(path) ? maxBytes * RESULTS_FACTOR : maxBytes;
    const { incoming } = nodeBindings(c);
    // a GET without a body (no Content-Length or 0, not chunked): nothing to read, nothing to wait for
    if (c.req.method === 'GET' || c.req.method === 'HEAD') {
      const length = requestHeader(c, 'content-length');
      if ((length === undefined || length === '0') && requestHeader(c, 'transfer-encoding') === undefined) return next();
    }
    let bytes: Uint8Array;
    try {
      // the FastAPI faces' routes read these same bytes (readBodyBytes keeps them)
      bytes = await readBodyBytes(c, cap);
    } catch (error) {
      if (error instanceof BodyTooLargeError) return tooLarge(c, path, error.maxBytes);
      throw error;
    }
    const buffer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
    if (incoming) {
      // what reads the web Request gets these bytes (@hono/node-server's rawBody), and the
      // validators (c.req.json(), c.req.text()) their text without building that Request, which
      // cost more than the rest of a submit's HTTP handling
      (incoming as { rawBody?: Buffer }).rawBody = buffer;
      let text: Promise<string> | undefined;
      Object.defineProperty(c.req.bodyCache, 'text', { enumerable: true, configurable: true, get: () => (text ??= Promise.resolve(buffer.toString('utf8'))) });
    } else {
      c.req.raw = new Request(c.req.raw, { body: bytes.length > 0 ? bytes : null });
    }
    if (bytes.length >= LARGE_BODY_BYTES && !isFastApiPath(path) && /json/i.test(requestHeader(c, 'content-type') ?? '')) {
      // the routes' validators call c.req.json(): it answers what was parsed in turn
      const text = buffer.toString('utf8');
      const parsed = await decodeInTurn(bytes.length, () => {
        try {
          return { value: JSON.parse(text) as unknown };
        } catch (error) {
          return { error };
        }
      });
      (c.req as { json: () => Promise<unknown> }).json = () => ('error' in parsed ? Promise.reject(parsed.error) : Promise.resolve(parsed.value));
    }
    return next();
  };
}

const BodyTooLargeDetail = z.object({ detail: z.string() }).openapi('BodyTooLargeDetail');
const UnauthorizedDetail = z.object({ detail: z.string() }).openapi('UnauthorizedDetail');

function tooLarge(c: Context, path: string, maxBytes: number): Response {
  if (isFastApiPath(path)) return c.json(bodyTooLargeBody(maxBytes), 413);
  const error = new RolloutError({ code: 'PAYLOAD_TOO_LARGE', message: `the request body is larger than the ${maxBytes} bytes this route accepts`, details: { max_bytes: maxBytes } });
  return c.json(error.toJSON(), 413);
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
  if (options.token || options.nodeToken) app.use('*', auth(options.token, options.nodeToken));
  app.use('*', bodyLimit(options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES));

  const warnings = new BackendWarnings(ctx);
  app.route('/', statusApi(ctx, warnings));
  app.route('/', streamApi(ctx)); // before /v1/rollouts/{id}, which would take /v1/rollouts/stream
  app.route('/', samplingApi(ctx));
  app.route('/', rolloutsApi(ctx, warnings));
  app.route('/', backendsApi(ctx));
  app.route('/', weightsApi(ctx));
  app.route('/', docsApi());
  app.route('/', prorlApi(ctx));
  app.route('/', gymAgentApi(ctx));
  app.route('/', nodesApi(ctx));
  let document: z.infer<typeof OpenApiDocument> | undefined; // generated once, on first request: every module is mounted by then
  app.openapi(documentRoute, (c) => c.json((document ??= rolloutOpenApi(app) as z.infer<typeof OpenApiDocument>), 200));

  // bearerAuth guards every route but the public ones, so each of them answers 401 too; and every
  // route that takes a body answers 413 for one above the cap, in its face's shape. Each gets its
  // stable operationId and tag (api/openapi.ts).
  const unauthorized = errorResponses(401)[401];
  const unauthorizedFastApi = { description: unauthorized.description, content: { 'application/json': { schema: UnauthorizedDetail } } };
  const tooLargeRollout = errorResponses(413)[413];
  const tooLargeFastApi = { description: tooLargeRollout.description, content: { 'application/json': { schema: BodyTooLargeDetail } } };
  for (const def of app.openAPIRegistry.definitions) {
    if (def.type !== 'route') continue;
    def.route = { ...def.route, ...operationOf(def.route.method, def.route.path) };
    const fastApi = isFastApiPath(def.route.path.replace(/\{(\w+)\}/g, 'x'));
    if (!isPublic(def.route.path) && !def.route.responses[401]) def.route = { ...def.route, responses: { ...def.route.responses, 401: fastApi ? unauthorizedFastApi : unauthorized } };
    if (def.route.request?.body && !def.route.responses[413]) {
      const tooLarge = fastApi ? tooLargeFastApi : tooLargeRollout;
      def.route = { ...def.route, responses: { ...def.route.responses, 413: tooLarge } };
    }
  }

  return app;
}
