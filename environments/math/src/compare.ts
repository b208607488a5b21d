// Equivalence of two parsed answers: structure first (sets, intervals, tuples, matrices,
// equations, inequalities), then each scalar by string, by high-precision numeric value, or, with
// free symbols, by evaluation at several random points (the difference must vanish everywhere).

import { ComputeEngine } from '@cortex-js/compute-engine';
import type { SNode } from './sympy/index.ts';
import { isExprOfOnlySymbols, print } from './sympy/index.ts';

type Json = unknown;

/** Digits the engine works with: enough for (1+sqrt 3)^4033 against its closed form. */
export const PRECISION = 300;
/** Relative tolerance (digits) when either side was written with a decimal point: 1e-7. */
const FLOAT_DIGITS = 7;
/**
 * Relative tolerance (digits) between exact expressions evaluated with PRECISION digits. Values
 * closer than this are equal; values further apart than 1e-12 are not; in between, the answer
 * depends on whether every operation involved is one the engine evaluates to full precision.
 */
const EXACT_DIGITS = 200;
/** Relative tolerance (digits) between symbolic expressions sampled at random points (doubles). */
const SAMPLE_DIGITS = 9;
/**
 * Digits of exact integer arithmetic one comparison may spend (7^(10^6) is 845,099 digits and takes
 * about 60 ms): integers past the engine's precision must compare exactly, not to 200 digits.
 */
const EXACT_BUDGET_DIGITS = 3_000_000;
/** Largest n whose n! is computed exactly (20000! has 77,338 digits, about 0.1 s). */
const MAX_EXACT_FACTORIAL = 20_000n;

let engine: ComputeEngine | undefined;

export function getEngine(): ComputeEngine {
  if (!engine) {
    engine = new ComputeEngine();
    engine.precision = PRECISION;
  }
  return engine;
}

const FN_NAMES: Record<string, string> = {
  sin: 'Sin', cos: 'Cos', tan: 'Tan', cot: 'Cot', sec: 'Sec', csc: 'Csc', asin: 'Arcsin', acos: 'Arccos',
  atan: 'Arctan', sinh: 'Sinh', cosh: 'Cosh', tanh: 'Tanh', exp: 'Exp', Abs: 'Abs', factorial: 'Factorial',
  binomial: 'Binomial', floor: 'Floor', ceiling: 'Ceil', Max: 'Max', Min: 'Min', gcd: 'Gcd', lcm: 'Lcm',
};

/** The engine's MathJSON for a tree, with free symbols replaced from `values`. */
export function toMathJson(n: SNode, values?: Map<string, number>): Json {
  const rec = (x: SNode): Json => toMathJson(x, values);
  switch (n.k) {
    case 'int':
      return n.v >= -(2n ** 52n) && n.v <= 2n ** 52n ? Number(n.v) : { num: String(n.v) };
    case 'rat':
      return ['Rational', rec({ k: 'int', v: n.p }), rec({ k: 'int', v: n.q })];
    case 'float':
      return n.v;
    case 'sym':
      return values?.get(n.name) ?? n.name;
    case 'const':
      return { pi: 'Pi', E: 'ExponentialE', I: 'ImaginaryUnit', oo: 'PositiveInfinity', zoo: 'ComplexInfinity', nan: 'NaN', EmptySet: 'EmptySet' }[n.name];
    case 'add':
      return ['Add', ...n.args.map(rec)];
    case 'mul':
      return ['Multiply', ...n.args.map(rec)];
    case 'pow':
      return ['Power', rec(n.base), rec(n.exp)];
    case 'fn': {
      if (n.name === 'log') return n.args.length > 1 ? ['Log', ...n.args.map(rec)] : ['Ln', ...n.args.map(rec)];
      return [FN_NAMES[n.name] ?? n.name, ...n.args.map(rec)];
    }
    default:
      throw new Error(`not a scalar: ${n.k}`);
  }
}

