import type { IncomingMessage } from 'node:http';
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import PQueue from 'p-queue';
import { jsonInvalidError, type PydanticErrorItem } from './fastapi-errors.ts';

/**
 * Nesting deeper than this is refused as Python's json.loads refuses it (RecursionError, so
 * FastAPI's 400). CPython's default recursion limit; 3.12+ decode deeper, but Node's own
 * recursion (JSON.stringify of an echo or an error's input) gives out a few thousand levels down.
 */
export const MAX_JSON_DEPTH = 1_000;

/** Python's limit on the digits of an integer literal (`sys.int_info.default_max_str_digits`). */
export const MAX_INT_DIGITS = 4_300;

/** What FastAPI makes of a request body before validating it. */
export type RequestBody =
  /** No body at all: pydantic's `missing` for a required body. */
  | { kind: 'absent' }
  /** Parsed JSON (`null` included). */
  | { kind: 'json'; value: unknown }
  /** Not declared as JSON: FastAPI validates the text itself, which fails for a model. */
  | { kind: 'text'; value: string }
  /** json.loads raised JSONDecodeError: 422 json_invalid. */
  | { kind: 'invalid'; error: PydanticErrorItem }
  /** json.loads raised something else: 400 "There was an error parsing the body". */
  | { kind: 'unparseable' };

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

function isDigit(code: number): boolean {
  return code >= 0x30 && code <= 0x39;
}

/** Where a scan of the text stands: the next index, the nesting depth there. */
interface ScanState {
  at: number;
  depth: number;
}

/**
 * Scans `text` from `state.at` to at least `stop` (a token is finished past it) for where
 * json.loads would give up on a limit (nesting depth, integer digits); strings are skipped with
 * indexOf. Returns that position, or undefined with `state` moved on.
 */
function scanForLimit(text: string, state: ScanState, stop: number): number | undefined {
  let { depth } = state;
  let i = state.at;
  for (; i < stop; i++) {
    const code = text.charCodeAt(i);
    if (code === QUOTE) {
      let close = i;
      for (;;) {
        close = text.indexOf('"', close + 1);
        if (close < 0) {
          // unterminated: JSON.parse reports it
          state.at = text.length;
          return undefined;
        }
        let backslashes = 0;
        while (text.charCodeAt(close - 1 - backslashes) === BACKSLASH) backslashes++;
        if (backslashes % 2 === 0) break;
      }
      i = close;
    } else if (code === 0x5b || code === 0x7b) {
      if (++depth > MAX_JSON_DEPTH) return i;
    } else if (code === 0x5d || code === 0x7d) {
      depth--;
    } else if (code === 0x2d || isDigit(code)) {
      const start = i;
      let after = code === 0x2d ? i + 1 : i;
      const digitsFrom = after;
      while (isDigit(text.charCodeAt(after))) after++;
      const next = text.charCodeAt(after);
      const isFloat = next === 0x2e || next === 0x65 || next === 0x45; // . e E
      if (!isFloat && after - digitsFrom > MAX_INT_DIGITS) return start;
      i = after - 1;
    }
  }
  state.at = i;
  state.depth = depth;
  return undefined;
}

/**
 * Where json.loads would give up on a limit (nesting depth, integer digits), if anywhere before
 * `end`, in one pass over the text. Used for bodies JSON.parse refuses (up to where it refused
 * them), or whose value holds a number too large for a double.
 */
export function pythonJsonLimitAt(text: string, end = text.length): number | undefined {
  return scanForLimit(text, { at: 0, depth: 0 }, end);
}

/** What `pythonJsonLimitAtYielding` scans between two turns of the event loop (~1 ms here). */
const SCAN_SLICE = 512 * 1024;

/** `pythonJsonLimitAt` a slice at a time, letting the event loop run between slices. */
export async function pythonJsonLimitAtYielding(text: string, end = text.length): Promise<number | undefined> {
  const state = { at: 0, depth: 0 };
  while (state.at < end) {
    const found = scanForLimit(text, state, Math.min(end, state.at + SCAN_SLICE));
    if (found !== undefined) return found;
    if (state.at < end) await yieldToLoop();
  }
  return undefined;
}

