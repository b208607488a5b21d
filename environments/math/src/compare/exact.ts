// Exact values and magnitudes beyond the doubles: rationals as bigint fractions (n! included),
// and log10 of values too large for a double.

import type { SNode } from '../sympy/index.ts';
import { evalDouble } from './doubles.ts';

/**
 * Digits of exact integer arithmetic one comparison may spend (7^(10^6) is 845,099 digits and takes
 * about 60 ms): integers past the engine's precision must compare exactly, not to 200 digits.
 */
const EXACT_BUDGET_DIGITS = 3_000_000;
/** Largest n whose n! is computed exactly (20000! has 77,338 digits, about 0.1 s). */
const MAX_EXACT_FACTORIAL = 20_000n;

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
export function log10Abs(n: SNode): number {
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
