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

/**
 * Where json.loads would give up on a limit (nesting depth, integer digits), if anywhere, in one
 * pass over the text (strings skipped with indexOf). Used for bodies JSON.parse refuses, or that
 * have a long run of digits.
 */
export function pythonJsonLimitAt(text: string): number | undefined {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code === QUOTE) {
      let end = i;
      for (;;) {
        end = text.indexOf('"', end + 1);
        if (end < 0) return undefined; // unterminated: JSON.parse reports it
        let backslashes = 0;
        while (text.charCodeAt(end - 1 - backslashes) === BACKSLASH) backslashes++;
        if (backslashes % 2 === 0) break;
      }
      i = end;
    } else if (code === 0x5b || code === 0x7b) {
      if (++depth > MAX_JSON_DEPTH) return i;
    } else if (code === 0x5d || code === 0x7d) {
      depth--;
    } else if (code === 0x2d || isDigit(code)) {
      const start = i;
      let end = code === 0x2d ? i + 1 : i;
      const digitsFrom = end;
      while (isDigit(text.charCodeAt(end))) end++;
      const next = text.charCodeAt(end);
      const isFloat = next === 0x2e || next === 0x65 || next === 0x45; // . e E
      if (!isFloat && end - digitsFrom > MAX_INT_DIGITS) return start;
      i = end - 1;
    }
  }
  return undefined;
}

/** Whether a parsed value nests deeper than `max` (iterative: V8's JSON.parse is, too). */
function nestedDeeperThan(root: unknown, max: number): boolean {
  const stack: Array<[value: object, depth: number]> = [];
  if (root !== null && typeof root === 'object') stack.push([root, 1]);
  while (stack.length > 0) {
    const [value, depth] = stack.pop()!;
    if (depth > max) return true;
    for (const child of Array.isArray(value) ? value : Object.values(value)) {
      if (child !== null && typeof child === 'object') stack.push([child, depth + 1]);
    }
  }
  return false;
}

const LONG_DIGIT_RUN = new RegExp(`\\d{${MAX_INT_DIGITS + 1}}`);

/** `json.loads(text)` as FastAPI sees it: its value, a JSONDecodeError (422) or another error (400). */
export function parseJsonLikePython(text: string): RequestBody {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    const invalid = jsonInvalidError(error, text);
    // Python stops at whichever comes first: the syntax error or the limit.
    const limitAt = pythonJsonLimitAt(text);
    if (limitAt !== undefined && limitAt < Number(invalid.loc[1])) return { kind: 'unparseable' };
    return { kind: 'invalid', error: invalid };
  }
  // The cheap checks first; the full scan only for a body with a long run of digits somewhere.
  if (nestedDeeperThan(value, MAX_JSON_DEPTH)) return { kind: 'unparseable' };
  if (LONG_DIGIT_RUN.test(text) && pythonJsonLimitAt(text) !== undefined) return { kind: 'unparseable' };
  return { kind: 'json', value };
}

function isJsonContentType(header: string): boolean {
  const [type = ''] = header.split(';', 1);
  const [main, sub = ''] = type.trim().toLowerCase().split('/', 2);
  return main === 'application' && (sub === 'json' || sub.endsWith('+json'));
}

/**
 * Reads a request body as FastAPI's get_request_handler does: no bytes → absent; JSON when the
 * content type is absent, application/json or application/*+json; the text otherwise. The bytes
 * must be UTF-8 (a leading BOM is dropped, as json.loads does for bytes).
 */
export async function readRequestBody(request: Request): Promise<RequestBody> {
  return decodeRequestBody(new Uint8Array(await request.arrayBuffer()), request.headers.get('content-type'));
}

// Decoding without `stream` keeps no state between calls: one of each serves every request.
const TEXT = new TextDecoder();
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true });

/** `readRequestBody` for bytes already read (from Node's own request, say). */
export function decodeRequestBody(bytes: Uint8Array, contentType: string | null): RequestBody {
  if (bytes.length === 0) return { kind: 'absent' };
  if (contentType !== null && !isJsonContentType(contentType)) {
    return { kind: 'text', value: TEXT.decode(bytes) };
  }
  let text: string;
  try {
    text = STRICT_UTF8.decode(bytes);
  } catch {
    return { kind: 'unparseable' };
  }
  return parseJsonLikePython(text);
}
