import { distance } from 'fastest-levenshtein';

/**
 * The one error type of rollserve. Every HTTP error body of the rollout service is built from it
 * (see `toHttpBody`), and every failure crossing a package boundary is one of these codes.
 */
export const ERROR_CODES = {
  BAD_REQUEST: 400,
  UNAUTHORIZED: 401,
  NOT_FOUND: 404,
  METHOD_NOT_ALLOWED: 405,
  CONFLICT: 409,
  PAYLOAD_TOO_LARGE: 413,
  UNPROCESSABLE: 422,
  /** A sandbox limit (memory, disk, files) the rollout ran into: the policy's doing. */
  RESOURCE_LIMIT: 422,
  TIMEOUT: 504,
  CANCELLED: 499,
  SANDBOX: 500,
  TOOL: 500,
  LLM_BACKEND: 502,
  UNAVAILABLE: 503,
  INTERNAL: 500,
} as const;

export type RolloutErrorCode = keyof typeof ERROR_CODES;

const MARKER = Symbol.for('rollserve.RolloutError');

export interface RolloutErrorOptions {
  code: RolloutErrorCode;
  message: string;
  cause?: unknown;
  /** Whether the same call may succeed if tried again (a dead backend, a busy pool). */
  retryable?: boolean;
  /** Structured detail for the HTTP body (for example zod issues). */
  details?: unknown;
}

export class RolloutError extends Error {
  readonly code: RolloutErrorCode;
  readonly retryable: boolean;
  readonly details: unknown;
  readonly [MARKER] = true;

  constructor({ code, message, cause, retryable = false, details }: RolloutErrorOptions) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'RolloutError';
    this.code = code;
    this.retryable = retryable;
    this.details = details;
  }

  get status(): number {
    return ERROR_CODES[this.code];
  }

  /** True for a RolloutError from any copy of this package (instanceof fails across copies). */
  static isInstance(value: unknown): value is RolloutError {
    return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[MARKER] === true;
  }

  /** Wraps anything thrown into a RolloutError, keeping RolloutErrors as they are. */
  static from(value: unknown, code: RolloutErrorCode = 'INTERNAL'): RolloutError {
    if (RolloutError.isInstance(value)) return value;
    const message = value instanceof Error ? value.message : String(value);
    return new RolloutError({ code, message, cause: value });
  }

  toJSON(): { error: { code: RolloutErrorCode; message: string; retryable: boolean; details?: unknown } } {
    return {
      error: {
        code: this.code,
        message: this.message,
        retryable: this.retryable,
        ...(this.details === undefined ? {} : { details: this.details }),
      },
    };
  }
}

/** The closest of `candidates` to `word`, when it is close enough to be what was meant. */
export function suggest(word: string, candidates: readonly string[]): string | undefined {
  // fewest edits first; among equals, one that starts as the word does (--nn meant --n, not --env)
  const ranked = candidates
    .map((candidate) => ({ candidate, edits: distance(word, candidate), sameStart: candidate[0] === word[0] ? 0 : 1 }))
    .sort((a, b) => a.edits - b.edits || a.sameStart - b.sameStart);
  const best = ranked[0];
  return best !== undefined && best.edits <= Math.max(2, Math.floor(best.candidate.length / 3)) ? best.candidate : undefined;
}