/** The exact value of a rational expression as [numerator, denominator]; undefined otherwise. */
export function exactRational(n: SNode, budget = { digits: EXACT_BUDGET_DIGITS }): [bigint, bigint] | undefined {
  switch (n.k) {
    case 'int':
      return [n.v, 1n];
    case 'rat':
      return [n.p, n.q];
    case 'add': {
      let acc: [bigint, bigint] = [0n, 1n];
      for (const arg of n.args) {
        const v = exactRational(arg, budget);
        if (!v) return undefined;
        acc = [acc[0] * v[1] + v[0] * acc[1], acc[1] * v[1]];
      }
      return acc;
    }
    case 'mul': {
      let acc: [bigint, bigint] = [1n, 1n];
      for (const arg of n.args) {
        const v = exactRational(arg, budget);
        if (!v) return undefined;
        acc = [acc[0] * v[0], acc[1] * v[1]];
      }
      return acc[1] === 0n ? undefined : acc;
    }
    case 'pow': {
      const base = exactRational(n.base, budget);
      const exp = exactRational(n.exp, budget);
      if (!base || !exp || exp[1] !== 1n) return undefined;
      const e = exp[0] < 0n ? -exp[0] : exp[0];
      const size = Math.max(String(base[0]).length, String(base[1]).length) * Number(e);
      if (!Number.isFinite(size) || size > budget.digits) return undefined;
      budget.digits -= size;
      if (exp[0] < 0n && base[0] === 0n) return undefined;
      const [p, q] = exp[0] < 0n ? [base[1], base[0]] : base;
      const sign = q < 0n ? -1n : 1n;
      return [(sign * p) ** e, (sign * q) ** e];
    }
    case 'fn': {
      // n! exactly, for n up to a few thousand: huge integers must compare exactly, not to 300 digits.
      const arg = n.name === 'factorial' && n.args.length === 1 && n.args[0] ? exactRational(n.args[0], budget) : undefined;
      if (!arg || arg[1] !== 1n || arg[0] < 0n || arg[0] > MAX_EXACT_FACTORIAL) return undefined;
      const digits = Math.ceil(Number(arg[0]) * Math.log10(Math.max(2, Number(arg[0]))));
      if (digits > budget.digits) return undefined;
      budget.digits -= digits;
      let f = 1n;
      for (let i = 2n; i <= arg[0]; i++) f *= i;
      return [f, 1n];
    }
    default:
      return undefined;
  }
}

function terms(n: SNode): SNode[] {
  return n.k === 'add' ? n.args : [n];
}

function sumOf(items: SNode[]): SNode {
  if (items.length === 0) return { k: 'int', v: 0n };
  return items.length === 1 ? (items[0] as SNode) : { k: 'add', args: items };
}

/** Both sides without the terms they share, or undefined when they share none. */
function cancelCommonTerms(a: SNode, b: SNode): [SNode, SNode] | undefined {
  if (a.k !== 'add' && b.k !== 'add') return undefined;
  const left = terms(a).map((t) => ({ t, key: print(t) }));
  const right = terms(b).map((t) => ({ t, key: print(t) }));
  let shared = 0;
  for (const item of left) {
    const j = right.findIndex((r) => r.key === item.key);
    if (j >= 0) {
      right.splice(j, 1);
      item.key = '';
      shared++;
    }
  }
  if (shared === 0) return undefined;
  return [sumOf(left.filter((l) => l.key !== '').map((l) => l.t)), sumOf(right.map((r) => r.t))];
}

/** log10 of ln(n!), by Stirling's series (exact enough for n > 20). */
function log10Factorial(n: number): number {
  if (n < 2) return 0;
  if (n <= 170) {
    let f = 1;
    for (let i = 2; i <= n; i++) f *= i;
    return Math.log10(f);
  }
  const ln = n * Math.log(n) - n + 0.5 * Math.log(2 * Math.PI * n) + 1 / (12 * n) - 1 / (360 * n ** 3);
  return ln / Math.LN10;
}

/**
 * log10 |n| for a positive product/power/sum of positive terms, NaN when it cannot be had safely:
 * the magnitude of values beyond the doubles.
 */
function log10Abs(n: SNode): number {
  switch (n.k) {
    case 'int': {
      if (n.v <= 0n) return NaN;
      const digits = String(n.v);
      return digits.length - 1 + Math.log10(Number(`0.${digits.slice(0, 17)}`) * 10);
    }
    case 'rat':
      return n.p > 0n ? log10Abs({ k: 'int', v: n.p }) - log10Abs({ k: 'int', v: n.q }) : NaN;
    case 'float':
      return n.v > 0 ? Math.log10(n.v) : NaN;
    case 'const':
      return n.name === 'pi' ? Math.log10(Math.PI) : n.name === 'E' ? Math.log10(Math.E) : NaN;
    case 'mul':
      return n.args.reduce((acc, arg) => acc + log10Abs(arg), 0);
    case 'pow': {
      const exp = evalDouble(n.exp);
      const base = log10Abs(n.base);
      return Number.isFinite(exp) ? exp * base : NaN;
    }
    case 'add': {
      const logs = n.args.map(log10Abs);
      if (!logs.every(Number.isFinite)) return NaN;
      const top = Math.max(...logs);
      return top + Math.log10(logs.reduce((acc, l) => acc + 10 ** (l - top), 0));
    }
    case 'fn': {
      const [arg] = n.args;
      if (n.name !== 'factorial' || !arg) return NaN;
      const x = evalDouble(arg);
      return Number.isInteger(x) && x >= 0 ? log10Factorial(x) : NaN;
    }
    default:
      return NaN;
  }
}

