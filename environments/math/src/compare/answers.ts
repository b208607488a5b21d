// Math-Verify's sympy_expr_eq: structure first (sets, intervals, tuples, matrices, equations,
// inequalities, symbols), then each scalar (scalar.ts).

import { isExprOfOnlySymbols, print, type SNode } from '../sympy/index.ts';
import { doublesClose, evalDouble, sampler } from './doubles.ts';
import { FN_NAMES } from './engine.ts';
import { log10Abs } from './exact.ts';
import { scalarEqual } from './scalar.ts';
import { freeSymbols } from './shape.ts';

function isScalar(n: SNode): boolean {
  return ['int', 'rat', 'float', 'sym', 'const', 'add', 'mul', 'pow', 'fn'].includes(n.k) &&
    !(n.k === 'const' && n.name === 'EmptySet');
}


function setEqual(a: SNode[], b: SNode[], corrections: boolean): boolean {
  const unique = (items: SNode[]): SNode[] => {
    const out: SNode[] = [];
    for (const item of items) if (!out.some((o) => answersEqual(o, item, corrections))) out.push(item);
    return out;
  };
  const ua = unique(a);
  const ub = unique(b);
  if (ua.length !== ub.length) return false;
  const used = new Set<number>();
  return ua.every((x) => {
    const j = ub.findIndex((y, idx) => !used.has(idx) && answersEqual(x, y, corrections));
    if (j < 0) return false;
    used.add(j);
    return true;
  });
}

type Rel = Extract<SNode, { k: 'rel' }>;

const isRelation = (n: SNode): boolean => n.k === 'rel' || (n.k === 'and' && n.args.length > 0 && n.args.every((a) => a.k === 'rel'));
const isEquation = (n: SNode): boolean =>
  (n.k === 'rel' && n.op === '=') || (n.k === 'and' && n.args.length > 0 && n.args.every((a) => a.k === 'rel' && a.op === '='));
const firstRelation = (n: SNode): Rel => (n.k === 'and' ? firstRelation(n.args[0] as SNode) : (n as Rel));
const lastRelation = (n: SNode): Rel => (n.k === 'and' ? lastRelation(n.args.at(-1) as SNode) : (n as Rel));
/** `x = 3`, `f(x) = 3`, `AB = 3`, `a = b = 3`: an equation that names a value. */
const isAssignment = (n: SNode): boolean => isEquation(n) && isExprOfOnlySymbols(firstRelation(n).lhs);

const INVERSE: Record<string, string> = { '<': '>', '>': '<', '<=': '>=', '>=': '<=', '=': '=' };

const minus = (a: SNode, b: SNode): SNode => ({ k: 'add', args: [a, { k: 'mul', args: [{ k: 'int', v: -1n }, b] }] });
const isNumberAtom = (n: SNode): boolean =>
  n.k === 'int' || n.k === 'rat' || n.k === 'float' ||
  (n.k === 'mul' && n.args.length === 2 && n.args[1]?.k === 'rat' && n.args[1].p === 1n && n.args[1].q === 100n && isNumberAtom(n.args[0] as SNode));
const isFloatAtom = (n: SNode): boolean =>
  n.k === 'float' || (n.k === 'mul' && n.args.length === 2 && n.args[1]?.k === 'rat' && n.args[1].p === 1n && n.args[1].q === 100n && n.args[0]?.k === 'float');

/** Python's round(x, 6) as sympy does it on a Float: to 6 decimal places. */
const round6 = (x: number): number => Math.round(x * 1e6) / 1e6;

