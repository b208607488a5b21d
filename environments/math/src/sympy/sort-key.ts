// sympy's default_sort_key (sympy/core/sorting.py, Basic.sort_key, Expr.sort_key) and ordered().
// sympy orders the factors of a product, the elements of a set and the arguments of And by
// default_sort_key: (class key, (number of args, arg keys), exponent key, coefficient), compared as
// Python compares tuples. Class keys: numbers (1, 0, 'Number'); atoms (2, 0, class name: Exp1,
// ImaginaryUnit, Pi, Symbol); Mul, Add, Pow (3, 0..2); functions (4, rank, name), where exp, log,
// sin, cos, ... have fixed ranks, undefined functions (f(x)) 0 and the other named functions 10000;
// everything else (relations, sets, tuples, intervals) (5, 0, class name).

import { numericValue } from './evalf.ts';
import { printAtom } from './print-atom.ts';
import {
  FUNCTION_RANK,
  isAtom,
  isInfinite,
  isNegativeInfinity,
  isNegativeNumber,
  isNumberLeaf,
  isSympyNumber,
  MINUS_ONE,
  NAMED_FUNCTIONS,
  negate,
  type SNode,
} from './tree.ts';

export type SortKey = ReadonlyArray<number | string | SortKey>;

const BASIC_CLASS: Record<string, string> = {
  '=': 'Equality', '!=': 'Unequality', '<': 'StrictLessThan', '<=': 'LessThan', '>': 'StrictGreaterThan', '>=': 'GreaterThan',
};

function classKey(n: SNode): SortKey {
  switch (n.k) {
    case 'int':
    case 'rat':
    case 'float':
      return [1, 0, 'Number'];
    case 'const':
      if (n.text !== undefined) return [2, 0, 'Symbol'];
      return n.name === 'oo' || n.name === 'nan' ? [1, 0, 'Number'] : n.name === 'EmptySet' ? [5, 0, 'EmptySet']
        : [2, 0, { pi: 'Pi', E: 'Exp1', I: 'ImaginaryUnit', zoo: 'ComplexInfinity' }[n.name]];
    case 'sym':
    case 'str':
      return [2, 0, 'Symbol'];
    case 'mul':
      return [3, 0, 'Mul'];
    case 'add':
      return [3, 1, 'Add'];
    case 'pow':
      return [3, 2, 'Pow'];
    case 'fn':
      if (n.name === 'Max' || n.name === 'Min' || n.name === 'Union') return [5, 0, n.name];
      return [4, FUNCTION_RANK[n.name] ?? (NAMED_FUNCTIONS.has(n.name) ? 10000 : 0), n.name];
    case 'rel':
      return [5, 0, BASIC_CLASS[n.op] as string];
    case 'and':
      return [5, 0, 'And'];
    case 'set':
      return [5, 0, 'FiniteSet'];
    case 'tuple':
      return [5, 0, 'Tuple'];
    case 'interval':
      return [5, 0, 'Interval'];
    case 'matrix':
      return [5, 0, 'ImmutableDenseMatrix'];
  }
}

const ONE_KEY: SortKey = [[1, 0, 'Number'], [0, []], [], 1];
const boolKey = (b: boolean): SortKey => [[2, 0, b ? 'BooleanTrue' : 'BooleanFalse'], [1, [b ? 'True' : 'False']], ONE_KEY, 1];

/** Python's tuple comparison of two sort keys (numbers before strings before tuples). */
export function compareSortKeys(a: SortKey, b: SortKey): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a[i] as number | string | SortKey;
    const y = b[i] as number | string | SortKey;
    const tx = typeof x === 'number' ? 0 : typeof x === 'string' ? 1 : 2;
    const ty = typeof y === 'number' ? 0 : typeof y === 'string' ? 1 : 2;
    if (tx !== ty) return tx - ty;
    let c = 0;
    if (tx !== 2) c = x < y ? -1 : x > y ? 1 : 0;
    else c = compareSortKeys(x as SortKey, y as SortKey);
    if (c !== 0) return c;
  }
  return a.length - b.length;
}

/** sympy's _node_count: 1 per node of the tree, a Float 0.5. */
function nodeCount(n: SNode): number {
  if (isNegativeInfinity(n)) return 1;
  switch (n.k) {
    case 'float':
      return 0.5;
    case 'add':
    case 'mul':
    case 'fn':
    case 'and':
      return 1 + n.args.reduce((acc, a) => acc + nodeCount(a), 0);
    case 'pow':
      return 1 + nodeCount(n.base) + nodeCount(n.exp);
    case 'rel':
      return 1 + nodeCount(n.lhs) + nodeCount(n.rhs);
    case 'set':
    case 'tuple':
      return 1 + n.items.reduce((acc, a) => acc + nodeCount(a), 0);
    case 'interval':
      return 3 + nodeCount(n.lo) + nodeCount(n.hi);
    case 'matrix':
      return 3 + n.rows.flat().reduce((acc, a) => acc + nodeCount(a), 0);
    default:
      return 1;
  }
}

