export { fromMathJson } from './from-mathjson.ts';
export { print } from './printer.ts';
export type { SNode } from './tree.ts';
export { isExprOfOnlySymbols, rational } from './tree.ts';