/**
 * What a walk over a parsed value finds: whether it nests deeper than `max` (iterative: V8's
 * JSON.parse is, too) and whether it holds a number that is not finite. An integer of more than
 * MAX_INT_DIGITS digits parses to ±Infinity (doubles end near 1.8e308), so a finite value holds
 * none and the text needs no scan for one; this walk costs a fraction of a regular expression
 * looking for a run of digits in the text (a third of JSON.parse's time on token ids).
 */
function walkParsed(root: unknown, max: number): 'deep' | 'infinite' | undefined {
  let infinite = false;
  const stack: Array<[value: object, depth: number]> = [];
  if (root !== null && typeof root === 'object') stack.push([root, 1]);
  else if (typeof root === 'number' && !Number.isFinite(root)) return 'infinite';
  while (stack.length > 0) {
    const [value, depth] = stack.pop()!;
    if (depth > max) return 'deep';
    const children: unknown[] = Array.isArray(value) ? value : Object.values(value);
    for (let i = 0; i < children.length; i++) {
      const child = children[i];
      if (typeof child === 'number') {
        if (child === Infinity || child === -Infinity) infinite = true;
      } else if (child !== null && typeof child === 'object') stack.push([child, depth + 1]);
    }
  }
  return infinite ? 'infinite' : undefined;
}

/** `json.loads(text)` as FastAPI sees it: its value, a JSONDecodeError (422) or another error (400). */
export function parseJsonLikePython(text: string): RequestBody {
  const parsed = parseOnce(text);
  if ('body' in parsed) return parsed.body;
  const limitAt = pythonJsonLimitAt(text, parsed.scanTo);
  return limitAt !== undefined && limitAt < parsed.before ? { kind: 'unparseable' } : parsed.otherwise;
}

/** `parseJsonLikePython` with the limit scan a slice at a time (for large bodies). */
export async function parseJsonLikePythonYielding(text: string): Promise<RequestBody> {
  const parsed = parseOnce(text);
  if ('body' in parsed) return parsed.body;
  const limitAt = await pythonJsonLimitAtYielding(text, parsed.scanTo);
  return limitAt !== undefined && limitAt < parsed.before ? { kind: 'unparseable' } : parsed.otherwise;
}

/**
 * JSON.parse and the checks on its value; what is left open is whether json.loads would have
 * given up on a limit before `before` (scanning the text up to `scanTo` answers it).
 */
function parseOnce(text: string): { body: RequestBody } | { scanTo: number; before: number; otherwise: RequestBody } {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    const invalid = jsonInvalidError(error, text);
    // Python stops at whichever comes first: the syntax error or the limit (so the text after the
    // syntax error is never scanned).
    const errorAt = Number(invalid.loc[1]);
    const scanTo = Number.isInteger(errorAt) ? Math.min(errorAt, text.length) : text.length;
    return { scanTo, before: errorAt, otherwise: { kind: 'invalid', error: invalid } };
  }
  const found = walkParsed(value, MAX_JSON_DEPTH);
  if (found === 'deep') return { body: { kind: 'unparseable' } };
  // ±Infinity: a float out of range (json.loads takes it) or an integer too long (it does not)
  if (found === 'infinite') return { scanTo: text.length, before: Infinity, otherwise: { kind: 'json', value } };
  return { body: { kind: 'json', value } };
}

// A client sends the same Content-Type on every request: the answer for each is remembered.
const jsonContentTypes = new Map<string, boolean>();

function isJsonContentType(header: string): boolean {
  let json = jsonContentTypes.get(header);
  if (json === undefined) {
    const [type = ''] = header.split(';', 1);
    const [main, sub = ''] = type.trim().toLowerCase().split('/', 2);
    json = main === 'application' && (sub === 'json' || sub.endsWith('+json'));
    if (jsonContentTypes.size < 64) jsonContentTypes.set(header, json);
  }
  return json;
}

