import { z } from 'zod';
import { RolloutError } from '../errors.ts';

// The rollout API's own refusals of bad input (the FastAPI faces answer as FastAPI does, see
// server/fastapi.ts): every one a RolloutError, so its body is `{"error": {...}}`.

/** A 422 naming each offending field (in its message and `details`). */
export function unprocessable(error: z.ZodError): RolloutError {
  return new RolloutError({ code: 'UNPROCESSABLE', message: z.prettifyError(error), details: error.issues });
}

/** A 400 for a body that is not JSON. */
export function notJson(error: Error): RolloutError {
  return new RolloutError({ code: 'BAD_REQUEST', message: `the body is not JSON: ${error.message}` });
}

/** Validates a request value; a failure is a 422 naming each offending field. */
export function parse<T extends z.ZodType>(schema: T, value: unknown): z.output<T> {
  const result = schema.safeParse(value);
  if (!result.success) throw unprocessable(result.error);
  return result.data;
}

