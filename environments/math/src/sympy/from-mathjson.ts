// Builds the sympy-like tree from the engine's non-canonical MathJSON as math-verify's latex2sympy
// builds it from LaTeX: nothing is evaluated but integer fractions (and binomials of integers).

import { numericValue } from './evalf.ts';
import { FUNCTIONS, fromSymbol, isAtomJson, isRelation, type Json, LETTER_SYMBOL, RELATIONS } from './mathjson-names.ts';
import { flatAdd, flatMul, int, isExprOfOnlySymbols, MINUS_ONE, negate, rational, scalar, type SNode, Unsupported } from './tree.ts';

function isOpen(x: Json): x is [string, Json] {
  return Array.isArray(x) && x[0] === 'Open';
}

/** Builds the sympy-like tree from non-canonical MathJSON. Throws `Unsupported` for errors. */
export function fromMathJson(json: Json, depth = 0): SNode {
  if (depth > 400) throw new Unsupported('too deep');
  if (depth === 0) {
    const assigned = setElementsRelation(json);
    if (assigned) return assigned;
  }
  if (typeof json === 'number') {
    if (Number.isInteger(json) && Math.abs(json) < 2 ** 53) return int(BigInt(json));
    if (!Number.isFinite(json)) return { k: 'const', name: Number.isNaN(json) ? 'nan' : 'oo' };
    return { k: 'float', v: json };
  }
  if (typeof json === 'string') return fromSymbol(json);
  if (json !== null && typeof json === 'object' && !Array.isArray(json)) {
    const obj = json as { num?: string; sym?: string; str?: string; fn?: Json[] };
    if (typeof obj.num === 'string') {
      const text = obj.num.replace(/\s/g, '');
      if (/^-?\d+$/.test(text)) return int(BigInt(text));
      if (/^-?\d+\.\d*\(\d+\)$/.test(text)) return { k: 'float', v: Number(text.replace(/[()]/g, '')) };
      const v = Number(text);
      if (Number.isNaN(v)) throw new Unsupported(`number ${text}`);
      return { k: 'float', v };
    }
    if (typeof obj.sym === 'string') return fromSymbol(obj.sym);
    if (typeof obj.str === 'string') return { k: 'str', v: obj.str };
    if (Array.isArray(obj.fn)) return fromMathJson(obj.fn, depth);
    throw new Unsupported('object');
  }
  if (!Array.isArray(json) || typeof json[0] !== 'string') throw new Unsupported('shape');
  const head = json[0];
  const ops = json.slice(1);
  const sub = (x: Json): SNode => fromMathJson(x, depth + 1);
  switch (head) {
    case 'Error':
    case 'ErrorCode':
    case 'LatexString':
      throw new Unsupported('error');
    case 'Negate':
      return negate(sub(ops[0]));
    case 'Add':
      return flatAdd(ops.map(sub));
    case 'Subtract': {
      const [first, ...rest] = ops.map(sub);
      if (!first) throw new Unsupported('subtract');
      return flatAdd([first, ...rest.map(negate)]);
    }
    case 'Multiply':
    case 'InvisibleOperator': {
      // latex2sympy's unary minus takes the whole product: -2x is -(2x).
      const first = ops[0];
      if (Array.isArray(first) && first[0] === 'Negate' && ops.length > 1) {
        return negate(flatMul([sub(first[1]), ...ops.slice(1).map(sub)]));
      }
      const factors: SNode[] = [];
      for (let i = 0; i < ops.length; i++) {
        const call = head === 'InvisibleOperator' ? functionCall(ops[i], ops[i + 1], depth) : undefined;
        if (call) i++;
        factors.push(call ?? sub(ops[i]));
      }
      if (factors.length === 1) return factors[0] as SNode;
      // A mixed number: 2\frac{1}{2} is 5/2.
      const [whole, part] = factors;
      if (head === 'InvisibleOperator' && factors.length === 2 && whole?.k === 'int' && part?.k === 'rat' && part.p > 0n) {
        return rational(whole.v * part.q + (whole.v < 0n ? -part.p : part.p), part.q);
      }
      return flatMul(factors);
    }
    case 'Divide':
    case 'Rational': {
      const num = sub(ops[0]);
      const den = sub(ops[1]);
      if (num.k === 'int' && den.k === 'int') return rational(num.v, den.v);
      return { k: 'mul', args: [scalar(num), { k: 'pow', base: scalar(den), exp: MINUS_ONE }] };
    }
    case 'Power': {
      const base = scalar(sub(ops[0]));
      const exp = scalar(sub(ops[1]));
      return { k: 'pow', base, exp };
    }
    case 'Square':
      return { k: 'pow', base: sub(ops[0]), exp: int(2n) };
    case 'Sqrt':
      return { k: 'pow', base: sub(ops[0]), exp: rational(1n, 2n) };
    case 'Root': {
      const n = sub(ops[1]);
      const exp: SNode = n.k === 'int' ? rational(1n, n.v) : { k: 'pow', base: n, exp: MINUS_ONE };
      return { k: 'pow', base: sub(ops[0]), exp };
    }
    case 'Delimiter': {
      const inner = ops[0];
      const fence = typeof ops[1] === 'string' ? ops[1] : '';
      if (Array.isArray(inner) && inner[0] === 'Sequence') {
        const items = inner.slice(1).flatMap((x) => elements(x, depth + 1));
        if (items.length === 1 && items[0]) return items[0];
        if (items.length === 2 && items[0] && items[1] && (fence.startsWith("'(") || fence.startsWith("'["))) {
          return interval(items[0], items[1], fence.startsWith("'("), fence.endsWith(")'"));
        }
        if (fence.startsWith("'(") || fence.startsWith("'[")) return { k: 'tuple', items };
        return { k: 'set', items };
      }
      if (inner === undefined) return { k: 'tuple', items: [] };
      return sub(inner);
    }
    case 'Sequence': {
      const items = ops.flatMap((x) => elements(x, depth + 1));
      if (items.length === 1 && items[0]) return items[0];
      return { k: 'set', items };
    }
    case 'Measurement': {
      // a \\pm b only as a whole answer or list element (elements() reads those), or as the right
      // side of a whole-answer x = ... (setElementsRelation): nowhere inside an expression.
      if (depth > 0) throw new Unsupported('pm inside an expression');
      const items = elements(json, depth);
      return { k: 'set', items };
    }
    case 'Colon':
      return sub(['Divide', ops[0], ops[1]]);
    case 'Element':
      return { k: 'rel', op: '=', lhs: sub(ops[0]), rhs: sub(ops[1]) };
    case 'Tuple':
    case 'Pair':
    case 'Triple':
      return { k: 'tuple', items: ops.map(sub) };
    case 'List': {
      if (ops.length === 1) return sub(ops[0]);
      if (ops.length === 2) return interval(sub(ops[0]), sub(ops[1]), false, false);
      return { k: 'tuple', items: ops.map(sub) };
    }
    case 'Union': {
      // latex2sympy reads a \cup b \cup c left to right: Union(Union(a, b), c).
      const flat: Json[] = [];
      const walk = (x: Json): void => {
        if (Array.isArray(x) && x[0] === 'Union') x.slice(1).forEach(walk);
        else flat.push(x);
      };
      ops.forEach(walk);
      if (flat.length < 2) throw new Unsupported('union');
      return flat.map(sub).reduce((acc, next) => ({ k: 'fn', name: 'Union', args: [acc, next] }));
    }
    case 'Set':
      return { k: 'set', items: ops.flatMap((x) => elements(x, depth + 1)) };
    case 'Interval': {
      const [lo, hi] = ops;
      return {
        k: 'interval',
        lo: sub(isOpen(lo) ? lo[1] : lo),
        hi: sub(isOpen(hi) ? hi[1] : hi),
        lopen: isOpen(lo),
        ropen: isOpen(hi),
      };
    }
    case 'Matrix': {
      const body = ops[0];
      if (!Array.isArray(body) || body[0] !== 'List') throw new Unsupported('matrix');
      return {
        k: 'matrix',
        rows: body.slice(1).map((row) => {
          if (Array.isArray(row) && row[0] === 'List') return row.slice(1).map(sub);
          return [sub(row)];
        }),
      };
    }
    case 'Log': {
      if (ops.length > 1) return { k: 'fn', name: 'log', args: [sub(ops[0]), sub(ops[1])] };
      return { k: 'fn', name: 'log', args: [sub(ops[0]), int(10n)] };
    }
    case 'Ln':
      return { k: 'fn', name: 'log', args: [sub(ops[0]), { k: 'const', name: 'E' }] };
    case 'Binomial':
    case 'Choose': {
      // sympy.binomial evaluates for integers.
      const [top, bottom] = ops.map(sub);
      if (top?.k === 'int' && bottom?.k === 'int' && top.v >= 0n && top.v <= 10_000n && bottom.v >= 0n && bottom.v <= top.v) {
        let value = 1n;
        for (let i = 0n; i < bottom.v; i++) value = (value * (top.v - i)) / (i + 1n);
        return int(value);
      }
      return { k: 'fn', name: 'binomial', args: ops.map(sub) };
    }
    case 'Lb':
      return { k: 'fn', name: 'log', args: [sub(ops[0]), int(2n)] };
    case 'Lg':
      return { k: 'fn', name: 'log', args: [sub(ops[0]), int(10n)] };
    case 'Hold':
      return sub(ops[0]);
    default: {
      if (RELATIONS[head] || head === 'Approx') return relationChain(json as Json[], depth);
      const fn = FUNCTIONS[head];
      if (fn) return { k: 'fn', name: fn, args: ops.map(sub) };
      if (/^__unit__$/.test(head)) throw new Unsupported('unit');
      if (/^[A-Z][A-Za-z]*$/.test(head) && ops.length > 0) return { k: 'fn', name: head, args: ops.map(sub) };
      throw new Unsupported(head);
    }
  }
}