/**
 * Reads a request body as FastAPI's get_request_handler does: no bytes → absent; JSON when the
 * content type is absent, application/json or application/*+json; the text otherwise. The bytes
 * must be UTF-8 (a leading BOM is dropped, as json.loads does for bytes). At most `maxBytes` are
 * read (see `readRequestBytes`); a large body is decoded in its turn (see `decodeInTurn`).
 */
export async function readRequestBody(request: Request, maxBytes = DEFAULT_MAX_BODY_BYTES): Promise<RequestBody> {
  const bytes = await readRequestBytes(request, maxBytes);
  return decodeRequestBodyInTurn(bytes, request.headers.get('content-type'));
}

/** The largest request body a server reads unless told otherwise (`--max-body-mib`): 64 MiB. */
export const DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024;

/** A request body larger than the server's cap: answered 413 without reading the rest. */
export class BodyTooLargeError extends Error {
  constructor(readonly maxBytes: number) {
    super(`the request body is larger than the ${maxBytes} bytes this server accepts`);
    this.name = 'BodyTooLargeError';
  }
}

/**
 * What is still read of a refused body, and for how long, before its connection is cut: enough for
 * a client that writes its body before it reads (curl, Node's http) to see the 413 rather than a
 * reset connection, and a bound on what a client that keeps sending costs (bytes read and dropped).
 */
const DISCARD_BYTES = 8 * 1024 * 1024;
const DISCARD_MS = 2_000;
/** How long a refused body's connection is kept for an answer that does not come (a stuck handler). */
const ANSWER_MS = 10_000;

/**
 * Drops what comes of a refused body. Past DISCARD_BYTES the request is paused (the client's
 * writes then wait on TCP), and DISCARD_MS after the answer is written the connection is cut (or
 * ANSWER_MS after the refusal, if no answer is). Closing it any sooner (destroying the socket at
 * once, or Node closing a `Connection: close` exchange right after the answer) resets the
 * connection under a client still writing, whose kernel may then drop the 413 before it is read:
 * the close lingers, as nginx's does. Counted from the answer, not the refusal: a service slow to
 * answer (a loaded host) still leaves the client the whole linger to read it.
 */
function discardRest(incoming: IncomingMessage): void {
  const socket = incoming.socket;
  if (incoming.complete || incoming.destroyed || !socket) return;
  let dropped = 0;
  let ended = false;
  let closing = false;
  const cut = (): void => {
    if (closing || !ended) socket.destroy();
  };
  let timer = setTimeout(cut, ANSWER_MS);
  timer.unref();
  socket.destroySoon = function lingeringClose(this: typeof socket) {
    closing = true;
    if (this.writable) this.end();
    if (ended) this.destroy();
    else {
      clearTimeout(timer);
      timer = setTimeout(cut, DISCARD_MS);
      timer.unref();
    }
  };
  incoming.removeAllListeners('data');
  incoming.on('data', (chunk: Buffer) => {
    dropped += chunk.length;
    if (dropped > DISCARD_BYTES) incoming.pause();
  });
  incoming.once('end', () => {
    ended = true;
    // a body that ended in time leaves a keep-alive connection open for the next request
    if (closing) socket.destroy();
    else clearTimeout(timer);
  });
  incoming.once('close', () => {
    if (closing) clearTimeout(timer);
  });
  incoming.resume();
}

/** A request's declared Content-Length, unless it is chunked (Transfer-Encoding). */
export function declaredLength(headers: { get(name: string): string | null }): number | undefined {
  // with both, Transfer-Encoding wins (RFC 9112 6.3): the length is then counted as the body comes
  if (headers.get('transfer-encoding') !== null) return undefined;
  const value = headers.get('content-length');
  return value === null ? undefined : Number(value);
}

/**
 * A request body from Node's own request, at most `maxBytes` of it: a declared Content-Length
 * above the cap is refused before a byte is read, a body without one is counted as it streams and
 * refused once it passes the cap (what came is dropped at once). Either way the rest is drained for
 * a moment and the connection then cut (see DISCARD_BYTES): the service holds at most `maxBytes`
 * of a request. Rejects with BodyTooLargeError.
 */
