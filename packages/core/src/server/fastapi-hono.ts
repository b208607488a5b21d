import type { IncomingMessage } from 'node:http';
import type { HttpBindings } from '@hono/node-server';
import type { Context, ErrorHandler } from 'hono';
import { HTTPException } from 'hono/http-exception';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import type { z } from 'zod';
import { bodyValue, fastApiErrorAnswer, validateBody, type FastApiErrorOptions } from './fastapi.ts';
import { fastApiJson, type FloatFields } from './fastapi-json.ts';
import { declaredLength, decodeRequestBodyInTurn, DEFAULT_MAX_BODY_BYTES, readNodeBody, readRequestBytes } from './read-body.ts';

// The FastAPI layer (fastapi.ts) on a Hono app, served by @hono/node-server or called with
// `app.request`: the request's headers and body are read from Node's own request when there is
// one, from the web Request otherwise.

/** Node's own request and response when @hono/node-server serves the app (absent under `app.request`). */
export function nodeBindings(c: Context): Partial<HttpBindings> {
  return (c.env as Partial<HttpBindings> | undefined) ?? {};
}

/**
 * A request header, from Node's request when there is one: `c.req.header` builds the web Request
 * and its Headers, which cost more than the rest of a tool call's HTTP handling.
 */
export function requestHeader(c: Context, name: string): string | undefined {
  const { incoming } = nodeBindings(c);
  return incoming ? (incoming.headers[name] as string | undefined) : c.req.header(name);
}

/** The request's declared Content-Length, unless it is chunked. */
export function requestDeclaredLength(c: Context): number | undefined {
  return declaredLength({ get: (name) => requestHeader(c, name) ?? null });
}

const bytesRead = new WeakMap<object, Promise<Uint8Array>>();

/**
 * `readBodyBytes` for Node's own request, read once: a fast path that began a request on Node's
 * objects and handed it to the app (see `NodeFastPath`) leaves its bytes here for the app's route.
 */
export function readIncomingBytes(incoming: IncomingMessage, maxBytes: number): Promise<Uint8Array> {
  let bytes = bytesRead.get(incoming);
  if (bytes === undefined) {
    bytes = readNodeBody(incoming, maxBytes);
    bytesRead.set(incoming, bytes);
  }
  return bytes;
}

/**
 * The request's body bytes, at most `maxBytes` of them (a BodyTooLargeError past the cap, before
 * the body is read whole: see readNodeBody), read once per request: what reads them later (a
 * route after a middleware that read them) gets the same bytes. Straight from Node's request when
 * there is one, its chunks joined by hand (stream/consumers' buffer() goes through a Blob, which
 * showed in tool-call profiles).
 */
export function readBodyBytes(c: Context, maxBytes: number): Promise<Uint8Array> {
  const { incoming } = nodeBindings(c);
  if (incoming) return readIncomingBytes(incoming, maxBytes);
  let bytes = bytesRead.get(c);
  if (bytes === undefined) {
    bytes = readRequestBytes(c.req.raw, maxBytes);
    bytesRead.set(c, bytes);
  }
  return bytes;
}

/**
 * Reads a body the way FastAPI does (see bodyValue): absent → `undefined`; not JSON → a 422
 * json_invalid; too deep for json.loads, or not UTF-8 → a 400; declared as something else → the
 * text. Larger than `maxBytes` → BodyTooLargeError (a 413). A large body is decoded in its turn.
 */
export async function readFastApiBody(c: Context, maxBytes = DEFAULT_MAX_BODY_BYTES): Promise<unknown> {
  const bytes = await readBodyBytes(c, maxBytes);
  return bodyValue(await decodeRequestBodyInTurn(bytes, requestHeader(c, 'content-type') ?? null));
}

/** The body validated as FastAPI validates a pydantic body: the raw object and the parsed value. */
export async function parseFastApiBody<T extends z.ZodType>(c: Context, schema: T, maxBytes?: number): Promise<{ body: Record<string, unknown>; value: z.output<T> }> {
  const body = await readFastApiBody(c, maxBytes);
  const [value] = validateBody([schema], body);
  return { body: body as Record<string, unknown>, value };
}

export interface FastApiErrorHandlerOptions extends FastApiErrorOptions {
  logger: { error(fields: object, message: string): void };
}

/**
 * A Hono error handler answering as FastAPI does (see fastApiErrorAnswer); an HTTPException (a
 * middleware's, bearerAuth's 401) answers its own response. Unhandled errors are logged.
 */
export function fastApiErrorHandler({ logger, ...options }: FastApiErrorHandlerOptions): ErrorHandler {
  return (error, c) => {
    if (error instanceof HTTPException) return error.getResponse();
    const answer = fastApiErrorAnswer(error, options);
    if (answer.unhandled) logger.error({ err: error, path: c.req.path }, 'request failed');
    return c.json(answer.body, answer.status as ContentfulStatusCode);
  };
}

/** A 200 JSON answer written as FastAPI writes its pydantic model: the `floats` fields as Python floats (see fastApiJson). */
export function fastApiJsonResponse(c: Context, value: unknown, floats: FloatFields): Response {
  return c.body(fastApiJson(value, floats), 200, { 'content-type': 'application/json' });
}