/** Whether `n` is built only of integers, +, *, integer powers and factorials (a rational value). */
function rationalShape(n: SNode): boolean {
  switch (n.k) {
    case 'int':
    case 'rat':
      return true;
    case 'add':
    case 'mul':
      return n.args.every(rationalShape);
    case 'pow':
      return rationalShape(n.base) && integerShape(n.exp);
    case 'fn':
      return n.name === 'factorial' && n.args.every(rationalShape);
    default:
      return false;
  }
}

/** Whether `n` is an integer by construction: integers under +, * and powers with such exponents. */
function integerShape(n: SNode): boolean {
  switch (n.k) {
    case 'int':
      return true;
    case 'add':
    case 'mul':
      return n.args.every(integerShape);
    case 'pow':
      return integerShape(n.base) && integerShape(n.exp) && evalDouble(n.exp) >= 0;
    default:
      return false;
  }
}

/** Whether the engine evaluates every operation of `n` to full precision (+, *, powers, roots). */
function fullPrecision(n: SNode): boolean {
  switch (n.k) {
    case 'int':
    case 'rat':
    case 'sym':
      return true;
    case 'const':
      return n.name === 'pi' || n.name === 'E' || n.name === 'I';
    case 'add':
    case 'mul':
      return n.args.every(fullPrecision);
    case 'pow':
      return fullPrecision(n.base) && fullPrecision(n.exp);
    default:
      return false;
  }
}

function hasFloat(n: SNode): boolean {
  switch (n.k) {
    case 'float':
      return true;
    case 'add':
    case 'mul':
    case 'fn':
      return n.args.some(hasFloat);
    case 'pow':
      return hasFloat(n.base) || hasFloat(n.exp);
    default:
      return false;
  }
}

function freeSymbols(n: SNode, out = new Set<string>()): Set<string> {
  switch (n.k) {
    case 'sym':
      out.add(n.name);
      break;
    case 'add':
    case 'mul':
    case 'fn':
      for (const a of n.args) freeSymbols(a, out);
      break;
    case 'pow':
      freeSymbols(n.base, out);
      freeSymbols(n.exp, out);
      break;
    default:
  }
  return out;
}

/** A finite real decimal: `digits * 10^exp`. */
interface Decimal {
  digits: bigint;
  exp: number;
}

function parseDecimal(json: unknown): Decimal | undefined {
  let text: string;
  if (typeof json === 'number') {
    if (!Number.isFinite(json)) return undefined;
    text = json.toExponential(17);
  } else if (json !== null && typeof json === 'object' && typeof (json as { num?: unknown }).num === 'string') {
    text = (json as { num: string }).num;
  } else return undefined;
  const m = /^([-+]?)(\d*)(?:\.(\d*))?(?:e([-+]?\d+))?$/i.exec(text.replace(/\s/g, ''));
  if (!m) return undefined;
  const int = m[2] ?? '';
  const frac = m[3] ?? '';
  const all = `${int}${frac}`.replace(/^0+(?=\d)/, '') || '0';
  const digits = BigInt(`${m[1] === '-' ? '-' : ''}${all}`);
  return { digits, exp: Number(m[4] ?? 0) - frac.length };
}

const abs = (x: bigint): bigint => (x < 0n ? -x : x);

/** Decimal exponent of the leading digit. */
function magnitude(d: Decimal): number {
  return String(abs(d.digits)).length - 1 + d.exp;
}

/**
 * |a - b| <= 10^-digits * max(|a|, |b|), on exact decimals (the engine's bignum subtraction of two
 * numbers of wildly different size is far too slow, so it is done here on aligned mantissas).
 */
function decimalsClose(a: Decimal, b: Decimal, digits: number, absolute: number): boolean {
  if (a.digits === 0n || b.digits === 0n) {
    const other = a.digits === 0n ? b : a;
    return other.digits === 0n || magnitude(other) < -absolute;
  }
  if ((a.digits < 0n) !== (b.digits < 0n)) return false;
  const ma = magnitude(a);
  const mb = magnitude(b);
  if (Math.abs(ma - mb) > 1) return false;
  const width = digits + 20;
  const scale = (d: Decimal, top: number): bigint => {
    // The value as an integer count of units of 10^(top - width).
    const shift = d.exp - (top - width);
    return shift >= 0 ? d.digits * 10n ** BigInt(shift) : d.digits / 10n ** BigInt(-shift);
  };
  const top = Math.max(ma, mb);
  const x = scale(a, top);
  const y = scale(b, top);
  const bigger = abs(x) > abs(y) ? abs(x) : abs(y);
  return abs(x - y) * 10n ** BigInt(digits) <= bigger;
}

type Verdict = boolean | undefined;

function evaluate(json: Json, precision: number | 'machine'): ReturnType<ComputeEngine['box']> {
  const ce = getEngine();
  ce.precision = precision;
  try {
    return ce.box(json as never).N();
  } finally {
    ce.precision = PRECISION;
  }
}

