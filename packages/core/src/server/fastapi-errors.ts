import { z } from 'zod';
import { RolloutError } from '../errors.ts';

// Error bodies exactly as FastAPI/pydantic 2 write them, so that a model reading a tool's error output
// sees the same text it would see from NeMo Gym's Python servers (CONTRACT.md §1.9).

export interface PydanticErrorItem {
  type: string;
  loc: Array<string | number>;
  msg: string;
  input: unknown;
  ctx?: Record<string, unknown>;
}

export const NOT_FOUND_BODY = { detail: 'Not Found' } as const;
export const METHOD_NOT_ALLOWED_BODY = { detail: 'Method Not Allowed' } as const;
/**
 * FastAPI's 400 when reading the body raises anything but a JSONDecodeError (fastapi/routing.py,
 * get_request_handler): a RecursionError from a deeply nested body, a UnicodeDecodeError, or
 * Python's 4300-digit limit on integers.
 */
export const BODY_PARSE_ERROR_BODY = { detail: 'There was an error parsing the body' } as const;

/**
 * The 413 of a body above the server's cap (`--max-body-mib`). FastAPI sets no cap of its own; this
 * is the shape of its HTTPException answers, with Starlette's reason phrase and the cap.
 */
export function bodyTooLargeBody(maxBytes: number): { detail: string } {
  return { detail: `Request Entity Too Large: the body may be at most ${maxBytes} bytes` };
}

/** A pydantic error type and message carried by a zod `custom` issue (`params.pydantic`). */
export interface PydanticIssueParams {
  pydantic: { type: string; msg: string };
}

const TYPE_MESSAGES: Record<string, [type: string, msg: string]> = {
  string: ['string_type', 'Input should be a valid string'],
  boolean: ['bool_type', 'Input should be a valid boolean'],
  object: ['model_attributes_type', 'Input should be a valid dictionary or object to extract fields from'],
  record: ['dict_type', 'Input should be a valid dictionary'],
  map: ['dict_type', 'Input should be a valid dictionary'],
  array: ['list_type', 'Input should be a valid list'],
  tuple: ['tuple_type', 'Input should be a valid tuple'],
  null: ['none_required', 'Input should be None'],
};

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let value = root;
  for (const key of path) {
    if (value === null || typeof value !== 'object') return undefined;
    value = (value as Record<PropertyKey, unknown>)[key];
  }
  return value;
}

function pythonRepr(value: unknown): string {
  return typeof value === 'string' ? `'${value}'` : JSON.stringify(value);
}

/** The schema node at a path of an object/array schema (wrappers unwrapped), if it can be found. */
function schemaAt(schema: z.ZodType | undefined, path: readonly PropertyKey[]): z.ZodType | undefined {
  let node = schema as { _zod?: { def: Record<string, unknown> } } | undefined;
  const unwrap = () => {
    while (node?._zod && ['optional', 'nullable', 'default', 'prefault', 'readonly', 'nonoptional', 'catch'].includes(String(node._zod.def.type))) {
      node = node._zod.def.innerType as typeof node;
    }
  };
  unwrap();
  for (const key of path) {
    const def = node?._zod?.def;
    if (!def) return undefined;
    if (def.type === 'object') node = (def.shape as Record<PropertyKey, typeof node>)[key];
    else if (def.type === 'array') node = def.element as typeof node;
    else return undefined;
    unwrap();
  }
  return node as z.ZodType | undefined;
}

function isIntSchema(schema: z.ZodType | undefined): boolean {
  return (schema as { isInt?: boolean } | undefined)?.isInt === true;
}

/** pydantic's number errors: parsing for strings, a type error otherwise, ints kept apart. */
function numberError(input: unknown, isInt: boolean): [type: string, msg: string] {
  if (isInt) {
    if (typeof input === 'string') return ['int_parsing', 'Input should be a valid integer, unable to parse string as an integer'];
    if (typeof input === 'number') return ['int_from_float', 'Input should be a valid integer, got a number with a fractional part'];
    return ['int_type', 'Input should be a valid integer'];
  }
  if (typeof input === 'string') return ['float_parsing', 'Input should be a valid number, unable to parse string as a number'];
  return ['float_type', 'Input should be a valid number'];
}

/**
 * Converts zod issues to pydantic's error list; `loc` starts with "body" as FastAPI's does. With
 * the schema, integer fields get pydantic's int_* errors (zod reports them as numbers).
 */
