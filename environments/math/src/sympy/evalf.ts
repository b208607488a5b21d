// Approximate values of number expressions (sympy's evalf, Python's complex()), for ordering terms
// as sympy prints them and for telling latex2sympy's empty intervals.

import { isUndefinedFunction, type SNode } from './tree.ts';

const REAL_FUNCTIONS: Record<string, (x: number) => number> = {
  sin: Math.sin, cos: Math.cos, tan: Math.tan, cot: (x) => 1 / Math.tan(x), sec: (x) => 1 / Math.cos(x), csc: (x) => 1 / Math.sin(x),
  asin: Math.asin, acos: Math.acos, atan: Math.atan, sinh: Math.sinh, cosh: Math.cosh, tanh: Math.tanh, exp: Math.exp,
  Abs: Math.abs, floor: Math.floor, ceiling: Math.ceil, sqrt: Math.sqrt,
  factorial: (x) => {
    if (Number.isInteger(x)) {
      if (x < 0 || x > 170) return NaN;
      let f = 1;
      for (let i = 2; i <= x; i++) f *= i;
      return f;
    }
    return gamma(x + 1);
  },
};

// Lanczos approximation (g = 7), enough to order terms.
const LANCZOS = [0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
  12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7];
function gamma(x: number): number {
  if (x < 0.5) return Math.PI / (Math.sin(Math.PI * x) * gamma(1 - x));
  const z = x - 1;
  let a = LANCZOS[0] as number;
  const t = z + 7.5;
  for (let i = 1; i < 9; i++) a += (LANCZOS[i] as number) / (z + i);
  return Math.sqrt(2 * Math.PI) * Math.pow(t, z + 0.5) * Math.exp(-t) * a;
}

/**
 * A float approximation of a node without free symbols, NaN otherwise: only for ordering terms
 * as sympy prints them (compare/doubles.ts's evalDouble is the one trusted for equality).
 */
export function numericValue(n: SNode): number {
  switch (n.k) {
    case 'int':
      return Number(n.v);
    case 'rat':
      return Number(n.p) / Number(n.q);
    case 'float':
      return n.v;
    case 'const':
      return n.name === 'pi' ? Math.PI : n.name === 'E' ? Math.E : n.name === 'oo' ? Infinity : NaN;
    case 'add':
      return n.args.reduce((acc, a) => acc + numericValue(a), 0);
    case 'mul':
      return n.args.reduce((acc, a) => acc * numericValue(a), 1);
    case 'pow':
      return Math.pow(numericValue(n.base), numericValue(n.exp));
    case 'fn': {
      const [a, b] = n.args.map(numericValue);
      if (a === undefined) return NaN;
      if (n.name === 'log') return b === undefined ? Math.log(a) : Math.log(a) / Math.log(b);
      const f = REAL_FUNCTIONS[n.name];
      return f && n.args.length === 1 ? f(a) : NaN;
    }
    default:
      return NaN;
  }
}

export type Complex = [re: number, im: number];

/** sympy's `is_number`: no free symbols and no undefined function. */
export function isNumberExpr(n: SNode): boolean {
  switch (n.k) {
    case 'int':
    case 'rat':
    case 'float':
      return true;
    case 'const':
      return n.name !== 'EmptySet' && n.text === undefined;
    case 'add':
    case 'mul':
      return n.args.every(isNumberExpr);
    case 'pow':
      return isNumberExpr(n.base) && isNumberExpr(n.exp);
    case 'fn':
      return !isUndefinedFunction(n.name) && n.args.every(isNumberExpr);
    default:
      return false;
  }
}

export const cmul = (a: Complex, b: Complex): Complex => [a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]];

/** Python's complex() of a number expression; undefined where sympy could not evaluate it. */
export function complexValue(n: SNode): Complex | undefined {
  switch (n.k) {
    case 'const':
      if (n.name === 'I') return [0, 1];
      break;
    case 'add': {
      let re = 0;
      let im = 0;
      for (const a of n.args) {
        const v = complexValue(a);
        if (!v) return undefined;
        re += v[0];
        im += v[1];
      }
      return [re, im];
    }
    case 'mul': {
      let acc: Complex = [1, 0];
      for (const a of n.args) {
        const v = complexValue(a);
        if (!v) return undefined;
        acc = cmul(acc, v);
      }
      return acc;
    }
    case 'pow': {
      const b = complexValue(n.base);
      const e = complexValue(n.exp);
      if (!b || !e) return undefined;
      if (b[1] === 0 && e[1] === 0 && (b[0] >= 0 || Number.isInteger(e[0]))) {
        if (Number.isInteger(e[0]) && b[1] === 0) return [Math.pow(b[0], e[0]), 0];
        return [Math.pow(b[0], e[0]), 0];
      }
      if (e[1] === 0 && Number.isInteger(e[0]) && Math.abs(e[0]) <= 64) {
        let acc: Complex = [1, 0];
        for (let i = 0; i < Math.abs(e[0]); i++) acc = cmul(acc, b);
        if (e[0] < 0) {
          const d = acc[0] * acc[0] + acc[1] * acc[1];
          acc = [acc[0] / d, -acc[1] / d];
        }
        return acc;
      }
      // Principal value: exp(e * log(b)).
      const r = Math.hypot(b[0], b[1]);
      const t = Math.atan2(b[1], b[0]);
      const [lr, li] = cmul(e, [Math.log(r), t]);
      return [Math.exp(lr) * Math.cos(li), Math.exp(lr) * Math.sin(li)];
    }
    case 'fn': {
      // Functions of complex values (sin(I), log(-1)) are complex.
      const z = n.args.length === 1 && n.args[0] ? complexValue(n.args[0]) : undefined;
      if (!z || (z[1] === 0 && !(n.name === 'log' && z[0] < 0))) break;
      const [a, b] = z;
      if (n.name === 'sin') return [Math.sin(a) * Math.cosh(b), Math.cos(a) * Math.sinh(b)];
      if (n.name === 'cos') return [Math.cos(a) * Math.cosh(b), -Math.sin(a) * Math.sinh(b)];
      if (n.name === 'exp') return [Math.exp(a) * Math.cos(b), Math.exp(a) * Math.sin(b)];
      if (n.name === 'log') return [Math.log(Math.hypot(a, b)), Math.atan2(b, a)];
      if (n.name === 'Abs') return [Math.hypot(a, b), 0];
      return undefined;
    }
    default:
      break;
  }
  const v = numericValue(n);
  return Number.isNaN(v) ? undefined : [v, 0];
}
