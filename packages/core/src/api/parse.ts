import { distance } from 'fastest-levenshtein';
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

/** The closest of `candidates` to `word`, when it is close enough to be what was meant. */
export function suggest(word: string, candidates: readonly string[]): string | undefined {
  const ranked = candidates.map((candidate) => ({ candidate, edits: distance(word, candidate) })).sort((a, b) => a.edits - b.edits);
  const best = ranked[0];
  return best !== undefined && best.edits <= Math.max(2, Math.floor(best.candidate.length / 3)) ? best.candidate : undefined;
}
