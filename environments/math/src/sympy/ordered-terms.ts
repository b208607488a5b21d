// sympy's Expr.as_ordered_terms(), the order the StrPrinter prints an Add's terms in. Each term is
// split into a complex coefficient (every factor that is a number: 2, sqrt(3), pi, I)
// and a monomial over generators (the other factors, by base and integer exponent; x**(3/2) is
// (x**(1/2))**3). Terms sort by monomial, lexicographically over the generators in
// default_sort_key order, higher powers first; then real coefficients before complex ones, by
// imaginary then real part, ascending; ties keep their order.

import { cmul, type Complex, complexValue, isNumberExpr, numericValue } from './evalf.ts';
import { int, isSympyNumber, rational, type SNode } from './tree.ts';

/** sympy's decompose_power: a factor as (generator, integer exponent). */
function decomposePower(factor: SNode): [SNode, number] {
  let base: SNode = factor;
  let exp: SNode = int(1n);
  if (factor.k === 'pow') [base, exp] = [factor.base, factor.exp];
  else if (factor.k === 'fn' && factor.name === 'exp' && factor.args.length === 1) [base, exp] = [{ k: 'const', name: 'E' }, factor.args[0] as SNode];
  if (exp.k === 'int') return [base, Number(exp.v)];
  if (exp.k === 'rat') return [{ k: 'pow', base, exp: rational(1n, exp.q) }, Number(exp.p)];
  if (exp.k === 'float') return [factor, 1];
  // A symbolic exponent: its rational coefficient is the power, the rest stays in the generator.
  const [c, tail] = exp.k === 'mul' && exp.args[0] && (exp.args[0].k === 'int' || exp.args[0].k === 'rat') && exp.args.length > 1
    ? [exp.args[0], exp.args.length === 2 ? (exp.args[1] as SNode) : { k: 'mul' as const, args: exp.args.slice(1) }]
    : [undefined, exp];
  if (!c) return [factor, 1];
  const [p, q] = c.k === 'int' ? [c.v, 1n] : [c.p, c.q];
  if (p === -1n && q === 1n) return [{ k: 'pow', base, exp: tail }, -1];
  if (p === 1n && q === 1n) return [factor, 1];
  const scaled: SNode = q === 1n ? tail : { k: 'mul', args: [rational(1n, q), tail] };
  return [{ k: 'pow', base, exp: scaled }, Number(p)];
}

const isNumberOrNumberSymbol = (n: SNode): boolean => isSympyNumber(n) || (n.k === 'const' && n.text === undefined && (n.name === 'pi' || n.name === 'E'));

/**
 * sympy's `Expr.as_ordered_terms()` of an Add's terms. A generator is known by its printed name
 * (to sympy, by the expression itself) and generators sort by default_sort_key: the printer hands
 * both in, `nameOf` and `compare`.
 */
export function asOrderedTerms(nameOf: (n: SNode) => string, compare: (a: SNode, b: SNode) => number): (terms: SNode[]) => SNode[] {
  const orderedTermsCache = new WeakMap<SNode[], SNode[]>();

  return function orderedTerms(args: SNode[]): SNode[] {
    let ordered = orderedTermsCache.get(args);
    if (!ordered) {
      ordered = computeOrderedTerms(args);
      orderedTermsCache.set(args, ordered);
    }
    return ordered;
  };

  function computeOrderedTerms(args: SNode[]): SNode[] {
    // Add(Number, Mul(Number, x)) with the first positive and the second negative: 1 - 2*x.
    const byNumber = (a: SNode, b: SNode): number => Number(!isNumberOrNumberSymbol(a)) - Number(!isNumberOrNumberSymbol(b));
    const addArgs = [...args].sort(byNumber);
    const [first, second] = addArgs;
    if (addArgs.length === 2 && first && second && isNumberOrNumberSymbol(first) && second.k === 'mul') {
      const mulArgs = [...second.args].sort(byNumber);
      const c = mulArgs[0];
      if (mulArgs.length === 2 && c && isSympyNumber(c) && numericValue(first) > 0 && numericValue(c) < 0) return addArgs;
    }
    const gens = new Map<string, SNode>();
    const terms = args.map((term, index) => {
      let coeff: Complex = [1, 0];
      let factors: SNode[];
      if (isSympyNumber(term)) {
        coeff = complexValue(term) ?? [1, 0];
        factors = [];
      } else if (term.k === 'mul' && term.args[0] && isSympyNumber(term.args[0]) && term.args.length > 1) {
        coeff = complexValue(term.args[0]) ?? [1, 0];
        factors = term.args.length === 2 && term.args[1]?.k === 'mul' ? term.args[1].args : term.args.slice(1);
      } else factors = term.k === 'mul' ? term.args : [term];
      const monom = new Map<string, number>();
      for (const f of factors) {
        if (isNumberExpr(f)) {
          const v = complexValue(f);
          if (v) {
            coeff = cmul(coeff, v);
            continue;
          }
        }
        const [base, e] = decomposePower(f);
        const name = nameOf(base);
        monom.set(name, e);
        if (!gens.has(name)) gens.set(name, base);
      }
      return { term, index, coeff, monom };
    });
    const order = [...gens.entries()].sort((a, b) => compare(a[1], b[1])).map(([name]) => name);
    return terms
      .sort((a, b) => {
        for (const g of order) {
          const d = (b.monom.get(g) ?? 0) - (a.monom.get(g) ?? 0);
          if (d !== 0) return d;
        }
        const [ra, ia] = a.coeff;
        const [rb, ib] = b.coeff;
        if ((ia !== 0) !== (ib !== 0)) return ia !== 0 ? 1 : -1;
        if (ia !== ib) return ia - ib;
        if (ra !== rb && !Number.isNaN(ra - rb)) return ra < rb ? -1 : 1;
        return a.index - b.index;
      })
      .map((t) => t.term);
  }
}