/**
 * latex2sympy's function call: a letter (other than e, optionally subscripted) directly followed by
 * parentheses holding one atom (a number, a letter, a letter with an exponent or index, \\infty) or
 * a comma list is an undefined function applied to them: f(2), f(y), g(1, 2). Anything else in the
 * parentheses is a product: f(x+1) is f*(x + 1).
 */
function functionCall(name: Json, arg: Json, depth: number): SNode | undefined {
  if (typeof name !== 'string' || !/^[a-df-zA-Z](?:_[A-Za-z0-9]+)?$/.test(name)) return undefined;
  if (!Array.isArray(arg) || arg[0] !== 'Delimiter' || arg.length < 2) return undefined;
  const fence = arg[2];
  if (fence !== undefined && !(typeof fence === 'string' && fence.startsWith("'("))) return undefined;
  const inner = arg[1];
  let args: Json[];
  if (Array.isArray(inner) && inner[0] === 'Sequence') {
    args = inner.slice(1);
    if (args.length < 2) return undefined;
  } else if (isAtomJson(inner)) args = [inner];
  else return undefined;
  return { k: 'fn', name, args: args.map((x) => fromMathJson(x, depth + 1)) };
}

/**
 * latex2sympy's `set_elements_relation`: a whole answer `x = a, b, c` (or `(x, y) = ...`, or with
 * \\in) whose other elements hold no relation is one equation with the list as its right side:
 * Eq(x, {a, b, c}), Eq((x, y), {Interval.open(5, 8), (8, 5)}). `a = 1, b = 2` stays two equations.
 */