function doublesClose(x: number, y: number, digits: number, absolute: number): boolean {
  if (x === y) return true;
  // The 1 + 1e-9 keeps 0.3333333 against 1/3 (exactly at 1e-7) from hanging on rounding.
  return Math.abs(x - y) <= Math.max(Math.abs(x), Math.abs(y)) * 10 ** -digits * (1 + 1e-9) || Math.abs(x - y) < 10 ** -absolute;
}

const DOUBLE_FUNCTIONS: Record<string, (x: number) => number> = {
  sin: Math.sin, cos: Math.cos, tan: Math.tan, asin: Math.asin, acos: Math.acos, atan: Math.atan,
  sinh: Math.sinh, cosh: Math.cosh, tanh: Math.tanh, exp: Math.exp, Abs: Math.abs, floor: Math.floor,
  ceiling: Math.ceil, cot: (x) => 1 / Math.tan(x), sec: (x) => 1 / Math.cos(x), csc: (x) => 1 / Math.sin(x),
};

/**
 * A real double value of `n`, or NaN when doubles cannot be trusted for it: unsupported
 * operations, complex values, overflow, or a sum that cancels (its terms are far larger than it).
 * Answers to compare are usually cheap enough for this, which spares the engine most work.
 */
export function evalDouble(n: SNode, values?: Map<string, number>): number {
  switch (n.k) {
    case 'int':
      return Number(n.v);
    case 'rat':
      return Number(n.p) / Number(n.q);
    case 'float':
      return n.v;
    case 'sym':
      return values?.get(n.name) ?? NaN;
    case 'const':
      return n.name === 'pi' ? Math.PI : n.name === 'E' ? Math.E : NaN;
    case 'add': {
      let sum = 0;
      let largest = 0;
      for (const arg of n.args) {
        const v = evalDouble(arg, values);
        sum += v;
        largest = Math.max(largest, Math.abs(v));
      }
      return largest > 0 && Math.abs(sum) < largest * 1e-8 ? NaN : sum;
    }
    case 'mul': {
      let product = 1;
      let overflow = false;
      let shrinks = false;
      for (const arg of n.args) {
        const v = evalDouble(arg, values);
        if (Math.abs(v) === Infinity) overflow = true;
        else if (Math.abs(v) < 1) shrinks = true;
        product *= v;
      }
      // 10^{400} * 10^{-300} overflows on the way to a value that fits.
      return overflow && shrinks ? NaN : product;
    }
    case 'pow': {
      const base = evalDouble(n.base, values);
      const exp = evalDouble(n.exp, values);
      // An overflowed base or exponent says nothing about a power that shrinks it again.
      if ((!Number.isFinite(base) || !Number.isFinite(exp)) && !(exp > 0 && Math.abs(base) > 1)) return NaN;
      return Math.pow(base, exp);
    }
    case 'fn': {
      const args = n.args.map((a) => evalDouble(a, values));
      if (!args.every(Number.isFinite)) return NaN;
      const [x, y] = args;
      if (x === undefined) return NaN;
      if (n.name === 'log') return y === undefined ? Math.log(x) : Math.log(x) / Math.log(y);
      if (n.name === 'factorial' && Number.isInteger(x) && x >= 0) {
        if (x > 170) return Infinity; // a true overflow: n! > 1.8e308
        let f = 1;
        for (let i = 2; i <= x; i++) f *= i;
        return f;
      }
      const f = DOUBLE_FUNCTIONS[n.name];
      return f && args.length === 1 ? f(x) : NaN;
    }
    default:
      return NaN;
  }
}

/**
 * Whether two expressions without free symbols have the same value; undefined when unknown. A
 * double-precision pass first rejects clear differences cheaply; exact answers are then compared
 * with PRECISION digits unless `machineOnly`.
 */
function numericallyEqual(a: Json, b: Json, digits: number, absolute: number, machineOnly = false): Verdict {
  const fa = evaluate(a, 'machine');
  const fb = evaluate(b, 'machine');
  const doubles = [fa.re, fb.re, fa.im, fb.im];
  const finite = doubles.every((x) => Number.isFinite(x));
  if (finite) {
    const loose = Math.min(digits, 6);
    if (!doublesClose(fa.re, fb.re, loose, Math.min(absolute, 9)) || !doublesClose(fa.im, fb.im, loose, Math.min(absolute, 9))) {
      return false;
    }
    if (machineOnly || digits <= 9) {
      const d = Math.min(digits, 9);
      return doublesClose(fa.re, fb.re, d, Math.min(absolute, 12)) && doublesClose(fa.im, fb.im, d, Math.min(absolute, 12));
    }
  } else if (machineOnly) {
    if (doubles.some((x) => Number.isNaN(x))) return undefined;
    return fa.re === fb.re && fa.im === fb.im ? undefined : false;
  }
  const na = evaluate(a, PRECISION);
  const nb = evaluate(b, PRECISION);
  if (na.isInfinity || nb.isInfinity) return na.isInfinity === nb.isInfinity && Math.sign(na.re) === Math.sign(nb.re);
  const da = parseDecimal(na.json);
  const db = parseDecimal(nb.json);
  if (da && db) return decimalsClose(da, db, digits, absolute);
  // Complex values: compare real and imaginary parts as doubles.
  const parts = [na.re, nb.re, na.im, nb.im];
  if (parts.some((x) => Number.isNaN(x))) return undefined;
  const d = Math.min(digits, 12);
  const ab = Math.min(absolute, 12);
  return doublesClose(na.re, nb.re, d, ab) && doublesClose(na.im, nb.im, d, ab);
}