/** default_sort_key and ordered(), bound to the as_ordered_terms() they stand on. */
export interface SortOrder {
  /** sympy's default_sort_key of the tree. */
  sortKey(n: SNode): SortKey;
  /** Two trees by their default_sort_key. */
  compare(a: SNode, b: SNode): number;
  /** sympy's ordered() (how And keeps its arguments): by node count, then default_sort_key. */
  ordered(args: SNode[]): SNode[];
}

/**
 * An Add's key is made from its terms in as_ordered_terms() order, and that order sorts the terms'
 * generators by these keys: the printer, which holds both, hands the term order in.
 */
export function defaultSortKey(orderedTerms: (terms: SNode[]) => SNode[]): SortOrder {
  const sortKeys = new WeakMap<SNode, SortKey>();

  function sortKey(n: SNode): SortKey {
    let key = sortKeys.get(n);
    if (!key) {
      key = computeSortKey(n);
      sortKeys.set(n, key);
    }
    return key;
  }

  function computeSortKey(n: SNode): SortKey {
    if (isSympyNumber(n)) return [[1, 0, 'Number'], [0, []], [], numericValue(n)];
    if (isAtom(n)) return [classKey(n), [1, [printAtom(n, false)]], ONE_KEY, 1];
    if (n.k === 'fn' && n.name === 'Union') return [classKey(n), [n.args.length, n.args.map(sortKey).sort(compareSortKeys)], ONE_KEY, 1];
    if (n.k === 'add' || n.k === 'mul' || n.k === 'pow' || n.k === 'fn') {
      // Expr.sort_key: the numeric coefficient apart, a power by its base then its exponent.
      let coeff = 1;
      let expr: SNode = n;
      if (n.k === 'mul' && n.args[0] && isSympyNumber(n.args[0]) && n.args.length > 1) {
        coeff = numericValue(n.args[0]);
        expr = n.args.length === 2 ? (n.args[1] as SNode) : { k: 'mul', args: n.args.slice(1) };
      }
      let exp: SortKey = ONE_KEY;
      if (expr.k === 'pow') {
        if (expr.base.k === 'const' && expr.base.name === 'E' && expr.base.text === undefined) {
          expr = { k: 'fn', name: 'exp', args: [expr.exp] };
        } else {
          exp = sortKey(expr.exp);
          expr = expr.base;
        }
      }
      let args: Array<string | SortKey>;
      if (isAtom(expr)) args = [printAtom(expr, false)];
      else if (expr.k === 'add') args = orderedTerms(expr.args).map(sortKey);
      else if (expr.k === 'mul') {
        // as_ordered_factors (args_cnc): a leading negative number other than -1 is split off as -1.
        const [lead, ...others] = expr.args;
        const factors = lead && isNumberLeaf(lead) && isNegativeNumber(lead) && !(lead.k === 'int' && lead.v === -1n)
          ? [MINUS_ONE, negate(lead), ...others] : expr.args;
        args = factors.map(sortKey).sort(compareSortKeys);
      }
      else if (expr.k === 'pow' || expr.k === 'fn') args = (expr.k === 'pow' ? [expr.base, expr.exp] : expr.args).map(sortKey);
      else return [classKey(expr), [1, [sortKey(expr)]], exp, coeff];
      return [classKey(expr), [args.length, args], exp, coeff];
    }
    // Basic.sort_key: (class key, (number of args, arg keys), 1, 1).
    let args: SortKey[];
    switch (n.k) {
      case 'rel':
        args = [sortKey(n.lhs), sortKey(n.rhs)];
        break;
      case 'and':
        args = ordered(n.args).map(sortKey);
        break;
      case 'set':
        args = n.items.map(sortKey).sort(compareSortKeys);
        break;
      case 'tuple':
        args = n.items.map(sortKey);
        break;
      case 'interval':
        args = [sortKey(n.lo), sortKey(n.hi), boolKey(n.lopen || isInfinite(n.lo)), boolKey(n.ropen || isInfinite(n.hi))];
        break;
      case 'matrix':
        args = [n.rows.length, n.rows[0]?.length ?? 0, ...n.rows.flat().map(sortKey)] as unknown as SortKey[];
        break;
      default:
        args = [];
    }
    return [classKey(n), [args.length, args], ONE_KEY, 1];
  }

  function compare(a: SNode, b: SNode): number {
    return compareSortKeys(sortKey(a), sortKey(b));
  }

  function ordered(args: SNode[]): SNode[] {
    return [...args].sort((a, b) => nodeCount(a) - nodeCount(b) || compare(a, b));
  }

  return { sortKey, compare, ordered };
}