function setElementsRelation(json: Json): SNode | undefined {
  let first: Json;
  let rest: Json[] = [];
  if (Array.isArray(json) && (json[0] === 'Equal' || json[0] === 'Element') && Array.isArray(json[2]) && json[2][0] === 'Measurement') {
    first = json;
  } else {
    if (!Array.isArray(json) || json[0] !== 'Delimiter' || json[2] !== "','") return undefined;
    const list = json[1];
    if (!Array.isArray(list) || list[0] !== 'Sequence' || list.length < 3) return undefined;
    [first, ...rest] = list.slice(1) as Json[];
  }
  if (!Array.isArray(first) || (first[0] !== 'Equal' && first[0] !== 'Element') || first.length !== 3) return undefined;
  if (rest.some(isRelation) || isRelation(first[2])) return undefined;
  const letter = (x: Json): x is string => typeof x === 'string' && x !== 'e' && LETTER_SYMBOL.test(x);
  const lhsJson = first[1];
  let lhs: SNode;
  if (letter(lhsJson)) lhs = fromSymbol(lhsJson);
  else if (Array.isArray(lhsJson) && lhsJson[0] === 'Delimiter' && lhsJson[2] === "'(,)'" && Array.isArray(lhsJson[1]) &&
    lhsJson[1][0] === 'Sequence' && lhsJson[1].slice(1).every(letter)) {
    lhs = { k: 'tuple', items: (lhsJson[1].slice(1) as string[]).map(fromSymbol) };
  } else return undefined;
  const items = [first[2], ...rest].flatMap((x) => elements(x, 0));
  return { k: 'rel', op: '=', lhs, rhs: items.length === 1 ? (items[0] as SNode) : { k: 'set', items } };
}

