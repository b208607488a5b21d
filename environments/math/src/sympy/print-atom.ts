// The StrPrinter's atoms: numbers, symbols, constants and strings. An atom prints without its
// printer (no children; the print level matters to a Float only), so the sort key, which names
// atoms by these strings, needs no printer either.

import type { Atom } from './tree.ts';

/**
 * sympy's Float str: 15 significant digits, scientific below 1e-4. Inside another expression
 * (print level > 1, full_prec 'auto') trailing zeros are stripped: 3.0, 10.5.
 */
function printFloat(v: number, strip: boolean): string {
  if (v === 0) return '0.0';
  const exp = Math.floor(Math.log10(Math.abs(v)));
  if (exp < -4) {
    const [mant, e] = v.toExponential(14).split('e') as [string, string];
    return `${strip ? mant.replace(/(\.\d*?\d)0+$/, '$1') : mant}e${Number(e)}`;
  }
  if (exp >= 15) return `${BigInt(Math.round(v))}.${strip ? '0' : ''}`;
  const fixed = v.toFixed(Math.max(0, 14 - exp));
  return strip ? fixed.replace(/(\.\d*?\d)0+$/, '$1') : fixed;
}

/** latex2sympy names an indexed symbol a_3, but a_{37} when the index is longer than one character. */
export const symbolName = (name: string): string => name.replace(/^([^_]+)_([^_{}]{2,})$/, '$1_{$2}');

/** An atom's str(); `nested` inside another expression (print level > 1), where Floats are stripped. */
export function printAtom(n: Atom, nested: boolean): string {
  switch (n.k) {
    case 'int':
      return String(n.v);
    case 'rat':
      return `${n.p}/${n.q}`;
    case 'float':
      return printFloat(n.v, nested);
    case 'sym':
      return symbolName(n.name);
    case 'const':
      return n.text ?? n.name;
    case 'str':
      return n.v;
  }
}
