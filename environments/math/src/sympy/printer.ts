// The StrPrinter's methods: sympy's `str()` of the tree, as math_with_judge's `extracted_answer`
// shows what latex2sympy built: `83/499`, `sqrt(2)`, `2**2017*sqrt(3)`, Add terms in sympy's
// `as_ordered_terms` order, `Eq(x, 2)`, `Interval.Lopen(1, 2)`, `{1, 2}`.

import { asOrderedTerms } from './ordered-terms.ts';
import { PREC, precedence } from './precedence.ts';
import { printAtom, symbolName } from './print-atom.ts';
import { defaultSortKey } from './sort-key.ts';
import { int, isInfinite, isNegativeNumber, negate, type SNode } from './tree.ts';

// The sort key orders an Add's terms with as_ordered_terms(), which names generators by printing
// them and sorts them by the sort key: the printer ties the three together.
const sortOrder = defaultSortKey((terms) => orderedTerms(terms));
const orderedTerms = asOrderedTerms(print, sortOrder.compare);
const compareNodes = sortOrder.compare;

function parenthesize(n: SNode, level: number, strict = false): string {
  const prec = precedence(n);
  const s = print(n);
  return prec < level || (!strict && prec <= level) ? `(${s})` : s;
}

function printAdd(n: Extract<SNode, { k: 'add' }>): string {
  const parts: string[] = [];
  for (const term of orderedTerms(n.args)) {
    let t = print(term);
    let sign = '+';
    if (t.startsWith('-') && term.k !== 'add') {
      sign = '-';
      t = t.slice(1);
    }
    parts.push(sign, precedence(term) < PREC.Add || term.k === 'add' ? `(${t})` : t);
  }
  const first = parts.shift();
  return (first === '-' ? '-' : '') + parts.join(' ');
}

function couldExtractMinus(n: SNode): boolean {
  return isNegativeNumber(n) || (n.k === 'mul' && n.args[0] !== undefined && isNegativeNumber(n.args[0]));
}

function isInteger(n: SNode): boolean {
  return n.k === 'int';
}

function isOne(n: SNode | undefined): boolean {
  return n?.k === 'int' && n.v === 1n;
}

function negativeExponent(n: SNode): boolean {
  if (n.k === 'mul') return n.args[0] !== undefined && isNegativeNumber(n.args[0]);
  return isNegativeNumber(n);
}

function invertExponent(pow: Extract<SNode, { k: 'pow' }>): SNode {
  const e = negate(pow.exp);
  return isOne(e) ? pow.base : { k: 'pow', base: pow.base, exp: e };
}

function printMul(n: Extract<SNode, { k: 'mul' }>): string {
  const prec = precedence(n);
  const args = n.args;
  // sympy prints an unevaluated product "as written" when it starts with 1 or has a number (or a
  // power of integers) after its first factor.
  const literal = isOne(args[0]) || args.slice(1).some((a) =>
    a.k === 'int' || a.k === 'rat' || a.k === 'float' || (a.k === 'pow' && isInteger(a.base) && isInteger(a.exp)));
  if (literal) {
    const d: SNode[] = [];
    const num: SNode[] = [];
    for (const a of args) {
      if (a.k === 'pow' && negativeExponent(a.exp)) d.push(invertExponent(a));
      else num.push(a);
    }
    const nf: string[] = [];
    if (num[0] && num[0].k !== 'add' && couldExtractMinus(num[0])) nf.push(print(num.shift() as SNode));
    nf.push(...num.map((a) => parenthesize(a, prec)));
    if (nf.length === 0) nf.push('1');
    const df: string[] = [];
    if (d.length > 1 && d[0] && couldExtractMinus(d[0])) df.push(print(d.shift() as SNode));
    df.push(...d.map((a) => parenthesize(a, prec)));
    const ns = nf.join('*');
    if (df.length > 1) return `${ns}/(${df.join('*')})`;
    if (df.length === 1) return `${ns}/${df[0]}`;
    return ns;
  }
  let rest = [...args];
  let sign = '';
  const first = rest[0];
  if (first && (first.k === 'int' || first.k === 'rat' || first.k === 'float') && isNegativeNumber(first)) {
    sign = '-';
    const pos = negate(first);
    // sympy's _keep_coeff: a lone product after the coefficient is spliced in (-1/9 * (pi*E) is
    // printed -E*pi/9).
    const tail = rest.length === 2 && rest[1]?.k === 'mul' ? rest[1].args : rest.slice(1);
    rest = isOne(pos) ? [...tail] : [pos, ...tail];
  }
  const ordered = rest.sort(compareNodes);
  const num: SNode[] = [];
  const den: SNode[] = [];
  const powParen = new Set<SNode>();
  for (const item of ordered) {
    if (item.k === 'pow' && negativeExponent(item.exp)) {
      if (item.exp.k === 'int' && item.exp.v === -1n) {
        if ((item.base.k === 'mul' && item.base.args.length !== 1) || item.base.k === 'pow') powParen.add(item.base);
        den.push(item.base);
      } else den.push(invertExponent(item));
    } else if (item.k === 'rat') {
      if (item.p !== 1n) num.push(int(item.p));
      den.push(int(item.q));
    } else num.push(item);
  }
  if (num.length === 0) num.push(int(1n));
  const mulPrec = prec;
  // A lone negated factor: parenthesised between Mul and Pow precedence, as Python's unary minus.
  const numStr = num.length === 1 && sign ? [parenthesize(num[0] as SNode, (PREC.Mul + PREC.Pow) / 2)] : num.map((x) => parenthesize(x, mulPrec));
  const denStr = den.map((x) => {
    const s = parenthesize(x, mulPrec);
    return powParen.has(x) ? `(${s})` : s;
  });
  if (den.length === 0) return sign + numStr.join('*');
  if (den.length === 1) return `${sign}${numStr.join('*')}/${denStr[0]}`;
  return `${sign}${numStr.join('*')}/(${denStr.join('*')})`;
}

