import type { z } from 'zod';
import { RolloutError } from '../errors.ts';
import {
  BODY_PARSE_ERROR_BODY,
  bodyTooLargeBody,
  missingBodyError,
  reprError,
  valueError,
  zodIssuesToPydantic,
  type PydanticErrorItem,
} from './fastapi-errors.ts';
import { BodyTooLargeError, type RequestBody } from './read-body.ts';

// The mechanics of a face that answers as a FastAPI server (NeMo Gym's resources server, a NeMo
// Gym agent's /run, ProRL's server): what FastAPI makes of a body, how it validates it, what it
// answers for an error. Framework-free; fastapi-hono.ts puts them on a Hono app.

/** An answer as FastAPI gives it: a status and a JSON body. */
export interface FastApiAnswer {
  status: number;
  body: unknown;
}

/**
 * An answer as FastAPI would give it (its HTTPException, a 422 validation error), thrown from a
 * handler of a FastAPI-shaped face.
 */
export class FastApiReply extends Error implements FastApiAnswer {
  constructor(
    readonly status: number,
    readonly body: unknown,
  ) {
    super(typeof body === 'object' && body !== null && 'detail' in body ? JSON.stringify((body as { detail: unknown }).detail) : String(body));
    this.name = 'FastApiReply';
  }
}

/** FastAPI's 422 `{"detail": [...]}` for pydantic's error items. */
export function validationFailure(detail: PydanticErrorItem[]): FastApiReply {
  return new FastApiReply(422, { detail });
}

/**
 * The value FastAPI hands its validator for a request body: undefined for none, the JSON value
 * (null included), or the text of a body not declared as JSON. A body json.loads refuses is a
 * 422 json_invalid; one it gives up on (too deep, not UTF-8) a 400. Throws a FastApiReply.
 */
export function bodyValue(body: RequestBody): unknown {
  switch (body.kind) {
    case 'absent':
      return undefined;
    case 'invalid':
      throw validationFailure([body.error]);
    case 'unparseable':
      throw new FastApiReply(400, BODY_PARSE_ERROR_BODY);
    default:
      return body.value;
  }
}

/**
 * A body validated against one model or several (FastAPI reports every model's errors at once);
 * a JSON null counts as no body, FastAPI's `missing`. Throws a FastApiReply 422.
 */
export function validateBody<T extends z.ZodType>(schemas: readonly [T], body: unknown): [z.output<T>];
export function validateBody<T extends z.ZodType>(schemas: readonly T[], body: unknown): Array<z.output<T>>;
export function validateBody<T extends z.ZodType>(schemas: readonly T[], body: unknown): Array<z.output<T>> {
  if (body === undefined || body === null) throw validationFailure([missingBodyError()]);
  const results = schemas.map((schema) => schema.safeParse(body));
  const detail = results.flatMap((r, i) => (r.success ? [] : zodIssuesToPydantic(r.error.issues, body, schemas[i])));
  if (detail.length > 0) throw validationFailure(detail);
  return results.map((r) => r.data as z.output<T>);
}

export interface FastApiErrorOptions {
  /**
   * A RolloutError of a 4xx code (but 422) is the server's own refusal, answered `{"detail":
   * message}` with its status as FastAPI's HTTPException is (the rollout service's faces). Unset,
   * it is an exception of the environment's code: a 500 with `repr(e)`, as NeMo Gym's servers
   * answer one.
   */
  httpExceptions?: boolean;
}

/** True for pydantic error items (what a RolloutError UNPROCESSABLE may carry as its details). */
function isPydanticDetail(details: unknown): details is PydanticErrorItem[] {
  return Array.isArray(details) && details.every((d) => typeof d === 'object' && d !== null && 'loc' in d);
}

/**
 * What FastAPI answers for an error thrown while serving: a FastApiReply as it says, a body over
 * the cap 413, bad input found only while computing the 422 of a pydantic validator's
 * ValueError; anything else is unhandled (`unhandled: true`, for the log): a 500 whose body is
 * Python's `repr(e)` string.
 */
export function fastApiErrorAnswer(error: unknown, options: FastApiErrorOptions = {}): FastApiAnswer & { unhandled?: true } {
  if (error instanceof FastApiReply) return error;
  if (error instanceof BodyTooLargeError) return { status: 413, body: bodyTooLargeBody(error.maxBytes) };
  if (RolloutError.isInstance(error)) {
    if (error.code === 'UNPROCESSABLE') {
      return { status: 422, body: { detail: isPydanticDetail(error.details) ? error.details : [valueError(['body'], error.message, null)] } };
    }
    if (options.httpExceptions && error.status < 500) return { status: error.status, body: { detail: error.message } };
  }
  return { status: 500, body: reprError(error), unhandled: true };
}

const ROLLOUT_PREFIX = /^\/ng-rollout\/([A-Za-z0-9][A-Za-z0-9._-]*)(\/.*)$/;

/** NeMo Gym's `/ng-rollout/<id>` prefix stripped, as its RolloutContextMiddleware does. */
export function stripRolloutPrefix(path: string): { path: string; rolloutId?: string } {
  const match = ROLLOUT_PREFIX.exec(path);
  return match ? { path: match[2]!, rolloutId: match[1]! } : { path };
}