// A small deterministic generator, so the same pair always gets the same verdict.
function sampler(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** Two scalar expressions are equal. */
export function scalarEqual(a: SNode, b: SNode): boolean {
  if (print(a) === print(b)) return true;
  if (a.k === 'str' || b.k === 'str') return false;
  // c + r1 = c + r2 exactly when r1 = r2: drop the terms both sides share (x against x + 1 for a
  // huge x is then 0 against 1, where no finite precision could tell).
  const reduced = cancelCommonTerms(a, b);
  if (reduced) return scalarEqual(reduced[0], reduced[1]);
  const floats = hasFloat(a) || hasFloat(b);
  const symbols = new Set([...freeSymbols(a), ...freeSymbols(b)]);
  if (symbols.size === 0) {
    if (!floats) {
      const ea = exactRational(a);
      const eb = exactRational(b);
      if (ea && eb) return ea[0] * eb[1] === eb[0] * ea[1];
      // Rational values too large to compute exactly cannot be told apart by 300 digits either.
      if (rationalShape(a) && rationalShape(b)) return false;
    }
    const da = evalDouble(a);
    const db = evalDouble(b);
    if (Number.isFinite(da) && Number.isFinite(db)) {
      if (!doublesClose(da, db, 6, 9)) return false;
      if (floats) return doublesClose(da, db, FLOAT_DIGITS, 12);
    }
    // A value beyond the doubles (10^{10^{10}}, 100000!) is not a finite double's equal.
    if ((Number.isFinite(da) && Math.abs(db) === Infinity) || (Number.isFinite(db) && Math.abs(da) === Infinity)) return false;
    // Beyond the doubles both: compare magnitudes in log space first (100000!√2 against 100000!√3).
    const la = log10Abs(a);
    const lb = log10Abs(b);
    // A log difference of 1e-6 is a ratio of 1 + 2.3e-6; the second term covers rounding of large logs.
    if (Number.isFinite(la) && Number.isFinite(lb) && Math.abs(la - lb) > 1e-6 + 1e-12 * Math.abs(la)) return false;
    const ce = getEngine();
    const ja = toMathJson(a);
    const jb = toMathJson(b);
    if (!floats) {
      if (ce.box(ja as never).isSame(ce.box(jb as never))) return true;
      if (numericallyEqual(ja, jb, EXACT_DIGITS, 250) === true) return true;
      // Close to 1e-12 but not to full precision: equal only if some operation is evaluated with
      // less than full precision (trigonometry, logarithms...), not for a genuinely tiny difference.
      if (numericallyEqual(ja, jb, 12, 250) !== true) return false;
      return !(fullPrecision(a) && fullPrecision(b));
    }
    return numericallyEqual(ja, jb, FLOAT_DIGITS, 9) === true;
  }
  const next = sampler(0x5eed);
  let compared = 0;
  for (let attempt = 0; attempt < 8 && compared < 4; attempt++) {
    const values = new Map<string, number>();
    for (const s of [...symbols].sort()) values.set(s, Math.round((0.15 + 1.7 * next()) * 1e6) / 1e6);
    const digits = floats ? FLOAT_DIGITS : SAMPLE_DIGITS;
    const da = evalDouble(a, values);
    const db = evalDouble(b, values);
    const verdict = Number.isFinite(da) && Number.isFinite(db)
      ? doublesClose(da, db, digits, 12)
      : numericallyEqual(toMathJson(a, values), toMathJson(b, values), digits, 12, true);
    if (verdict === false) return false;
    if (verdict === true) compared++;
  }
  return compared > 0;
}

function flipRelation(n: Extract<SNode, { k: 'rel' }>): Extract<SNode, { k: 'rel' }> {
  if (n.op === '>') return { k: 'rel', op: '<', lhs: n.rhs, rhs: n.lhs };
  if (n.op === '>=') return { k: 'rel', op: '<=', lhs: n.rhs, rhs: n.lhs };
  return n;
}

function difference(n: Extract<SNode, { k: 'rel' }>, sign = 1): SNode {
  const rhs: SNode = { k: 'mul', args: [{ k: 'int', v: -1n }, n.rhs] };
  const diff: SNode = { k: 'add', args: [n.lhs, rhs] };
  return sign === 1 ? diff : { k: 'mul', args: [{ k: 'int', v: -1n }, diff] };
}

function isScalar(n: SNode): boolean {
  return ['int', 'rat', 'float', 'sym', 'const', 'add', 'mul', 'pow', 'fn'].includes(n.k) &&
    !(n.k === 'const' && n.name === 'EmptySet');
}


function setEqual(a: SNode[], b: SNode[], corrections: boolean): boolean {
  const unique = (items: SNode[]): SNode[] => {
    const out: SNode[] = [];
    for (const item of items) if (!out.some((o) => answersEqual(o, item, corrections))) out.push(item);
    return out;
  };
  const ua = unique(a);
  const ub = unique(b);
  if (ua.length !== ub.length) return false;
  const used = new Set<number>();
  return ua.every((x) => {
    const j = ub.findIndex((y, idx) => !used.has(idx) && answersEqual(x, y, corrections));
    if (j < 0) return false;
    used.add(j);
    return true;
  });
}

type Rel = Extract<SNode, { k: 'rel' }>;

const isRelation = (n: SNode): boolean => n.k === 'rel' || (n.k === 'and' && n.args.length > 0 && n.args.every((a) => a.k === 'rel'));
const isEquation = (n: SNode): boolean =>
  (n.k === 'rel' && n.op === '=') || (n.k === 'and' && n.args.length > 0 && n.args.every((a) => a.k === 'rel' && a.op === '='));
const firstRelation = (n: SNode): Rel => (n.k === 'and' ? firstRelation(n.args[0] as SNode) : (n as Rel));
const lastRelation = (n: SNode): Rel => (n.k === 'and' ? lastRelation(n.args.at(-1) as SNode) : (n as Rel));
/** `x = 3`, `f(x) = 3`, `AB = 3`, `a = b = 3`: an equation that names a value. */
const isAssignment = (n: SNode): boolean => isEquation(n) && isExprOfOnlySymbols(firstRelation(n).lhs);

const INVERSE: Record<string, string> = { '<': '>', '>': '<', '<=': '>=', '>=': '<=', '=': '=' };

const minus = (a: SNode, b: SNode): SNode => ({ k: 'add', args: [a, { k: 'mul', args: [{ k: 'int', v: -1n }, b] }] });
const isNumberAtom = (n: SNode): boolean =>
  n.k === 'int' || n.k === 'rat' || n.k === 'float' ||
  (n.k === 'mul' && n.args.length === 2 && n.args[1]?.k === 'rat' && n.args[1].p === 1n && n.args[1].q === 100n && isNumberAtom(n.args[0] as SNode));
const isFloatAtom = (n: SNode): boolean =>
  n.k === 'float' || (n.k === 'mul' && n.args.length === 2 && n.args[1]?.k === 'rat' && n.args[1].p === 1n && n.args[1].q === 100n && n.args[0]?.k === 'float');

/** Python's round(x, 6) as sympy does it on a Float: to 6 decimal places. */
const round6 = (x: number): number => Math.round(x * 1e6) / 1e6;

/** Two equations or inequalities with proportional sides (the same solutions): `2x+4y=3` and `y=-x/2+3/4`. */
function proportional(a: SNode, b: SNode, sign: 1 | -1 | 0): boolean {
  const symbols = [...new Set([...freeSymbols(a), ...freeSymbols(b)])].sort();
  if (symbols.length === 0) return false;
  const next = sampler(0xa11ce);
  let ratio: number | undefined;
  for (let attempt = 0; attempt < 6; attempt++) {
    const values = new Map<string, number>();
    for (const s of symbols) values.set(s, Math.round((0.15 + 1.7 * next()) * 1e6) / 1e6);
    const x = evalDouble(a, values);
    const y = evalDouble(b, values);
    if (!Number.isFinite(x) || !Number.isFinite(y) || y === 0) return false;
    const r = x / y;
    if (ratio === undefined) ratio = r;
    else if (!doublesClose(r, ratio, 9, 12)) return false;
  }
  return ratio !== undefined && ratio !== 0 && (sign === 0 || Math.sign(ratio) === sign);
}

const NEG_INFINITY: SNode = { k: 'mul', args: [{ k: 'int', v: -1n }, { k: 'const', name: 'oo' }] };
const INFINITY: SNode = { k: 'const', name: 'oo' };

/** sympy's as_set() for one variable: `a < x <= b`, `x > a`; undefined for anything else. */
function relationAsSet(n: SNode): SNode | undefined {
  const variable = (x: SNode): boolean => x.k === 'sym' || (x.k === 'fn' && !(x.name in FN_NAMES)) || (x.k === 'mul' && isExprOfOnlySymbols(x));
  const constant = (x: SNode): boolean => freeSymbols(x).size === 0 && isScalar(x);
  if (n.k === 'and' && n.args.length === 2) {
    const [a, b] = n.args as [Rel, Rel];
    const lower = (r: Rel): boolean => r.op === '<' || r.op === '<=';
    if (lower(a) && lower(b) && variable(a.rhs) && print(a.rhs) === print(b.lhs) && constant(a.lhs) && constant(b.rhs)) {
      return { k: 'interval', lo: a.lhs, hi: b.rhs, lopen: a.op === '<', ropen: b.op === '<' };
    }
    const upper = (r: Rel): boolean => r.op === '>' || r.op === '>=';
    if (upper(a) && upper(b) && variable(a.rhs) && print(a.rhs) === print(b.lhs) && constant(a.lhs) && constant(b.rhs)) {
      return { k: 'interval', lo: b.rhs, hi: a.lhs, lopen: b.op === '>', ropen: a.op === '>' };
    }
    return undefined;
  }
  if (n.k !== 'rel' || n.op === '=' || n.op === '!=') return undefined;
  const flipped: Rel = variable(n.rhs) && constant(n.lhs) ? { k: 'rel', op: INVERSE[n.op] as Rel['op'], lhs: n.rhs, rhs: n.lhs } : n;
  if (!variable(flipped.lhs) || !constant(flipped.rhs)) return undefined;
  if (flipped.op === '<' || flipped.op === '<=') return { k: 'interval', lo: NEG_INFINITY, hi: flipped.rhs, lopen: true, ropen: flipped.op === '<' };
  return { k: 'interval', lo: flipped.rhs, hi: INFINITY, lopen: flipped.op === '>', ropen: true };
}

function relationsEqual(gold: SNode, pred: SNode, corrections: boolean): boolean {
  if (gold.k === 'and' && pred.k === 'and') {
    return gold.args.length === pred.args.length && gold.args.every((g, i) => relationsEqual(g, pred.args[i] as SNode, corrections));
  }
  if (gold.k !== 'rel' || pred.k !== 'rel') return false;
  if (gold.op === pred.op && answersEqual(minus(gold.lhs, gold.rhs), minus(pred.lhs, pred.rhs), corrections)) return true;
  if (INVERSE[gold.op] === pred.op && answersEqual(minus(gold.lhs, gold.rhs), minus(pred.rhs, pred.lhs), corrections)) return true;
  // sympy's solve() of both: the same solutions when the sides are proportional.
  const dg = minus(gold.lhs, gold.rhs);
  const dp = minus(pred.lhs, pred.rhs);
  if (gold.op === '=' && pred.op === '=') return proportional(dg, dp, 0);
  if (gold.op === pred.op) return proportional(dg, dp, 1);
  if (INVERSE[gold.op] === pred.op) return proportional(dg, dp, -1);
  return false;
}

const isSetLike = (n: SNode): boolean => n.k === 'set' || n.k === 'tuple' || n.k === 'interval' || (n.k === 'const' && n.name === 'EmptySet');
const itemsOf = (n: SNode): SNode[] => (n.k === 'set' || n.k === 'tuple' ? n.items : []);

function setsEqual(gold: SNode, pred: SNode, corrections: boolean): boolean {
  const a: SNode = isSetLike(gold) ? gold : { k: 'set', items: [gold] };
  const b: SNode = isSetLike(pred) ? pred : { k: 'set', items: [pred] };
  if (a.k === 'interval' && b.k === 'interval') {
    return a.lopen === b.lopen && a.ropen === b.ropen && answersEqual(a.lo, b.lo, corrections) && answersEqual(a.hi, b.hi, corrections);
  }
  if (print(a) === print(b)) return true;
  const emptyA = (a.k === 'const' && a.name === 'EmptySet') || (a.k === 'set' && a.items.length === 0);
  const emptyB = (b.k === 'const' && b.name === 'EmptySet') || (b.k === 'set' && b.items.length === 0);
  if (emptyA || emptyB) return emptyA && emptyB;
  const inOrder = (x: SNode[], y: SNode[]): boolean => x.length === y.length && x.every((item, i) => answersEqual(item, y[i] as SNode, corrections));
  if ((a.k === 'set' || a.k === 'tuple') && (b.k === 'set' || b.k === 'tuple')) {
    if (a.k === 'set' && b.k === 'set') return setEqual(a.items, b.items, corrections);
    return inOrder(a.items, b.items);
  }
  if (a.k === 'interval' && (b.k === 'set' || b.k === 'tuple') && a.lopen && a.ropen && itemsOf(b).length === 2) return inOrder([a.lo, a.hi], itemsOf(b));
  if (b.k === 'interval' && (a.k === 'set' || a.k === 'tuple') && b.lopen && b.ropen && itemsOf(a).length === 2) return inOrder(itemsOf(a), [b.lo, b.hi]);
  return false;
}

function symbolsEqual(gold: SNode, pred: SNode): boolean {
  const isE = (n: SNode): boolean => n.k === 'const' && n.name === 'E';
  const name = (n: SNode): string | undefined => (n.k === 'sym' ? n.name : n.k === 'const' && n.text !== undefined ? n.text : undefined);
  const g = name(gold);
  const p = name(pred);
  if ((g?.toLowerCase() === 'e' && isE(pred)) || (p?.toLowerCase() === 'e' && isE(gold))) return true;
  const concat = (n: SNode): string | undefined =>
    n.k === 'mul' && n.args.every((x) => isE(x) || name(x) !== undefined) ? n.args.map((x) => (isE(x) ? 'e' : (name(x) as string))).join('') : undefined;
  if (g !== undefined && pred.k === 'mul') return g.toLowerCase() === concat(pred)?.toLowerCase();
  if (p !== undefined && gold.k === 'mul') return p.toLowerCase() === concat(gold)?.toLowerCase();
  if (g !== undefined && p !== undefined) return (g.length > 1 ? g.toLowerCase() : g) === (p.length > 1 ? p.toLowerCase() : p);
  return print(gold) === print(pred);
}

/** Math-Verify's sympy_numeric_eq/sympy_symbolic_eq on two scalar expressions. */
function scalarsEqual(gold: SNode, pred: SNode, corrections: boolean): boolean {
  if (isFloatAtom(gold) || isFloatAtom(pred)) {
    const a = evalDouble(gold);
    const b = evalDouble(pred);
    if (Number.isFinite(a) && Number.isFinite(b)) return round6(a) === round6(b);
  }
  if (scalarEqual(gold, pred)) return true;
  if (corrections || isNumberAtom(gold) || isNumberAtom(pred)) return false;
  // Math-Verify: (a - b).evalf(15, chop=True) == 0, which takes values within about 1e-15 of each
  // other as equal (1/2004! and 1/2006!). rollserve's exact comparison above says no.
  if (freeSymbols(gold).size > 0 || freeSymbols(pred).size > 0) return false;
  const a = evalDouble(gold);
  const b = evalDouble(pred);
  if (Number.isFinite(a) && Number.isFinite(b)) return Math.abs(a - b) < 1e-15;
  const la = log10Abs(gold);
  const lb = log10Abs(pred);
  return Number.isFinite(la) && Number.isFinite(lb) && la < -15 && lb < -15;
}

/**
 * Gold `gold` and prediction `pred` denote the same answer (Math-Verify's sympy_expr_eq).
 * `corrections` applies rollserve's deliberate differences (README); off, Math-Verify's verdict.
 */
export function answersEqual(gold: SNode, pred: SNode, corrections = true): boolean {
  const goldAssignment = isAssignment(gold);
  const predAssignment = isAssignment(pred);
  const goldEquation = isEquation(gold);
  const predEquation = isEquation(pred);
  if (goldAssignment) gold = { k: 'rel', op: '=', lhs: firstRelation(gold).lhs, rhs: lastRelation(gold).rhs };
  if (predAssignment) pred = { k: 'rel', op: '=', lhs: firstRelation(pred).lhs, rhs: lastRelation(pred).rhs };
  if (predEquation && !goldEquation) pred = lastRelation(pred).rhs;
  else if (goldAssignment && !predEquation) gold = lastRelation(gold).rhs;

  // A relation against a set: the relation's solution set (0 < x < 1 is the interval (0, 1)).
  if (isRelation(gold) && (pred.k === 'set' || pred.k === 'interval')) gold = relationAsSet(gold) ?? gold;

  if (print(gold) === print(pred)) return true;
  if (isRelation(gold) && isRelation(pred)) return relationsEqual(gold, pred, corrections);
  if (isSetLike(gold) || isSetLike(pred)) return setsEqual(gold, pred, corrections);
  if (gold.k === 'sym' || pred.k === 'sym' || (gold.k === 'const' && gold.text !== undefined) || (pred.k === 'const' && pred.text !== undefined)) {
    if (symbolsEqual(gold, pred)) return true;
    if (gold.k === 'sym' || pred.k === 'sym') return false;
  }
  if (gold.k === 'matrix' && pred.k === 'matrix') {
    return gold.rows.length === pred.rows.length &&
      gold.rows.every((row, i) => row.length === (pred.rows[i] ?? []).length && row.every((x, j) => answersEqual(x, (pred.rows[i] as SNode[])[j] as SNode, corrections)));
  }
  if (isScalar(gold) && isScalar(pred)) return scalarsEqual(gold, pred, corrections);
  if (gold.k === 'str' && pred.k === 'str') return gold.v.trim() === pred.v.trim();
  return false;
}