export function readNodeBody(incoming: IncomingMessage, maxBytes: number): Promise<Buffer> {
  const declared = declaredLength({ get: (name) => (incoming.headers[name] as string | undefined) ?? null });
  if (declared !== undefined && declared > maxBytes) {
    discardRest(incoming);
    return Promise.reject(new BodyTooLargeError(maxBytes));
  }
  if (incoming.readableEnded) return Promise.resolve(Buffer.alloc(0));
  return new Promise<Buffer>((resolve, reject) => {
    let chunks: Buffer[] = [];
    let size = 0;
    const done = (): void => {
      incoming.off('data', onData);
      incoming.off('end', onEnd);
      incoming.off('error', onError);
      incoming.off('close', onClose);
    };
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > maxBytes) {
        done();
        chunks = [];
        discardRest(incoming);
        reject(new BodyTooLargeError(maxBytes));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = (): void => {
      done();
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    };
    const onError = (error: Error): void => {
      done();
      reject(error);
    };
    const onClose = (): void => {
      done();
      reject(new Error('the client closed the connection before the body was read'));
    };
    incoming.on('data', onData);
    incoming.once('end', onEnd);
    incoming.once('error', onError);
    incoming.once('close', onClose);
  });
}

/** `readNodeBody` for a web Request (a server run without Node's bindings, `app.request` in tests). */
export async function readRequestBytes(request: Request, maxBytes: number): Promise<Uint8Array> {
  const declared = declaredLength(request.headers);
  if (declared !== undefined && declared > maxBytes) {
    await request.body?.cancel().catch(() => undefined);
    throw new BodyTooLargeError(maxBytes);
  }
  if (request.body === null) return new Uint8Array(0);
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined);
      throw new BodyTooLargeError(maxBytes);
    }
    chunks.push(value);
  }
  return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size);
}

/** Bodies from this size up are decoded in turn (`decodeInTurn`); smaller ones at once. */
export const LARGE_BODY_BYTES = 1024 * 1024;
const largeDecodes = new PQueue({ concurrency: 1 });

/**
 * Runs a body's decoding (UTF-8, JSON.parse, the checks above: synchronous, ~10 ms per MB of
 * token ids) at once for a small body, and for a large one in its turn, one at a time, after
 * the event loop has had its turn: however many large bodies arrive together, every other
 * request waits for at most one of them, not all (`pnpm bench body-flood`).
 */
export function decodeInTurn<T>(size: number, decode: () => T | Promise<T>): Promise<T> {
  if (size < LARGE_BODY_BYTES) return Promise.resolve().then(decode);
  return largeDecodes.add(async () => {
    await yieldToLoop();
    return decode();
  }) as Promise<T>;
}

// Decoding without `stream` keeps no state between calls: one of each serves every request.
const TEXT = new TextDecoder();
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true });

/** `readRequestBody` for bytes already read (from Node's own request, say). */
export function decodeRequestBody(bytes: Uint8Array, contentType: string | null): RequestBody {
  const text = bodyText(bytes, contentType);
  return typeof text === 'string' ? parseJsonLikePython(text) : text;
}

/**
 * `decodeRequestBody` as a server should run it: a small body at once; a large one in its turn
 * (`decodeInTurn`), its limit scan a slice at a time.
 */
export function decodeRequestBodyInTurn(bytes: Uint8Array, contentType: string | null): Promise<RequestBody> {
  if (bytes.length < LARGE_BODY_BYTES) return Promise.resolve().then(() => decodeRequestBody(bytes, contentType));
  return decodeInTurn(bytes.length, () => {
    const text = bodyText(bytes, contentType);
    return typeof text === 'string' ? parseJsonLikePythonYielding(text) : text;
  });
}

/** The JSON text to parse, or what the body is without parsing. */
function bodyText(bytes: Uint8Array, contentType: string | null): string | RequestBody {
  if (bytes.length === 0) return { kind: 'absent' };
  if (contentType !== null && !isJsonContentType(contentType)) {
    return { kind: 'text', value: TEXT.decode(bytes) };
  }
  try {
    return STRICT_UTF8.decode(bytes);
  } catch {
    return { kind: 'unparseable' };
  }
}
