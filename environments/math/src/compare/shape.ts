// What a tree is built of, by construction (no evaluation but of integer exponents' signs).

import type { SNode } from '../sympy/index.ts';
import { evalDouble } from './doubles.ts';

/** Whether `n` is built only of integers, +, *, integer powers and factorials (a rational value). */
export function rationalShape(n: SNode): boolean {
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
export function integerShape(n: SNode): boolean {
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
export function fullPrecision(n: SNode): boolean {
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

export function hasFloat(n: SNode): boolean {
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

export function freeSymbols(n: SNode, out = new Set<string>()): Set<string> {
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
