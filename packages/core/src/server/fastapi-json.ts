import { randomBytes } from 'node:crypto';

// JSON as a FastAPI server writes it from its pydantic models. JavaScript has one number type and
// JSON.stringify writes 1 where Python writes the float 1.0, and 1e-05 as 0.00001: NeMo Gym's
// clients keep what they read (its rollout collection writes the JSONL a trainer reads), so a
// face that stands in for a Python server writes the fields its models declare `float` as Python
// does. Which fields those are is data (FloatFields), next to the model it mirrors.

/**
 * Where a JSON value holds Python floats, as its pydantic model declares them. `true`: the value
 * itself, or every number in it (`Dict[str, float]`, `List[float]`). An object: its keys, each with its own spec;
 * `*` in a key matches any characters (`"mean/*"` every mean; `"*"` is any key). A list is
 * transparent: a spec applies to each of its items.
 * @example { reward: true, reward_components: { '*': true }, response: { created_at: true } }
 */
export type FloatFields = true | { readonly [key: string]: FloatFields };

const MARK = `__pyfloat_${randomBytes(12).toString('hex')}__`;
const MARKED = new RegExp(`"${MARK}([^"]*)"`, 'g');

/**
 * Python's `repr(float)` of a finite number: the same shortest round-trip digits as JavaScript's,
 * laid out as Python lays them out (`1.0`, `1e-05`, `1.5e+16`, `-0.0`).
 */
export function pythonFloat(n: number): string {
  if (n === 0) return Object.is(n, -0) ? '-0.0' : '0.0';
  const [mantissa, exponentText] = n.toExponential().split('e') as [string, string];
  const exponent = Number(exponentText);
  const sign = n < 0 ? '-' : '';
  const digits = mantissa.replace('-', '').replace('.', '');
  if (exponent < -4 || exponent >= 16) {
    const lead = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${lead}e${exponent < 0 ? '-' : '+'}${String(Math.abs(exponent)).padStart(2, '0')}`;
  }
  if (exponent < 0) return `${sign}0.${'0'.repeat(-exponent - 1)}${digits}`;
  const whole = digits.slice(0, exponent + 1).padEnd(exponent + 1, '0');
  return `${sign}${whole}.${digits.slice(exponent + 1) || '0'}`;
}

const globs = new Map<string, RegExp>();
function glob(pattern: string): RegExp {
  let regex = globs.get(pattern);
  if (regex === undefined) {
    regex = new RegExp(`^${pattern.split('*').map((part) => part.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`, 's');
    globs.set(pattern, regex);
  }
  return regex;
}

function specFor(spec: { readonly [key: string]: FloatFields }, key: string): FloatFields | undefined {
  const exact = spec[key];
  if (exact !== undefined) return exact;
  for (const [pattern, value] of Object.entries(spec)) {
    if (pattern.includes('*') && glob(pattern).test(key)) return value;
  }
  return undefined;
}

/** The holders (objects and lists) whose numbers are floats: the keys named, or every item. */
type Marks = WeakMap<object, Set<string> | 'all'>;

function mark(value: unknown, spec: FloatFields, marks: Marks): void {
  if (typeof value !== 'object' || value === null) return;
  if (Array.isArray(value)) {
    if (spec === true) marks.set(value, 'all');
    for (const item of value) mark(item, spec, marks);
    return;
  }
  for (const [key, item] of Object.entries(value)) {
    const inner = spec === true ? true : specFor(spec, key);
    if (inner === undefined) continue;
    if (inner === true && typeof item === 'number') {
      const keys = marks.get(value);
      if (keys === 'all') continue;
      if (keys === undefined) marks.set(value, new Set([key]));
      else keys.add(key);
    } else {
      mark(item, inner, marks);
    }
  }
}

/**
 * The JSON FastAPI answers for `value` (compact, UTF-8 as is): the numbers `floats` names are
 * Python floats (`1.0`), the others ints when integral; a number with a fraction is written as
 * Python's repr writes it (`1e-05`, not `0.00001`). Non-finite numbers are null, as JSON.stringify
 * writes them.
 */
export function fastApiJson(value: unknown, floats?: FloatFields): string {
  const marks: Marks = new WeakMap();
  if (floats !== undefined) mark(value, floats, marks);
  let marked = false;
  const text = JSON.stringify(value, function (this: object, key: string, item: unknown) {
    if (typeof item !== 'number' || !Number.isFinite(item)) return item;
    const keys = marks.get(this);
    const isFloat = keys === 'all' || keys?.has(key) === true;
    if (!isFloat && Number.isInteger(item)) return item;
    const python = pythonFloat(item);
    // Most fractions read the same in both languages: only the others go through the mark.
    if (python === String(item)) return item;
    marked = true;
    return `${MARK}${python}`;
  });
  return marked ? text.replace(MARKED, '$1') : text;
}
