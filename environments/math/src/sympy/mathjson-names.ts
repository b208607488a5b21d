// The MathJSON vocabulary latex2sympy's reading needs, apart from the recursive reader: function
// and relation heads as sympy names, symbols as tree leaves, and what counts as an atom.

import { negate, type SNode, Unsupported } from './tree.ts';

export const FUNCTIONS: Record<string, string> = {
  Sin: 'sin', Cos: 'cos', Tan: 'tan', Cot: 'cot', Sec: 'sec', Csc: 'csc', Arcsin: 'asin', Arccos: 'acos',
  Arctan: 'atan', Sinh: 'sinh', Cosh: 'cosh', Tanh: 'tanh', Exp: 'exp', Abs: 'Abs',
  Factorial: 'factorial', Binomial: 'binomial', Floor: 'floor', Ceil: 'ceiling', Max: 'Max', Min: 'Min',
  Gcd: 'gcd', Lcm: 'lcm', Choose: 'binomial',
};

export const RELATIONS: Record<string, '=' | '<' | '<=' | '>' | '>=' | '!='> = {
  Equal: '=', Less: '<', LessEqual: '<=', Greater: '>', GreaterEqual: '>=', NotEqual: '!=',
};

export type Json = unknown;

export const LETTER_SYMBOL = /^(?:[a-df-zA-Z]|[A-Za-z]+)(?:_[A-Za-z0-9]+)?$/;

/** latex2sympy's `atom`: a non-negative number, a letter or named symbol (maybe with an exponent or index), \\infty. */
export function isAtomJson(x: Json): boolean {
  if (typeof x === 'number') return x >= 0;
  if (typeof x === 'string') return x !== 'e' && x !== 'ExponentialE' && LETTER_SYMBOL.test(x);
  if (x !== null && typeof x === 'object' && !Array.isArray(x)) {
    const num = (x as { num?: unknown }).num;
    return typeof num === 'string' && !num.startsWith('-');
  }
  if (Array.isArray(x) && (x[0] === 'Power' || x[0] === 'Subscript') && x.length === 3) {
    return typeof x[1] === 'string' && x[1] !== 'e' && x[1] !== 'ExponentialE' && LETTER_SYMBOL.test(x[1]);
  }
  return false;
}

export const isRelation = (x: Json): boolean => Array.isArray(x) && (x[0] === 'Element' || x[0] === 'Approx' || x[0] === 'And' || RELATIONS[x[0] as string] !== undefined);

export function fromSymbol(name: string): SNode {
  switch (name) {
    case 'Pi':
      return { k: 'const', name: 'pi' };
    case 'ExponentialE':
    case 'e':
      return { k: 'const', name: 'E', text: 'e' };
    case 'ImaginaryUnit':
    case 'I':
      return { k: 'const', name: 'I' };
    case 'i':
      return { k: 'const', name: 'I', text: 'i' };
    case 'PositiveInfinity':
    case 'ComplexInfinity':
      return { k: 'const', name: 'oo' };
    case 'NegativeInfinity':
      return negate({ k: 'const', name: 'oo' });
    case 'EmptySet':
      return { k: 'const', name: 'EmptySet' };
    case 'NaN':
      return { k: 'const', name: 'nan' };
    case 'Nothing':
      throw new Unsupported('nothing');
    default:
      if (name.startsWith("'")) return { k: 'str', v: name.slice(1, -1) };
      // latex2sympy lowercases symbols (lowercase_symbols=True).
      return { k: 'sym', name: name.toLowerCase() };
  }
}

// latex2sympy's grammar has intervals, tuples and sets only as list elements and in set