/** Two equations or inequalities with proportional sides (the same solutions): `2x+4y=3` and `y=-x/2+3/4`. */
function proportional(a: SNode, b: SNode, sign: 1 | -1 | 0): boolean {
  const symbols = [...new Set([...freeSymbols(a), ...freeSymbols(b)])].sort();
  if (symbols.length === 0) return false;
  const next = sampler(0xa11ce);
  let ratio: number | undefined;
  for (let attempt = 0; attempt < 6; attempt++) {
    const values = new Map<string, number>();
    for (const s of symbols) values.set(s, Math.round((0.15 + 1.7 * next()) * 1e6) / 1e6);
    const x = evalDouble(a, values);
    const y = evalDouble(b, values);
    if (!Number.isFinite(x) || !Number.isFinite(y) || y === 0) return false;
    const r = x / y;
    if (ratio === undefined) ratio = r;
    else if (!doublesClose(r, ratio, 9, 12)) return false;
  }
  return ratio !== undefined && ratio !== 0 && (sign === 0 || Math.sign(ratio) === sign);
}

const NEG_INFINITY: SNode = { k: 'mul', args: [{ k: 'int', v: -1n }, { k: 'const', name: 'oo' }] };
const INFINITY: SNode = { k: 'const', name: 'oo' };

/** sympy's as_set() for one variable: `a < x <= b`, `x > a`; undefined for anything else. */
function relationAsSet(n: SNode): SNode | undefined {
  const variable = (x: SNode): boolean => x.k === 'sym' || (x.k === 'fn' && !(x.name in FN_NAMES)) || (x.k === 'mul' && isExprOfOnlySymbols(x));
  const constant = (x: SNode): boolean => freeSymbols(x).size === 0 && isScalar(x);
  if (n.k === 'and' && n.args.length === 2) {
    const [a, b] = n.args as [Rel, Rel];
    const lower = (r: Rel): boolean => r.op === '<' || r.op === '<=';
    if (lower(a) && lower(b) && variable(a.rhs) && print(a.rhs) === print(b.lhs) && constant(a.lhs) && constant(b.rhs)) {
      return { k: 'interval', lo: a.lhs, hi: b.rhs, lopen: a.op === '<', ropen: b.op === '<' };
    }
    const upper = (r: Rel): boolean => r.op === '>' || r.op === '>=';
    if (upper(a) && upper(b) && variable(a.rhs) && print(a.rhs) === print(b.lhs) && constant(a.lhs) && constant(b.rhs)) {
      return { k: 'interval', lo: b.rhs, hi: a.lhs, lopen: b.op === '>', ropen: a.op === '>' };
    }
    return undefined;
  }
  if (n.k !== 'rel' || n.op === '=' || n.op === '!=') return undefined;
  const flipped: Rel = variable(n.rhs) && constant(n.lhs) ? { k: 'rel', op: INVERSE[n.op] as Rel['op'], lhs: n.rhs, rhs: n.lhs } : n;
  if (!variable(flipped.lhs) || !constant(flipped.rhs)) return undefined;
  if (flipped.op === '<' || flipped.op === '<=') return { k: 'interval', lo: NEG_INFINITY, hi: flipped.rhs, lopen: true, ropen: flipped.op === '<' };
  return { k: 'interval', lo: flipped.rhs, hi: INFINITY, lopen: flipped.op === '>', ropen: true };
}

function relationsEqual(gold: SNode, pred: SNode, corrections: boolean): boolean {
  if (gold.k === 'and' && pred.k === 'and') {
    return gold.args.length === pred.args.length && gold.args.every((g, i) => relationsEqual(g, pred.args[i] as SNode, corrections));
  }
  if (gold.k !== 'rel' || pred.k !== 'rel') return false;
  if (gold.op === pred.op && answersEqual(minus(gold.lhs, gold.rhs), minus(pred.lhs, pred.rhs), corrections)) return true;
  if (INVERSE[gold.op] === pred.op && answersEqual(minus(gold.lhs, gold.rhs), minus(pred.rhs, pred.lhs), corrections)) return true;
  // sympy's solve() of both: the same solutions when the sides are proportional.
  const dg = minus(gold.lhs, gold.rhs);
  const dp = minus(pred.lhs, pred.rhs);
  if (gold.op === '=' && pred.op === '=') return proportional(dg, dp, 0);
  if (gold.op === pred.op) return proportional(dg, dp, 1);
  if (INVERSE[gold.op] === pred.op) return proportional(dg, dp, -1);
  return false;
}

