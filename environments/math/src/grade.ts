// Grading one answer in the calling thread, as math_with_judge grades it with Math-Verify 0.8.0:
// the gold `\boxed{<expected>}` is extracted with the LaTeX patterns, the output with the
// expression and LaTeX patterns; each gives its first parsed answer plus the first matched text;
// any gold against any prediction decides. The pool in grader.ts runs this in worker threads with a
// time limit.

import { answersEqual, getEngine } from './compare/index.ts';
import type { ExtractionMatch, ExtractionTarget } from './extract.ts';
import { extractionMatchGroups, stripGold } from './extract.ts';
import { normalizeAnswerLatex } from './latex-normalize.ts';
import { prepareForEngine } from './normalize.ts';
import type { SNode } from './sympy/index.ts';
import { fromMathJson, print, rational } from './sympy/index.ts';

/** What grading one answer gives: math_with_judge's `library_reward` and `extracted_answer`. */
export interface GradeResult {
  /** 1 when the prediction is equivalent to the expected answer, else 0. */
  reward: number;
  /** sympy `str()` of the parsed prediction; the matched text if nothing parsed; null if none. */
  extracted_answer: string | null;
}

/** Grading options. */
export interface GradeOptions {
  /**
   * Apply rollserve's corrections where Math-Verify is provably wrong (README, "Deliberate
   * differences"). Off: strict compatibility with math_with_judge. @default true
   */
  corrections?: boolean;
}

/** Answers longer than this are not parsed (parsing them is not worth the risk). */
const MAX_PARSE_LENGTH = 4_000;
/** Brace nesting deeper than this is not parsed. */
const MAX_NESTING = 100;
/** Longest output searched; longer outputs are searched in their last part only. */
const MAX_SCAN = 100_000;

function nesting(s: string): number {
  let depth = 0;
  let max = 0;
  for (const ch of s) {
    if (ch === '{' || ch === '(' || ch === '[') max = Math.max(max, ++depth);
    else if (ch === '}' || ch === ')' || ch === ']') depth--;
  }
  return max;
}

/** Parses LaTeX (already normalised) into the sympy-like tree; undefined when it does not parse. */
export function parseAnswer(latex: string): SNode | undefined {
  // latex2sympy reads 1,234 (groups of three) as one number, and 0,5 as a decimal.
  if (COMMA_NUMBER.test(latex)) {
    let digits = latex.trim();
    if (digits.includes(',') && digits.startsWith('0')) digits = digits.replace(',', '.');
    digits = digits.replace(/[, ]/g, '');
    return digits.includes('.') ? { k: 'float', v: Number(digits) } : { k: 'int', v: BigInt(digits) };
  }
  // A trailing percent sign is a factor 1/100 (the engine would evaluate it).
  const percent = /^(.*?)\s*\\?%$/s.exec(latex);
  if (percent?.[1]) {
    const node = parseAnswer(percent[1]);
    return node ? percentOf(node) : undefined;
  }
  const prepared = prepareForEngine(latex);
  if (prepared === '' || prepared.length > MAX_PARSE_LENGTH || nesting(prepared) > MAX_NESTING) return undefined;
  // latex2sympy's lexer knows ° only after ^ (the degree postfix, removed above).
  if (prepared.includes('°')) return undefined;
  // A decimal literal stays a float (the engine reads 100.0 as the integer 100).
  if (/^-?\d*\.\d+$|^-?\d+\.\d*$/.test(prepared)) {
    const v = Number(prepared);
    if (Number.isFinite(v)) return { k: 'float', v };
  }
  try {
    const expr = getEngine().parse(prepared, { form: 'raw' });
    return fromMathJson(expr.json);
  } catch {
    return undefined;
  }
}

const COMMA_NUMBER = /^\s*-?\d{1,3}(?:,\d{3})+(?:\.\d+)?\s*$/;

const EQUATION_SPLIT = /(?<![\\<!>])=/;

/** Math-Verify's fallback when a whole answer does not parse: the part after the last `=`. */
function lastEquation(latex: string): string {
  if (!latex.includes(',') && !latex.includes(';')) {
    const parts = latex.split(EQUATION_SPLIT);
    if (parts.length > 2) return parts.at(-1) as string;
  }
  return latex;
}

