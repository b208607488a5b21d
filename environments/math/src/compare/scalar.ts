// Equality of two scalar expressions: by string, exactly as rationals, by doubles, by magnitude,
// by the engine to high precision, or, with free symbols, at several sample points (the difference
// must vanish everywhere).

import { print, type SNode } from '../sympy/index.ts';
import { doublesClose, evalDouble, sampler } from './doubles.ts';
import { getEngine, toMathJson } from './engine.ts';
import { exactRational, log10Abs } from './exact.ts';
import { numericallyEqual } from './numeric.ts';
import { freeSymbols, fullPrecision, hasFloat, rationalShape } from './shape.ts';

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