/** latex2sympy's interval: an empty one (right end not past the left) is a tuple instead. */
function interval(lo: SNode, hi: SNode, lopen: boolean, ropen: boolean): SNode {
  const a = numericValue(lo);
  const b = numericValue(hi);
  if (!Number.isNaN(a) && !Number.isNaN(b) && ((lopen && ropen && b <= a) || (!lopen && !ropen && b < a))) {
    return { k: 'tuple', items: [lo, hi] };
  }
  return { k: 'interval', lo, hi, lopen, ropen };
}

/** A list element: `a \\pm b` is two elements (a + b, a - b), anything else one. */
function elements(json: Json, depth: number): SNode[] {
  if (Array.isArray(json) && json[0] === 'Measurement') {
    const a = fromMathJson(json[1], depth + 1);
    const b = fromMathJson(json[2], depth + 1);
    // The minus side is an evaluated Mul(-1, b): a leading number takes the sign (3 - 2*sqrt(2)).
    const minus = b.k === 'mul' && (b.args[0]?.k === 'int' || b.args[0]?.k === 'rat' || b.args[0]?.k === 'float')
      ? { k: 'mul' as const, args: [negate(b.args[0] as SNode), ...b.args.slice(1)] }
      : negate(b);
    if (a.k === 'int' && a.v === 0n) return [minus, b];
    return [flatAdd([a, b]), flatAdd([a, minus])];
  }
  return [fromMathJson(json, depth + 1)];
}

/**
 * latex2sympy's relations, read left to right: `a = b = c` is And(Eq(a, b), Eq(b, c)); `a \\approx b`
 * is b when a is only symbols (`x \\approx 11` is 11), else a.
 */
function relationChain(json: Json[], depth: number): SNode {
  const terms: Json[] = [];
  const ops: string[] = [];
  const walk = (x: Json): void => {
    if (Array.isArray(x) && (RELATIONS[x[0] as string] || x[0] === 'Approx') && x.length >= 3) {
      x.slice(1).forEach((operand, i) => {
        if (i > 0) ops.push(x[0] as string);
        walk(operand);
      });
    } else terms.push(x);
  };
  walk(json);
  let acc: SNode = fromMathJson(terms[0], depth + 1);
  for (let i = 0; i < ops.length; i++) {
    const head = ops[i] as string;
    const rh = fromMathJson(terms[i + 1], depth + 1);
    if (head === 'Approx') {
      acc = isExprOfOnlySymbols(acc) ? rh : acc;
      continue;
    }
    const op = RELATIONS[head] as '=' | '<' | '<=' | '>' | '>=' | '!=';
    if (acc.k === 'and') {
      const last = acc.args.at(-1) as Extract<SNode, { k: 'rel' }>;
      acc = { k: 'and', args: [...acc.args, { k: 'rel', op, lhs: last.rhs, rhs: rh }] };
    } else if (acc.k === 'rel') {
      acc = { k: 'and', args: [acc, { k: 'rel', op, lhs: acc.rhs, rhs: rh }] };
    } else acc = { k: 'rel', op, lhs: acc, rhs: rh };
  }
  return acc;
}