/**
 * `x_1 = 3, x_2 = -2`: values given to several different unknowns, an assignment rather than a set
 * of values. Against a gold set of plain values math_with_judge scores it 0 (the gold's format is
 * followed, as in Math-Verify's sympy_expr_eq), and so does rollserve: no 1 where it gives 0.
 * `x = 3, x = -2` (one unknown, its values) is still the set {3, -2}.
 */
function labelsValues(items: readonly SNode[]): boolean {
  if (items.length < 2 || !items.every(isAssignment)) return false;
  return new Set(items.map((item) => print(firstRelation(item).lhs))).size === items.length;
}

const isSetLike = (n: SNode): boolean => n.k === 'set' || n.k === 'tuple' || n.k === 'interval' || (n.k === 'const' && n.name === 'EmptySet');
const itemsOf = (n: SNode): SNode[] => (n.k === 'set' || n.k === 'tuple' ? n.items : []);

function setsEqual(gold: SNode, pred: SNode, corrections: boolean): boolean {
  const a: SNode = isSetLike(gold) ? gold : { k: 'set', items: [gold] };
  const b: SNode = isSetLike(pred) ? pred : { k: 'set', items: [pred] };
  if (a.k === 'interval' && b.k === 'interval') {
    return a.lopen === b.lopen && a.ropen === b.ropen && answersEqual(a.lo, b.lo, corrections) && answersEqual(a.hi, b.hi, corrections);
  }
  if (print(a) === print(b)) return true;
  const emptyA = (a.k === 'const' && a.name === 'EmptySet') || (a.k === 'set' && a.items.length === 0);
  const emptyB = (b.k === 'const' && b.name === 'EmptySet') || (b.k === 'set' && b.items.length === 0);
  if (emptyA || emptyB) return emptyA && emptyB;
  const inOrder = (x: SNode[], y: SNode[]): boolean => x.length === y.length && x.every((item, i) => answersEqual(item, y[i] as SNode, corrections));
  if ((a.k === 'set' || a.k === 'tuple') && (b.k === 'set' || b.k === 'tuple')) {
    if (labelsValues(b.items) && !a.items.some(isEquation)) return false;
    if (a.k === 'set' && b.k === 'set') return setEqual(a.items, b.items, corrections);
    return inOrder(a.items, b.items);
  }
  if (a.k === 'interval' && (b.k === 'set' || b.k === 'tuple') && a.lopen && a.ropen && itemsOf(b).length === 2) return inOrder([a.lo, a.hi], itemsOf(b));
  if (b.k === 'interval' && (a.k === 'set' || a.k === 'tuple') && b.lopen && b.ropen && itemsOf(a).length === 2) return inOrder(itemsOf(a), [b.lo, b.hi]);
  return false;
}

function symbolsEqual(gold: SNode, pred: SNode): boolean {
  const isE = (n: SNode): boolean => n.k === 'const' && n.name === 'E';
  const name = (n: SNode): string | undefined => (n.k === 'sym' ? n.name : n.k === 'const' && n.text !== undefined ? n.text : undefined);
  const g = name(gold);
  const p = name(pred);
  if ((g?.toLowerCase() === 'e' && isE(pred)) || (p?.toLowerCase() === 'e' && isE(gold))) return true;
  const concat = (n: SNode): string | undefined =>
    n.k === 'mul' && n.args.every((x) => isE(x) || name(x) !== undefined) ? n.args.map((x) => (isE(x) ? 'e' : (name(x) as string))).join('') : undefined;
  if (g !== undefined && pred.k === 'mul') return g.toLowerCase() === concat(pred)?.toLowerCase();
  if (p !== undefined && gold.k === 'mul') return p.toLowerCase() === concat(gold)?.toLowerCase();
  if (g !== undefined && p !== undefined) return (g.length > 1 ? g.toLowerCase() : g) === (p.length > 1 ? p.toLowerCase() : p);
  return print(gold) === print(pred);
}

