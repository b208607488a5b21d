// Whether two expressions without free symbols have the same value, by the engine: doubles first,
// then PRECISION digits compared as exact decimals.

import { doublesClose } from './doubles.ts';
import { evaluate, type Json, PRECISION } from './engine.ts';

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

export type Verdict = boolean | undefined;

/**
 * Whether two expressions without free symbols have the same value; undefined when unknown. A
 * double-precision pass first rejects clear differences cheaply; exact answers are then compared
 * with PRECISION digits unless `machineOnly`.
 */
export function numericallyEqual(a: Json, b: Json, digits: number, absolute: number, machineOnly = false): Verdict {
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