export function zodIssuesToPydantic(issues: readonly z.core.$ZodIssue[], body: unknown, schema?: z.ZodType): PydanticErrorItem[] {
  return issues.flatMap((issue): PydanticErrorItem[] => {
    const path = issue.path.filter((p): p is string | number => typeof p !== 'symbol');
    const loc: Array<string | number> = ['body', ...path];
    const input = valueAt(body, issue.path);
    switch (issue.code) {
      case 'invalid_type': {
        if (input === undefined) {
          return [{ type: 'missing', loc, msg: 'Field required', input: valueAt(body, issue.path.slice(0, -1)) ?? null }];
        }
        const [type, msg] =
          issue.expected === 'number' || issue.expected === 'int'
            ? numberError(input, issue.expected === 'int' || isIntSchema(schemaAt(schema, issue.path)))
            : (TYPE_MESSAGES[issue.expected] ?? ['value_error', issue.message]);
        return [{ type, loc, msg, input }];
      }
      case 'too_small':
      case 'too_big': {
        const short = issue.code === 'too_small';
        const kind = issue.origin === 'string' ? 'string' : issue.origin === 'array' ? 'list' : null;
        if (kind) {
          const unit = kind === 'string' ? 'character' : 'item';
          const n = Number(issue.code === 'too_small' ? issue.minimum : issue.maximum);
          return [{
            type: `${kind === 'string' ? 'string' : 'too'}_${short ? (kind === 'string' ? 'too_short' : 'short') : (kind === 'string' ? 'too_long' : 'long')}`,
            loc,
            msg: `${kind === 'string' ? 'String' : 'List'} should have at ${short ? 'least' : 'most'} ${n} ${unit}${n === 1 ? '' : 's'}`,
            input,
            ctx: short ? { min_length: n } : { max_length: n },
          }];
        }
        const bound = Number(issue.code === 'too_small' ? issue.minimum : issue.maximum);
        const op = short ? (issue.inclusive ? 'greater_than_equal' : 'greater_than') : (issue.inclusive ? 'less_than_equal' : 'less_than');
        const words = op.replaceAll('_', ' ').replace('equal', 'or equal');
        return [{ type: op, loc, msg: `Input should be ${words} to ${bound}`.replace(' than to ', ' than '), input, ctx: { [short ? 'ge' : 'le']: bound } }];
      }
      case 'invalid_value':
        return [{
          type: 'literal_error',
          loc,
          msg: `Input should be ${issue.values.map(pythonRepr).join(' or ').replace(/ or (?=[^]*? or )/g, ', ')}`,
          input,
          ctx: { expected: issue.values.map(pythonRepr).join(' or ') },
        }];
      case 'unrecognized_keys':
        return issue.keys.map((key) => ({
          type: 'extra_forbidden',
          loc: [...loc, key],
          msg: 'Extra inputs are not permitted',
          input: valueAt(input, [key]),
        }));
      case 'invalid_union':
        return [{ type: 'union_error', loc, msg: 'Input should match one of the allowed types', input }];
      case 'custom': {
        const pydantic = (issue.params as Partial<PydanticIssueParams> | undefined)?.pydantic;
        if (pydantic) return [{ type: pydantic.type, loc, msg: pydantic.msg, input }];
        return [valueError(loc, issue.message, input)];
      }
      default:
        return [valueError(loc, issue.message, input)];
    }
  });
}

/**
 * pydantic's item for a ValueError raised by a validator. FastAPI encodes the exception in `ctx`
 * with jsonable_encoder, which turns it into `{}`.
 */
export function valueError(loc: Array<string | number>, message: string, input: unknown): PydanticErrorItem {
  return { type: 'value_error', loc, msg: `Value error, ${message}`, input, ctx: { error: {} } };
}

/**
 * Input found invalid only while computing (a corrupt packed test set): a RolloutError
 * `UNPROCESSABLE` that the resources server answers as FastAPI's 422 with a value_error at
 * `['body', ...loc]`, as a pydantic validator raising ValueError would.
 */
export function invalidInputError(loc: Array<string | number>, message: string, input: unknown): RolloutError {
  return new RolloutError({ code: 'UNPROCESSABLE', message, details: [valueError(['body', ...loc], message, input)] });
}

/** pydantic's lax `int`: integers, integral floats, integer strings and bools; its own errors otherwise. */
export function pydanticInt(): z.ZodType<number, unknown> {
  const fail = (ctx: z.core.$RefinementCtx, input: unknown, type: string, msg: string) => {
    ctx.addIssue({ code: 'custom', message: msg, input, params: { pydantic: { type, msg } } satisfies PydanticIssueParams });
    return z.NEVER;
  };
  return z.unknown().transform((input, ctx): number => {
    if (typeof input === 'boolean') return input ? 1 : 0;
    if (typeof input === 'number') {
      if (!Number.isFinite(input)) return fail(ctx, input, 'finite_number', 'Input should be a finite number');
      if (!Number.isInteger(input)) return fail(ctx, input, 'int_from_float', 'Input should be a valid integer, got a number with a fractional part');
      return input;
    }
    if (typeof input === 'string') {
      const text = input.trim();
      if (/^[+-]?\d+$/.test(text)) return Number(text);
      return fail(ctx, input, 'int_parsing', 'Input should be a valid integer, unable to parse string as an integer');
    }
    return fail(ctx, input, 'int_type', 'Input should be a valid integer');
  });
}

/** FastAPI's 422 for a body that is not JSON (V8's message; Python's differs in wording). */
export function jsonInvalidError(error: unknown, text?: string): PydanticErrorItem {
  const message = error instanceof Error ? error.message : String(error);
  const position = /position (\d+)/.exec(message)?.[1];
  // json.loads reports a body that ends too soon at its end, as V8 does without a position.
  const atEnd = text !== undefined && /end of JSON input/.test(message);
  return {
    type: 'json_invalid',
    loc: ['body', position !== undefined ? Number(position) : atEnd ? text.length : 0],
    msg: 'JSON decode error',
    input: {},
    ctx: { error: message },
  };
}

/** FastAPI's 422 for a required body that is absent. */
export function missingBodyError(): PydanticErrorItem {
  return { type: 'missing', loc: ['body'], msg: 'Field required', input: null };
}

/** Python's `repr(e)`, the body of an unhandled exception's 500 in NeMo Gym's servers. */
export function reprError(error: unknown): string {
  // Bad input that only shows once computing is Python's ValueError.
  if (RolloutError.isInstance(error) && (error.code === 'UNPROCESSABLE' || error.code === 'BAD_REQUEST')) {
    return `ValueError(${JSON.stringify(error.message).replaceAll('"', "'")})`;
  }
  if (error instanceof Error) return `${error.name}(${JSON.stringify(error.message).replaceAll('"', "'")})`;
  return `Error(${JSON.stringify(String(error)).replaceAll('"', "'")})`;
}
