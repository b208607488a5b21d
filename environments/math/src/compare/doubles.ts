// Doubles: a tree's value where doubles can be trusted with it, their closeness, and the
// deterministic sample points symbolic answers are compared at.

import type { SNode } from '../sympy/index.ts';

/** |x - y| within `digits` relative digits, or below 10^-absolute. */
export function doublesClose(x: number, y: number, digits: number, absolute: number): boolean {
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

// A small deterministic generator, so the same pair always gets the same verdict.
export function sampler(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}
