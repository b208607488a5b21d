// sympy's precedence (sympy/printing/precedence.py) of the tree's nodes: where the printer puts
// parentheses.

import { isNegativeNumber, type SNode } from './tree.ts';

export const PREC = { Relational: 35, Add: 40, Mul: 50, Pow: 60, Func: 70, Atom: 1000 } as const;

export function precedence(n: SNode): number {
  switch (n.k) {
    case 'int':
      return n.v < 0n ? PREC.Add : PREC.Atom;
    case 'rat':
      return n.p < 0n ? PREC.Add : PREC.Mul;
    case 'float':
      return n.v < 0 ? PREC.Add : PREC.Atom;
    case 'add':
      return PREC.Add;
    case 'mul':
      return n.args[0] && isNegativeNumber(n.args[0]) ? PREC.Add : PREC.Mul;
    case 'pow':
      return PREC.Pow;
    case 'rel':
    case 'and':
      return PREC.Relational;
    default:
      return PREC.Atom;
  }
}