function printPow(n: Extract<SNode, { k: 'pow' }>): string {
  const { base, exp } = n;
  if (exp.k === 'rat' && exp.q === 2n && exp.p === 1n) return `sqrt(${print(base)})`;
  if (exp.k === 'rat' && exp.q === 2n && exp.p === -1n) return `1/sqrt(${print(base)})`;
  if (exp.k === 'int' && exp.v === -1n) return `1/${parenthesize(base, PREC.Pow)}`;
  return `${parenthesize(base, PREC.Pow)}**${parenthesize(exp, PREC.Pow)}`;
}

const REL_STR: Record<string, string> = { '<': '<', '<=': '<=', '>': '>', '>=': '>=' };

// FiniteSet holds each element once and prints them sorted.
function sortSetItems(items: SNode[]): SNode[] {
  const seen = new Set<string>();
  const unique = items.filter((item) => {
    const key = print(item);
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
  return unique.sort(compareNodes);
}

// sympy's printer level: 1 for the whole answer, more inside it.
let printLevel = 0;

const nestedPrints = new WeakMap<SNode, string>();

/** sympy `str()` of the tree. */
export function print(n: SNode): string {
  printLevel++;
  try {
    // Inside an expression a node always prints the same: printed once (ordering terms prints
    // their factors again, which would be exponential in the depth).
    if (printLevel === 1) return printNode(n);
    let s = nestedPrints.get(n);
    if (s === undefined) {
      s = printNode(n);
      nestedPrints.set(n, s);
    }
    return s;
  } finally {
    printLevel--;
  }
}

function printWhole(n: SNode): string {
  const saved = printLevel;
  printLevel = 0;
  try {
    return print(n);
  } finally {
    printLevel = saved;
  }
}

/**
 * sympy's Matrix str: `Matrix([[1, 2], [3, 4]])` for a whole answer (Matrix.__str__); inside an
 * expression the printer's table, one row a line, columns right-aligned to their widest entry.
 */
function printMatrix(rows: SNode[][]): string {
  // Matrix.__str__ prints str(self.tolist()): each entry as a whole answer.
  if (printLevel <= 1) return `Matrix([${rows.map((r) => `[${r.map(printWhole).join(', ')}]`).join(', ')}])`;
  const cells = rows.map((r) => r.map(print));
  const widths: number[] = [];
  for (const r of cells) r.forEach((c, j) => (widths[j] = Math.max(widths[j] ?? 0, c.length)));
  const table = cells.map((r) => `[${r.map((c, j) => c.padStart(widths[j] ?? 0)).join(', ')}]`).join(',\n');
  return rows.length === 1 ? `Matrix([${table}])` : `Matrix([\n${table}])`;
}

function printNode(n: SNode): string {
  switch (n.k) {
    case 'int':
    case 'rat':
    case 'float':
    case 'sym':
    case 'const':
    case 'str':
      return printAtom(n, printLevel > 1);
    case 'add':
      return printAdd(n);
    case 'mul':
      return printMul(n);
    case 'pow':
      return printPow(n);
    case 'fn': {
      // Union prints as a LatticeOp: its arguments sorted by default_sort_key.
      const args = n.name === 'Union' ? [...n.args].sort(compareNodes) : n.args;
      return `${symbolName(n.name)}(${args.map(print).join(', ')})`;
    }
    case 'rel':
      if (n.op === '=') return `Eq(${print(n.lhs)}, ${print(n.rhs)})`;
      if (n.op === '!=') return `Ne(${print(n.lhs)}, ${print(n.rhs)})`;
      return `${parenthesize(n.lhs, PREC.Relational, true)} ${REL_STR[n.op]} ${parenthesize(n.rhs, PREC.Relational, true)}`;
    case 'and':
      // And's arguments print sorted; Eq and Ne are calls and need no parentheses.
      return sortOrder.ordered(n.args)
        .map((a) => (a.k === 'rel' && (a.op === '=' || a.op === '!=') ? print(a) : `(${print(a)})`))
        .join(' & ');
    case 'set':
      return n.items.length === 0 ? 'EmptySet' : `{${sortSetItems(n.items).map(print).join(', ')}}`;
    case 'tuple':
      return n.items.length === 1 ? `(${print(n.items[0] as SNode)},)` : `(${n.items.map(print).join(', ')})`;
    case 'interval': {
      // sympy's Interval is always open at an infinite end; its printer does not show that
      // openness unless the other end is open too.
      const loInf = isInfinite(n.lo);
      const hiInf = isInfinite(n.hi);
      const lopen = n.lopen || loInf;
      const ropen = n.ropen || hiInf;
      const plain = (loInf && hiInf) || (loInf && !ropen) || (hiInf && !lopen);
      const kind = plain ? '' : lopen && ropen ? '.open' : lopen ? '.Lopen' : ropen ? '.Ropen' : '';
      // Its ends are formatted with str(), as whole answers (0.500000000000000, not 0.5).
      return `Interval${kind}(${printWhole(n.lo)}, ${printWhole(n.hi)})`;
    }
    case 'matrix':
      return printMatrix(n.rows);
  }
}