/** A small least-recently-used cache (parsing is a pure function of its text). */
class Lru<V> {
  readonly #map = new Map<string, V>();
  constructor(readonly size: number) {}
  get(key: string): V | undefined {
    const value = this.#map.get(key);
    if (value !== undefined) {
      this.#map.delete(key);
      this.#map.set(key, value);
    }
    return value;
  }
  set(key: string, value: V): void {
    this.#map.delete(key);
    this.#map.set(key, value);
    if (this.#map.size > this.size) this.#map.delete(this.#map.keys().next().value as string);
  }
}

// As Math-Verify's parse_latex_cached (an lru_cache): the same answer text is parsed once. Trees
// are never modified after parsing, so they can be shared.
const parsed = new Lru<SNode | null>(512);

function parseLatex(latex: string): SNode | undefined {
  const cached = parsed.get(latex);
  if (cached !== undefined) return cached ?? undefined;
  let node = parseAnswer(latex);
  if (!node) {
    const last = lastEquation(latex);
    if (last !== latex) node = parseAnswer(last);
  }
  if (latex.length <= MAX_PARSE_LENGTH) parsed.set(latex, node ?? null);
  return node;
}

const percentOf = (node: SNode): SNode => ({ k: 'mul', args: [node, rational(1n, 100n)] });

type Extracted = [node: SNode | undefined, text: string];

function extractLatex(match: ExtractionMatch): Extracted {
  const entries: Array<[value: string, name: string]> = [];
  const find = (prefix: string): void => {
    for (const [name, value] of Object.entries(match.groups)) {
      if (name.startsWith(prefix) && value) {
        entries.push([value, name]);
        return;
      }
    }
  };
  find('first_latex');
  for (let i = 1; i <= 5; i++) find(`next${i}_latex`);
  if (entries.length === 0) return [undefined, ''];
  const nodes: Array<SNode | undefined> = [];
  const texts: string[] = [];
  for (const [value, name] of entries) {
    const [prefix, group] = name.split('_') as [string, string];
    const normalized = normalizeAnswerLatex(value, group === 'latexBoxed' ? 'last' : 'all');
    texts.push(normalized);
    let node = parseLatex(normalized);
    if (node && match.groups[`${prefix}_percent`]) node = percentOf(node);
    nodes.push(node);
  }
  if (nodes.length > 1 && nodes.every((n) => n !== undefined)) {
    const items: SNode[] = [];
    const seen = new Set<string>();
    for (const node of nodes as SNode[]) {
      for (const item of node.k === 'set' ? node.items : [node]) {
        const key = print(item);
        if (!seen.has(key)) {
          seen.add(key);
          items.push(item);
        }
      }
    }
    return [{ k: 'set', items }, texts.join(' and ')];
  }
  return [nodes[0], texts[0] as string];
}

// ---- sympy's parse_expr(evaluate=False) on a plain expression such as 10/9 or 2^10 ----------

function parsePlainExpression(source: string): SNode | undefined {
  const tokens = source.match(/\d+(?:\.\d*)?|\.\d+|\*\*|[-+*/()]|\S/g) ?? [];
  let pos = 0;
  const peek = (): string | undefined => tokens[pos];
  const number = (t: string): SNode => (t.includes('.') ? { k: 'float', v: Number(t) } : { k: 'int', v: BigInt(t) });
  const atom = (): SNode => {
    const t = tokens[pos++];
    if (t === undefined) throw new Error('end');
    if (t === '(') {
      const inner = sum();
      if (tokens[pos++] !== ')') throw new Error(')');
      return inner;
    }
    if (/^[\d.]/.test(t)) return number(t);
    throw new Error(t);
  };
  const unary = (): SNode => {
    if (peek() === '-') {
      pos++;
      const x = unary();
      return x.k === 'int' ? { k: 'int', v: -x.v } : x.k === 'float' ? { k: 'float', v: -x.v } : { k: 'mul', args: [{ k: 'int', v: -1n }, x] };
    }
    if (peek() === '+') {
      pos++;
      return unary();
    }
    return power();
  };
  const power = (): SNode => {
    const base = atom();
    if (peek() === '**') {
      pos++;
      return { k: 'pow', base, exp: unary() };
    }
    return base;
  };
  const product = (): SNode => {
    let left = unary();
    while (peek() === '*' || peek() === '/') {
      const op = tokens[pos++];
      const right = unary();
      const factor: SNode = op === '*' ? right : { k: 'pow', base: right, exp: { k: 'int', v: -1n } };
      left = { k: 'mul', args: [...(left.k === 'mul' ? left.args : [left]), factor] };
    }
    return left;
  };
  const sum = (): SNode => {
    let left = product();
    while (peek() === '+' || peek() === '-') {
      const op = tokens[pos++];
      let right = product();
      if (op === '-') right = right.k === 'int' ? { k: 'int', v: -right.v } : { k: 'mul', args: [{ k: 'int', v: -1n }, right] };
      left = { k: 'add', args: [...(left.k === 'add' ? left.args : [left]), right] };
    }
    return left;
  };
  try {
    const node = sum();
    return pos === tokens.length ? node : undefined;
  } catch {
    return undefined;
  }
}

function extractExpression(match: ExtractionMatch): Extracted {
  const g = match.groups;
  let integer = g.integer1 || g.integer2 || g.integer3 || '';
  const decimal = (g.decimal1 || g.decimal2 || g.decimal3 || '').replace(',', '.');
  if (integer || decimal) {
    const negative = integer.startsWith('-');
    integer = integer.replace(/[, ]/g, '').replace(/^-?/, '').replace(/^0+/, '');
    const text = `${negative ? '-' : ''}${integer || (negative ? '' : '0')}${decimal}`;
    const numberText = negative && integer === '' && decimal === '' ? '-0' : text;
    let node: SNode = decimal ? { k: 'float', v: Number(numberText) } : { k: 'int', v: BigInt(numberText) };
    if (g.percent) node = percentOf(node);
    return [node, numberText];
  }
  const expr = g.expr ?? '';
  if (expr) {
    const node = parsePlainExpression(expr.replaceAll('\n', ' ').replaceAll('^', '**'));
    if (node) return [node, expr];
  }
  return [undefined, expr];
}

type Answer = { node: SNode } | { text: string };

/**
 * Math-Verify's parse(): the first answer that parses, searching the priority groups in order, then
 * the first matched text (its fallback).
 */
export function extractAnswers(text: string, targets: readonly ExtractionTarget[]): Answer[] {
  const scanned = text.length > MAX_SCAN ? text.slice(-MAX_SCAN) : text;
  const answers: Answer[] = [];
  const fallbacks: string[] = [];
  for (const group of extractionMatchGroups(scanned, targets)) {
    for (const match of group) {
      const [node, fallback] = match.target === 'latex' ? extractLatex(match) : extractExpression(match);
      if (fallback) fallbacks.push(fallback);
      if (node) {
        answers.push({ node });
        break;
      }
    }
    if (answers.length > 0) break;
  }
  if (fallbacks.length > 0) answers.push({ text: fallbacks[0] as string });
  return answers;
}

function answerText(answer: Answer): string {
  if ('text' in answer) return answer.text;
  try {
    return print(answer.node);
  } catch {
    return '';
  }
}

const goldCache = new Lru<Answer[]>(1024);

/** Math-Verify's verify() of one gold against one prediction. */
function sameAnswer(gold: Answer, pred: Answer, options: GradeOptions): boolean {
  if ('node' in gold && 'node' in pred) {
    try {
      return answersEqual(gold.node, pred.node, options.corrections ?? true);
    } catch {
      return false;
    }
  }
  if ('text' in gold && 'text' in pred) {
    const g = gold.text.trim();
    const p = pred.text.trim();
    return g.length > 0 && p.length > 0 && g === p;
  }
  return false;
}

/**
 * Grades a model output against the expected answer in the calling thread. Never throws: anything
 * unexpected is reward 0.
 * @example gradeAnswer('\\(\\sqrt{2}\\)', 'so \\boxed{\\sqrt{2}}') // { reward: 1, extracted_answer: 'sqrt(2)' }
 */
export function gradeAnswer(expected: string, text: string, options: GradeOptions = {}): GradeResult {
  // The same gold comes with every rollout of a task: extracted once.
  let golds = goldCache.get(expected);
  if (!golds) {
    golds = extractAnswers(`\\boxed{${stripGold(expected)}}`, ['latex']);
    if (expected.length <= MAX_PARSE_LENGTH) goldCache.set(expected, golds);
  }
  // No gold: Math-Verify raises, and math_with_judge answers 0 with no extracted answer.
  if (golds.length === 0) return { reward: 0, extracted_answer: null };
  const preds = extractAnswers(text, ['expr', 'latex']);
  if (preds.length === 0) return { reward: 0, extracted_answer: null };
  const reward = preds.some((p) => golds.some((g) => sameAnswer(g, p, options))) ? 1 : 0;
  // math_with_judge: the first prediction whose text equals a gold's text, else the first.
  const goldTexts = golds.map(answerText).map((s) => s.trim());
  const predTexts = preds.map(answerText);
  const extracted = predTexts.find((p) => p.trim() !== '' && goldTexts.includes(p.trim())) ?? (predTexts[0] as string);
  return { reward, extracted_answer: extracted };
}
