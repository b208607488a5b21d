import type { Context } from 'hono';
import { z } from 'zod';
import { RolloutError } from '../errors.ts';

/** Validates a request value; a failure is a 422 naming each offending field. */
export function parse<T extends z.ZodType>(schema: T, value: unknown): z.output<T> {
  const result = schema.safeParse(value);
  if (!result.success) {
    throw new RolloutError({ code: 'UNPROCESSABLE', message: z.prettifyError(result.error), details: result.error.issues });
  }
  return result.data;
}

/** The request's JSON body; a 400 when it is not JSON. */
export async function body(c: Context): Promise<unknown> {
  try {
    return await c.req.json();
  } catch (error) {
    throw new RolloutError({ code: 'BAD_REQUEST', message: `the body is not JSON: ${(error as Error).message}` });
  }
}
