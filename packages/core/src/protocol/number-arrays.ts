import { z } from 'zod';

// Token ids and logprobs arrive by the tens of thousands: a prompt's ids with every model call,
// and every turn's again in each result a node commits. zod checks an array element by element
// through its general machinery (0.69 ms for a 20,000-id prompt here); these schemas check the same
// rules with a plain loop (14 µs), name the first bad item in their error, and keep the JSON Schema
// of the OpenAPI document (an array of integers / numbers).

const snippet = (value: unknown): string => (JSON.stringify(value) ?? String(value)).slice(0, 40);

function firstBad(value: unknown, kind: string, ok: (item: unknown) => boolean): string | undefined {
  if (!Array.isArray(value)) return `expected an array of ${kind}, received ${value === null ? 'null' : typeof value}`;
  for (let i = 0; i < value.length; i++) if (!ok(value[i])) return `expected an array of ${kind}: item ${i} is ${snippet(value[i])}`;
  return undefined;
}

function arrayOf<T>(kind: string, ok: (item: unknown) => boolean, items: Record<string, unknown>) {
  const schema = z.custom<T[]>((value) => firstBad(value, kind, ok) === undefined, { error: (issue) => firstBad(issue.input, kind, ok) });
  // the document's schema is given whole: a custom schema has none of its own, and .nullable() adds no null to one given
  return {
    schema: schema.meta({ type: 'array', items } as never),
    nullable: () => schema.nullable().meta({ type: ['array', 'null'], items } as never),
  };
}

const isFiniteNumber = (item: unknown): boolean => Number.isFinite(item);

/** Arrays of integers (token ids): `.schema`, or `.nullable()`. */
export const integerArray = arrayOf<number>('integers', Number.isInteger, { type: 'integer' });

/** Arrays of finite numbers (logprobs). */
export const numberArray = arrayOf<number>('numbers', isFiniteNumber, { type: 'number' });

/** Arrays of numbers or nulls (the completions API's `token_logprobs`: the first prompt token has none). */
export const nullableNumberArray = arrayOf<number | null>('numbers or nulls', (item) => item === null || Number.isFinite(item), { type: ['number', 'null'] });

/** Chat completions' `logprobs.content`: objects with a string `token` and a numeric `logprob` (other keys kept). */
export const logprobEntries = arrayOf<{ token: string; logprob: number; [key: string]: unknown }>(
  '{token, logprob} objects',
  (item) => typeof item === 'object' && item !== null && typeof (item as { token?: unknown }).token === 'string' && Number.isFinite((item as { logprob?: unknown }).logprob),
  { type: 'object', properties: { token: { type: 'string' }, logprob: { type: 'number' } }, required: ['token', 'logprob'] },
);
