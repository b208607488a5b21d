// The compute engine the comparison evaluates with, and the tree in the engine's MathJSON.

import { ComputeEngine } from '@cortex-js/compute-engine';
import type { SNode } from '../sympy/index.ts';

export type Json = unknown;

/** Digits the engine works with: enough for (1+sqrt 3)^4033 against its closed form. */
export const PRECISION = 300;

let engine: ComputeEngine | undefined;

export function getEngine(): ComputeEngine {
  if (!engine) {
    engine = new ComputeEngine();
    engine.precision = PRECISION;
  }
  return engine;
}

/** The engine's value of `json` at `precision` (back to PRECISION after). */
export function evaluate(json: Json, precision: number | 'machine'): ReturnType<ComputeEngine['box']> {
  const ce = getEngine();
  ce.precision = precision;
  try {
    return ce.box(json as never).N();
  } finally {
    ce.precision = PRECISION;
  }
}

/** sympy's function names as the engine's. */
export const FN_NAMES: Record<string, string> = {
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
