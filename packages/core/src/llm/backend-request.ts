import { Agent, request, type Dispatcher } from 'undici';
import { RolloutError } from '../errors.ts';
import { LlmBackendError } from './llm-error.ts';
import type { ChatCompletionOptions, LlmBackendConfig } from './types.ts';

/** Error codes meaning the request got no response: the backend is down, restarting or gone. */
const CONNECT_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'ECONNABORTED',
  'ETIMEDOUT',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'UND_ERR_DESTROYED',
]);

const RETRYABLE_STATUS = new Set([408, 409, 425, 429, 500, 502, 503, 504]);

function errorCode(error: unknown): string | undefined {
  if (typeof error !== 'object' || error === null) return undefined;
  const { code, errors } = error as { code?: unknown; errors?: unknown };
  if (typeof code === 'string') return code;
  // Happy eyeballs (several addresses) fails with an AggregateError of the attempts.
  if (Array.isArray(errors)) return errors.map(errorCode).find((c) => c !== undefined);
  return undefined;
}

let sharedAgent: Agent | undefined;

/**
 * An undici Agent for one backend: keep-alive, and without undici's 300 s header and body limits
 * (a long generation waits for its whole answer; time limits are the caller's).
 */
export function createLlmAgent(maxConcurrency?: number, connectTimeoutMs = 10_000): Agent {
  return new Agent({
    connections: maxConcurrency ?? null,
    headersTimeout: 0,
    bodyTimeout: 0,
    connect: { timeout: connectTimeoutMs },
  });
}

function defaultDispatcher(): Dispatcher {
  sharedAgent ??= createLlmAgent();
  return sharedAgent;
}

/** What the caller's abort means: its own RolloutError, a time limit, or a cancel. */
export function callerAbortError(reason: unknown): RolloutError {
  if (RolloutError.isInstance(reason)) return reason;
  if (reason instanceof Error && reason.name === 'TimeoutError') {
    return new RolloutError({ code: 'TIMEOUT', message: 'the time limit passed during a model call', cause: reason });
  }
  return new RolloutError({ code: 'CANCELLED', message: 'the model call was cancelled', cause: reason });
}

function httpErrorMessage(body: unknown, text: string): string {
  const error = (body as { error?: unknown; message?: unknown; detail?: unknown } | undefined) ?? {};
  if (typeof error.error === 'string') return error.error;
  const nested = error.error as { message?: unknown } | undefined;
  if (typeof nested?.message === 'string') return nested.message;
  if (typeof error.message === 'string') return error.message;
  if (typeof error.detail === 'string') return error.detail;
  return text.slice(0, 500);
}

const TOKEN_ID = /^token_id:(\d+)$/;

/** The ids of `token_id:N` logprob tokens (vLLM's `return_tokens_as_token_ids`); null unless all are. */
export function idsOfLogprobTokens(tokens: readonly string[]): number[] | null {
  const ids = tokens.map((token) => TOKEN_ID.exec(token)?.[1]);
  return ids.every((id) => id !== undefined) ? ids.map(Number) : null;
}

/** `{baseUrl}/{path}`: the OpenAI routes (`chat/completions`, `completions`) live under the base URL. */
export function backendUrl(baseUrl: string, path: string): string {
  return `${baseUrl.replace(/\/+$/, '')}/${path}`;
}

/** vLLM's own routes (`/tokenize`) live at the server's root, beside `/v1`. */
export function serverUrl(baseUrl: string, path: string): string {
  return `${baseUrl.replace(/\/+$/, '').replace(/\/v1$/, '')}/${path}`;
}

/** A JSON answer of a backend: the parsed body (undefined when it is not JSON) and its text. */
export interface BackendAnswer {
  json: unknown;
  text: string;
  latencyMs: number;
}

/**
 * POSTs a JSON body to a backend and reads the whole answer. Fails with an LlmBackendError whose
 * `kind` says what went wrong (connect, timeout, http, protocol), or with the caller's abort as a
 * CANCELLED/TIMEOUT RolloutError. The caller checks the answer's shape.
 */
export async function postToBackend(
  backend: LlmBackendConfig,
  url: string,
  body: unknown,
  { signal, timeoutMs, headers, dispatcher }: ChatCompletionOptions = {},
): Promise<BackendAnswer> {
  if (signal?.aborted) throw callerAbortError(signal.reason);
  const started = performance.now();
  const controller = new AbortController();
  let timedOut = false;
  const onAbort = () => controller.abort(signal?.reason);
  signal?.addEventListener('abort', onAbort, { once: true });
  const timer =
    timeoutMs === undefined
      ? undefined
      : setTimeout(() => {
          timedOut = true;
          controller.abort(new Error('timeout'));
        }, timeoutMs);

  const fail = (error: unknown, phase: 'request' | 'body'): RolloutError => {
    if (signal?.aborted) return callerAbortError(signal.reason);
    if (timedOut) {
      return new LlmBackendError({
        kind: 'timeout',
        message: `${backend.id}: no answer within ${timeoutMs} ms`,
        backendId: backend.id,
        retryable: true,
        cause: error,
      });
    }
    const code = errorCode(error);
    const text = error instanceof Error ? error.message : String(error);
    if (code !== undefined && CONNECT_CODES.has(code)) {
      return new LlmBackendError({
        kind: 'connect',
        message: `${backend.id}: ${phase === 'request' ? 'no response' : 'connection lost while reading the response'} (${code}: ${text})`,
        backendId: backend.id,
        retryable: true,
        cause: error,
      });
    }
    return new LlmBackendError({ kind: 'protocol', message: `${backend.id}: ${text}`, backendId: backend.id, retryable: false, cause: error });
  };

  try {
    let response: Dispatcher.ResponseData;
    try {
      response = await request(url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          ...(backend.apiKey === undefined ? {} : { authorization: `Bearer ${backend.apiKey}` }),
          ...headers,
        },
        body: JSON.stringify(body),
        signal: controller.signal,
        dispatcher: dispatcher ?? defaultDispatcher(),
      });
    } catch (error) {
      throw fail(error, 'request');
    }
    let text: string;
    try {
      text = await response.body.text();
    } catch (error) {
      throw fail(error, 'body');
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    if (response.statusCode >= 300) {
      throw new LlmBackendError({
        kind: 'http',
        message: `${backend.id}: HTTP ${response.statusCode}: ${httpErrorMessage(json, text)}`,
        backendId: backend.id,
        retryable: RETRYABLE_STATUS.has(response.statusCode),
        httpStatus: response.statusCode,
        body: json ?? text.slice(0, 2_000),
      });
    }
    return { json, text, latencyMs: performance.now() - started };
  } finally {
    if (timer !== undefined) clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  }
}

/** The error for an answer that is not what the route returns. */
export function protocolError(backend: LlmBackendConfig, what: string, detail: string, answer: BackendAnswer): LlmBackendError {
  return new LlmBackendError({
    kind: 'protocol',
    message: `${backend.id}: the response is not ${what}: ${detail.slice(0, 500)}`,
    backendId: backend.id,
    retryable: false,
    body: answer.json ?? answer.text.slice(0, 2_000),
  });
}
