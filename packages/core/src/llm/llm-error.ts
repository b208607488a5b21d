import { RolloutError } from '../errors.ts';

/**
 * - `connect`: no response at all: could not connect, or the connection dropped before a response
 *   (a dead or restarting backend). Safe to send again, to another backend.
 * - `http`: the server answered with an error status (`httpStatus`).
 * - `timeout`: the request's own time limit passed.
 * - `protocol`: a response that is not a chat completion.
 * - `unavailable`: no healthy backend came up in time.
 */
export type LlmFailureKind = 'connect' | 'http' | 'timeout' | 'protocol' | 'unavailable';

export interface LlmBackendErrorOptions {
  kind: LlmFailureKind;
  message: string;
  backendId: string | null;
  retryable: boolean;
  httpStatus?: number;
  /** The error body the server sent. */
  body?: unknown;
  cause?: unknown;
}

/** A RolloutError with code 'LLM_BACKEND'; `details` carries the kind so it survives copies. */
export class LlmBackendError extends RolloutError {
  readonly kind: LlmFailureKind;
  readonly backendId: string | null;
  readonly httpStatus: number | null;

  constructor({ kind, message, backendId, retryable, httpStatus, body, cause }: LlmBackendErrorOptions) {
    super({
      code: 'LLM_BACKEND',
      message,
      cause,
      retryable,
      details: { kind, backendId, ...(httpStatus === undefined ? {} : { httpStatus }), ...(body === undefined ? {} : { body }) },
    });
    this.name = 'LlmBackendError';
    this.kind = kind;
    this.backendId = backendId;
    this.httpStatus = httpStatus ?? null;
  }

  /** True for an LLM_BACKEND error where no response came: safe to retry on another backend. */
  static isConnectFailure(value: unknown): boolean {
    return (
      RolloutError.isInstance(value) &&
      value.code === 'LLM_BACKEND' &&
      (value.details as { kind?: unknown } | undefined)?.kind === 'connect'
    );
  }
}
