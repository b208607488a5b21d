import { readFileSync } from 'node:fs';
import { nemoGymFixture } from '@rollserve/testing';

// JSON read with Python's number types kept: `1` is an int, `1.0` a float. JSON.parse makes both
// the same number, which hides the difference NeMo Gym's clients keep (a collected JSONL line).

/** A number as written: its lexeme, and whether Python reads it as an int or a float. */
export interface PyNumber {
  py: 'int' | 'float';
  raw: string;
  value: number;
}

const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;

/** JSON.parse with every number a PyNumber. */
export function parsePythonTyped(text: string): unknown {
  let out = '';
  let i = 0;
  while (i < text.length) {
    const ch = text[i]!;
    if (ch === '"') {
      // copy the string through, escapes and all
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j + 1;
    } else if (ch === '-' || (ch >= '0' && ch <= '9')) {
      NUMBER.lastIndex = i;
      const raw = NUMBER.exec(text)![0];
      out += JSON.stringify({ $py: raw });
      i += raw.length;
    } else {
      out += ch;
      i++;
    }
  }
  return JSON.parse(out, (_key, value: unknown) => {
    if (typeof value === 'object' && value !== null && '$py' in value) {
      const raw = (value as { $py: string }).$py;
      return { py: /[.eE]/.test(raw) ? 'float' : 'int', raw, value: Number(raw) } satisfies PyNumber;
    }
    return value;
  });
}

const isPyNumber = (value: unknown): value is PyNumber => typeof value === 'object' && value !== null && 'py' in value && 'raw' in value;

/**
 * Where two Python-typed JSON values differ: keys, values, and each number's type (int or float);
 * numbers of the same type are equal to within `tolerance` (the same bytes when it is 0).
 */
export function pythonTypeDifferences(actual: unknown, expected: unknown, tolerance = 0, path = '$'): string[] {
  if (isPyNumber(expected)) {
    if (!isPyNumber(actual)) return [`${path}: ${JSON.stringify(actual)} is not a number`];
    if (actual.py !== expected.py) return [`${path}: ${actual.raw} is a Python ${actual.py}, NeMo Gym's ${expected.raw} a ${expected.py}`];
    const same = tolerance === 0 ? actual.raw === expected.raw : Math.abs(actual.value - expected.value) <= tolerance;
    return same ? [] : [`${path}: ${actual.raw} != ${expected.raw}`];
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) return [`${path}: not a list of ${expected.length}`];
    return expected.flatMap((item, i) => pythonTypeDifferences(actual[i], item, tolerance, `${path}[${i}]`));
  }
  if (typeof expected === 'object' && expected !== null) {
    if (typeof actual !== 'object' || actual === null || Array.isArray(actual)) return [`${path}: not an object`];
    const a = actual as Record<string, unknown>;
    const e = expected as Record<string, unknown>;
    return [
      ...Object.keys(e).filter((key) => !(key in a)).map((key) => `${path}.${key}: missing`),
      ...Object.keys(a).filter((key) => !(key in e)).map((key) => `${path}.${key}: unexpected`),
      ...Object.keys(e).filter((key) => key in a).flatMap((key) => pythonTypeDifferences(a[key], e[key], tolerance, `${path}.${key}`)),
    ];
  }
  return Object.is(actual, expected) ? [] : [`${path}: ${JSON.stringify(actual)} != ${JSON.stringify(expected)}`];
}

/** A fixture's python_reference.json (NeMo Gym's own answers) with Python's number types kept. */
export function pythonReferenceTyped(server: string): {
  rows: Array<{ recorded_rollout_index: PyNumber; reward: PyNumber; extras: Record<string, any> }>;
  aggregate_metrics: Record<string, unknown>;
} {
  return parsePythonTyped(readFileSync(nemoGymFixture(server, 'python_reference.json'), 'utf8')) as ReturnType<typeof pythonReferenceTyped>;
}
