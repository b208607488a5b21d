// The sympy-like tree a parsed answer becomes (what math-verify's latex2sympy builds), its few
// constructors, and sympy's class predicates on it (is_Number, is_Atom, ...), which the reader,
// the sort key, the term order and the printer all ask.

export type SNode =
  | { k: 'int'; v: bigint }
  | { k: 'rat'; p: bigint; q: bigint }
  | { k: 'float'; v: number }
  | { k: 'sym'; name: string }
  // `text` is how it prints when that differs from sympy's name: latex2sympy reads the letters e
  // and i as symbols, which print as `e` and `i`.
  | { k: 'const'; name: 'pi' | 'E' | 'I' | 'oo' | 'zoo' | 'nan' | 'EmptySet'; text?: string }
  | { k: 'add'; args: SNode[] }
  | { k: 'mul'; args: SNode[] }
  | { k: 'pow'; base: SNode; exp: SNode }
  | { k: 'fn'; name: string; args: SNode[] }
  | { k: 'rel'; op: '=' | '<' | '<=' | '>' | '>=' | '!='; lhs: SNode; rhs: SNode }
  | { k: 'set'; items: SNode[] }
  | { k: 'tuple'; items: SNode[] }
  | { k: 'interval'; lo: SNode; hi: SNode; lopen: boolean; ropen: boolean }
  | { k: 'matrix'; rows: SNode[][] }
  | { k: 'and'; args: SNode[] }
  | { k: 'str'; v: string };

/** A leaf: a number, a symbol, a constant or a string. */
export type Atom = Extract<SNode, { k: 'int' | 'rat' | 'float' | 'sym' | 'const' | 'str' }>;

export class Unsupported extends Error {}

export const int = (v: bigint): SNode => ({ k: 'int', v });
export const MINUS_ONE = int(-1n);

function gcd(a: bigint, b: bigint): bigint {
  a = a < 0n ? -a : a;
  b = b < 0n ? -b : b;
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

export function rational(p: bigint, q: bigint): SNode {
  if (q === 0n) return { k: 'const', name: p === 0n ? 'nan' : 'zoo' };
  if (q < 0n) [p, q] = [-p, -q];
  const g = gcd(p, q) || 1n;
  p /= g;
  q /= g;
  return q === 1n ? int(p) : { k: 'rat', p, q };
}

// latex2sympy's unary minus and subtraction: a number is negated, anything else becomes
// Mul(-1, ...) with a product's factors spliced in (`-2x` is Mul(-1, 2, x), printed -1*2*x).
export function negate(node: SNode): SNode {
  scalar(node);
  if (node.k === 'int') return int(-node.v);
  if (node.k === 'rat') return { k: 'rat', p: -node.p, q: node.q };
  if (node.k === 'float') return { k: 'float', v: -node.v };
  if (node.k === 'mul') return { k: 'mul', args: [MINUS_ONE, ...node.args] };
  return { k: 'mul', args: [MINUS_ONE, node] };
}

// latex2sympy's grammar has intervals, tuples and sets only as list elements and in set
// operations, never inside arithmetic: -[0,1), 2(1,3) or \frac{1 \pm 2}{3} do not parse.
export function scalar(node: SNode): SNode {
  if (node.k === 'interval' || node.k === 'tuple' || node.k === 'set') throw new Unsupported('set in arithmetic');
  return node;
}

export function flatAdd(args: SNode[]): SNode {
  args.forEach(scalar);
  const out: SNode[] = [];
  for (const a of args) if (a.k === 'add') out.push(...a.args);
  else out.push(a);
  return out.length === 1 && out[0] ? out[0] : { k: 'add', args: out };
}

export function flatMul(args: SNode[]): SNode {
  args.forEach(scalar);
  const out: SNode[] = [];
  for (const a of args) if (a.k === 'mul') out.push(...a.args);
  else out.push(a);
  return out.length === 1 && out[0] ? out[0] : { k: 'mul', args: out };
}

export function isNegativeNumber(n: SNode): boolean {
  return (n.k === 'int' && n.v < 0n) || (n.k === 'rat' && n.p < 0n) || (n.k === 'float' && n.v < 0);
}

export const isNumberLeaf = (n: SNode): n is Extract<SNode, { k: 'int' | 'rat' | 'float' }> => n.k === 'int' || n.k === 'rat' || n.k === 'float';
// -oo is Mul(-1, oo) in the tree, NegativeInfinity (a Number) to sympy.
export const isNegativeInfinity = (n: SNode): boolean => n.k === 'mul' && n.args.length === 2 && n.args[0]?.k === 'int' && n.args[0].v === -1n &&
  n.args[1]?.k === 'const' && n.args[1].name === 'oo';
export const isSympyNumber = (n: SNode): boolean => isNumberLeaf(n) || (n.k === 'const' && n.text === undefined && (n.name === 'oo' || n.name === 'nan')) ||
  isNegativeInfinity(n);
export const isAtom = (n: SNode): n is Atom => isNumberLeaf(n) || n.k === 'sym' || n.k === 'const' || n.k === 'str';
export const isInfinite = (n: SNode): boolean =>
  (n.k === 'const' && n.name === 'oo') || (n.k === 'mul' && n.args.length === 2 && n.args.some((a) => a.k === 'const' && a.name === 'oo'));

// sympy's function classes: exp, log, sin, cos, ... have fixed sort ranks, the other named ones
// 10000, undefined functions (f(x)) 0; an undefined function makes an expression not a number.
export const FUNCTION_RANK: Record<string, number> = {
  exp: 10, log: 11, sin: 20, cos: 21, tan: 22, cot: 23, sinh: 30, cosh: 31, tanh: 32, coth: 33,
  conjugate: 40, re: 41, im: 42, arg: 43,
};
export const NAMED_FUNCTIONS = new Set([
  'sec', 'csc', 'asin', 'acos', 'atan', 'acot', 'asec', 'acsc', 'asinh', 'acosh', 'atanh', 'Abs', 'factorial',
  'binomial', 'floor', 'ceiling', 'gamma', 'sqrt', 'sign',
]);
export const isUndefinedFunction = (name: string): boolean => FUNCTION_RANK[name] === undefined && !NAMED_FUNCTIONS.has(name) &&
  !['Max', 'Min', 'gcd', 'lcm'].includes(name);

/** math-verify's is_expr_of_only_symbols: built from symbols alone (x, x*y, 1/x), no number in it. */
export function isExprOfOnlySymbols(n: SNode): boolean {
  switch (n.k) {
    case 'sym':
      return true;
    case 'pow':
      return n.exp.k === 'int' && n.exp.v === -1n ? isExprOfOnlySymbols(n.base) : isExprOfOnlySymbols(n.base) && isExprOfOnlySymbols(n.exp);
    case 'add':
    case 'mul':
    case 'fn':
    case 'and':
      return n.args.length > 0 && n.args.every(isExprOfOnlySymbols);
    case 'rel':
      return isExprOfOnlySymbols(n.lhs) && isExprOfOnlySymbols(n.rhs);
    case 'set':
    case 'tuple':
      return n.items.length > 0 && n.items.every(isExprOfOnlySymbols);
    case 'interval':
      return isExprOfOnlySymbols(n.lo) && isExprOfOnlySymbols(n.hi);
    default:
      return false;
  }
}