/** Math-Verify's sympy_numeric_eq/sympy_symbolic_eq on two scalar expressions. */
function scalarsEqual(gold: SNode, pred: SNode, corrections: boolean): boolean {
  if (isFloatAtom(gold) || isFloatAtom(pred)) {
    const a = evalDouble(gold);
    const b = evalDouble(pred);
    if (Number.isFinite(a) && Number.isFinite(b)) return round6(a) === round6(b);
  }
  if (scalarEqual(gold, pred)) return true;
  if (corrections || isNumberAtom(gold) || isNumberAtom(pred)) return false;
  // Math-Verify: (a - b).evalf(15, chop=True) == 0, which takes values within about 1e-15 of each
  // other as equal (1/2004! and 1/2006!). rollserve's exact comparison above says no.
  if (freeSymbols(gold).size > 0 || freeSymbols(pred).size > 0) return false;
  const a = evalDouble(gold);
  const b = evalDouble(pred);
  if (Number.isFinite(a) && Number.isFinite(b)) return Math.abs(a - b) < 1e-15;
  const la = log10Abs(gold);
  const lb = log10Abs(pred);
  return Number.isFinite(la) && Number.isFinite(lb) && la < -15 && lb < -15;
}

/**
 * Gold `gold` and prediction `pred` denote the same answer (Math-Verify's sympy_expr_eq).
 * `corrections` applies rollserve's deliberate differences (README); off, Math-Verify's verdict.
 */
export function answersEqual(gold: SNode, pred: SNode, corrections = true): boolean {
  const goldAssignment = isAssignment(gold);
  const predAssignment = isAssignment(pred);
  const goldEquation = isEquation(gold);
  const predEquation = isEquation(pred);
  if (goldAssignment) gold = { k: 'rel', op: '=', lhs: firstRelation(gold).lhs, rhs: lastRelation(gold).rhs };
  if (predAssignment) pred = { k: 'rel', op: '=', lhs: firstRelation(pred).lhs, rhs: lastRelation(pred).rhs };
  if (predEquation && !goldEquation) pred = lastRelation(pred).rhs;
  else if (goldAssignment && !predEquation) gold = lastRelation(gold).rhs;

  // A relation against a set: the relation's solution set (0 < x < 1 is the interval (0, 1)).
  if (isRelation(gold) && (pred.k === 'set' || pred.k === 'interval')) gold = relationAsSet(gold) ?? gold;

  if (print(gold) === print(pred)) return true;
  if (isRelation(gold) && isRelation(pred)) return relationsEqual(gold, pred, corrections);
  if (isSetLike(gold) || isSetLike(pred)) return setsEqual(gold, pred, corrections);
  if (gold.k === 'sym' || pred.k === 'sym' || (gold.k === 'const' && gold.text !== undefined) || (pred.k === 'const' && pred.text !== undefined)) {
    if (symbolsEqual(gold, pred)) return true;
    if (gold.k === 'sym' || pred.k === 'sym') return false;
  }
  if (gold.k === 'matrix' && pred.k === 'matrix') {
    return gold.rows.length === pred.rows.length &&
      gold.rows.every((row, i) => row.length === (pred.rows[i] ?? []).length && row.every((x, j) => answersEqual(x, (pred.rows[i] as SNode[])[j] as SNode, corrections)));
  }
  if (isScalar(gold) && isScalar(pred)) return scalarsEqual(gold, pred, corrections);
  if (gold.k === 'str' && pred.k === 'str') return gold.v.trim() === pred.v.trim();
  return false;
}
