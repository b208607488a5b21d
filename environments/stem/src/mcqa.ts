import { z } from 'zod';
import { compilePythonRegex, pythonFindAll } from './python-regex.ts';
import { PY_SPACE, PY_WORD_CHARS, pyIsAlphaChar, pyLen, pySplit, pyStrip } from '@rollserve/core';

// Letter extraction as NeMo Gym's resources_servers/mcqa/app.py does it today, function by
// function. Regexes are written with Python's character sets (PY_SPACE for `\s`, `[^\n]` for `.`).

/** `options` as rows carry it: single-key objects, letter to option text (null: no such option). */
export type McqaOptions = ReadonlyArray<Readonly<Record<string, string | null>>>;

/**
 * How the answer letter is read (NeMo Gym mcqa's `grading_mode`):
 * - `strict_single_letter_boxed`: the last `\boxed{}` holds a letter (`\boxed{C}`, `\boxed{\text{C}}`,
 *   `\boxed{C: option text}`);
 * - `lenient_boxed`: that, else the one option whose text the box contains;
 * - `lenient_answer_colon`: `Answer: C` or `Answer: <exact option text>`;
 * - `lenient_answer_colon_md`: markdown-tolerant `**Answer:** C`, the last such line, lists such
 *   as `A or B` rejected, Arabic/Bengali/full-width letters read as A–D.
 */
export const GradingMode = z.enum([
  'strict_single_letter_boxed',
  'lenient_boxed',
  'lenient_answer_colon',
  'lenient_answer_colon_md',
]);

export type GradingMode = z.output<typeof GradingMode>;

export interface McqaInput {
  text: string;
  options: McqaOptions | null | undefined;
  gradingMode: GradingMode;
  outputRegex?: string | readonly string[] | undefined;
  answerPrefix?: string | null | undefined;
}

const S = PY_SPACE;
const W = `[${PY_WORD_CHARS}]`;

// A box holding just a letter ("E", "[C]", "(B)"), or a letter then a delimiter ("E: ...", "C) ...").
const BOXED_LETTER_ONLY = /^[^A-Za-z]*([A-Z])[^A-Za-z]*$/;
const BOXED_LETTER_LABEL = new RegExp(`^${S}*([A-Z])${S}*[:).\\-]`, 'u');
const ANSWER_COLON = new RegExp(`answer${S}*:${S}*([^\\n]+)`, 'iu');
const ANSWER_COLON_PAYLOAD = new RegExp(`[*_]{0,2}Answer[*_]{0,2}${S}*:[*_${S.slice(1, -1)}]{0,2}([^\\n]+)`, 'giu');
const CHOICE_LETTER = /(?<![A-Za-z])([A-Za-z])(?![A-Za-z])/g;
const LEADING_CHOICE_LETTER = /^([a-zA-Z])(?![a-zA-Z0-9])/;
const STANDALONE_CHOICE_LETTER = new RegExp(`(?<!${W})[A-Z](?!${W})`, 'gu');
const CHOICE_LIST_SEPARATOR = new RegExp(`^(?:${S}*[/|&,;]${S}*|${S}+(?:or|and)${S}+|${S}+)$`, 'iu');

const LETTER_NORMALISATION: ReadonlyArray<readonly [string, string]> = [
  ['أ', ' A'],
  ['ب', ' B'],
  ['ج', ' C'],
  ['د', ' D'],
  ['অ', ' A'],
  ['ব', ' B'],
  ['ড', ' C'],
  ['ঢ', ' D'],
  ['Ａ', ' A'],
  ['Ｂ', ' B'],
  ['Ｃ', ' C'],
  ['Ｄ', ' D'],
];

/** Letters that name an option: single-letter keys whose value is not null, upper-cased. */
export function allowedLetters(options: McqaOptions | null | undefined): Set<string> {
  const letters = new Set<string>();
  for (const entry of options ?? []) {
    for (const [key, value] of Object.entries(entry)) {
      if (pyLen(key) === 1 && pyIsAlphaChar(key) && value !== null) letters.add(key.toUpperCase());
    }
  }
  return letters;
}

/** Everything inside the last `\boxed{`, counting braces; null when absent or never closed. */
export function extractBoxedInner(text: string): string | null {
  const marker = '\\boxed{';
  const start = text.lastIndexOf(marker);
  if (start === -1) return null;
  let depth = 1;
  for (let i = start + marker.length; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (ch === 0x7b) depth++;
    else if (ch === 0x7d && --depth === 0) return text.slice(start + marker.length, i);
  }
  return null;
}

/**
 * Python's `_strip_latex_wrappers`: while the whole string is `\text{...}`, keep the inside
 * (whitespace-trimmed). Written without the regex, whose lazy full match is quadratic.
 */
export function stripLatexWrappers(s: string): string {
  while (s.length >= 7 && s.startsWith('\\text{') && s.endsWith('}')) s = pyStrip(s.slice(6, -1));
  return s;
}

export function normalizeForMatch(s: string): string {
  return pySplit(s.toLowerCase()).join(' ');
}

/** `_normalize_extracted_answer`: NFKC, then Arabic, Bengali and full-width A–D to Latin. */
export function normalizeExtractedAnswer(text: string): string {
  let out = text.normalize('NFKC');
  for (const [from, to] of LETTER_NORMALISATION) out = out.replaceAll(from, to);
  return pyStrip(out);
}

export function parseStrictBoxed(text: string, allowed: Set<string>): string | null {
  const boxed = extractBoxedInner(text);
  if (boxed === null) return null;
  const inner = stripLatexWrappers(pyStrip(boxed));
  const m = BOXED_LETTER_ONLY.exec(inner) ?? BOXED_LETTER_LABEL.exec(inner);
  const letter = m?.[1]?.toUpperCase();
  return letter !== undefined && allowed.has(letter) ? letter : null;
}

/** Option text inside the last box: the letter when exactly one option's text is contained. */
export function matchOptionText(text: string, options: McqaOptions | null | undefined, allowed: Set<string>): string | null {
  const boxed = extractBoxedInner(text);
  if (boxed === null) return null;
  const inner = pyStrip(boxed);
  const candidates = [inner, stripLatexWrappers(inner)].map(normalizeForMatch);
  const matched = new Set<string>();
  for (const entry of options ?? []) {
    for (const [key, value] of Object.entries(entry)) {
      if (value === null || pyLen(key) !== 1 || !allowed.has(key.toUpperCase())) continue;
      const option = normalizeForMatch(value);
      if (option !== '' && candidates.some((c) => c.includes(option))) matched.add(key.toUpperCase());
    }
  }
  return matched.size === 1 ? [...matched][0]! : null;
}

function parseAnswerColon(text: string, options: McqaOptions | null | undefined, allowed: Set<string>): string | null {
  const m = ANSWER_COLON.exec(text);
  if (!m) return null;
  const candidate = pyStrip(stripLatexWrappers(m[1]!));
  if (pyLen(candidate) === 1 && pyIsAlphaChar(candidate) && allowed.has(candidate.toUpperCase())) {
    return candidate.toUpperCase();
  }
  const wanted = normalizeForMatch(candidate);
  for (const entry of options ?? []) {
    for (const [key, value] of Object.entries(entry)) {
      const up = key.toUpperCase();
      if (allowed.has(up) && value !== null && normalizeForMatch(value) === wanted) return up;
    }
  }
  return null;
}

/** Distinct allowed letters written as a list ("A or B", "A/B", "A, C"). */
export function containsAmbiguousChoiceList(text: string, allowed: Set<string>): boolean {
  const found: Array<{ letter: string; start: number; end: number }> = [];
  for (const m of text.matchAll(CHOICE_LETTER)) {
    const letter = m[1]!.toUpperCase();
    if (allowed.has(letter)) found.push({ letter, start: m.index, end: m.index + 1 });
  }
  for (let i = 1; i < found.length; i++) {
    const left = found[i - 1]!;
    const right = found[i]!;
    if (left.letter !== right.letter && CHOICE_LIST_SEPARATOR.test(text.slice(left.end, right.start))) return true;
  }
  return false;
}

/** `_extract_choice_letter`: one valid letter from an `Answer:` payload. */
export function extractChoiceLetter(payload: string, allowed: Set<string>): string | null {
  const candidate = pyStrip(pyStrip(normalizeExtractedAnswer(payload)), '*_` \t\n\r.,;:');
  if (containsAmbiguousChoiceList(candidate, allowed)) return null;
  let letter: string | undefined;
  if (pyLen(candidate) === 1) letter = candidate;
  else {
    letter = LEADING_CHOICE_LETTER.exec(candidate)?.[1];
    if (letter === undefined) {
      for (const m of candidate.matchAll(STANDALONE_CHOICE_LETTER)) letter = m[0];
    }
  }
  if (!letter) return null;
  const up = letter.toUpperCase();
  return allowed.has(up) ? up : null;
}

/** Final-answer payloads after `Answer:` (markdown-tolerant) or the row's `answer_prefix`, in text order. */
export function answerPayloads(text: string, answerPrefix?: string | null): string[] {
  const normalized = text.normalize('NFKC');
  const found: Array<{ start: number; payload: string }> = [];
  for (const m of normalized.matchAll(ANSWER_COLON_PAYLOAD)) found.push({ start: m.index, payload: m[1]! });
  if (answerPrefix) {
    const prefix = new RegExp(`${escapeRegExp(answerPrefix.normalize('NFKC'))}${S}*`, 'giu');
    for (const m of normalized.matchAll(prefix)) {
      const end = m.index + m[0].length;
      const lineEnd = normalized.indexOf('\n', end);
      found.push({ start: m.index, payload: normalized.slice(end, lineEnd === -1 ? undefined : lineEnd) });
    }
  }
  found.sort((a, b) => a.start - b.start);
  return found.map((f) => f.payload);
}

function escapeRegExp(s: string): string {
  return s.replace(/[\\^$.*+?()[\]{}|/]/g, '\\$&');
}

/** `lenient_answer_colon_md`: the last `Answer:` (or row `answer_prefix`) payload that yields a letter. */
export function parseAnswerColonMarkdown(text: string, allowed: Set<string>, answerPrefix?: string | null): string | null {
  const payloads = answerPayloads(text, answerPrefix);
  for (let i = payloads.length - 1; i >= 0; i--) {
    const letter = extractChoiceLetter(payloads[i]!, allowed);
    if (letter !== null) return letter;
  }
  return null;
}

function parseWithCustomRegex(
  text: string,
  pattern: string,
  allowed: Set<string>,
  options: McqaOptions | null | undefined,
): string | null {
  const compiled = compilePythonRegex(pattern, { ignoreCase: true });
  if (compiled === null) return null; // Python: re.error, so the next pattern or the grading mode
  const matches = pythonFindAll(compiled, text);
  const last = matches.at(-1);
  // Python crashes (500) on a multi-group pattern; here such a pattern just extracts nothing.
  if (last === undefined || typeof last !== 'string') return null;
  const captured = normalizeExtractedAnswer(pyStrip(last)).toUpperCase();
  // The regex is trusted: a single letter is returned even when it is not an option.
  if (pyLen(captured) === 1 && pyIsAlphaChar(captured)) return captured;
  const wanted = normalizeForMatch(captured);
  for (const entry of options ?? []) {
    for (const [key, value] of Object.entries(entry)) {
      if (value !== null && allowed.has(key.toUpperCase()) && normalizeForMatch(value) === wanted) return key.toUpperCase();
    }
  }
  return null;
}

export function parseWithCustomRegexes(
  text: string,
  patterns: string | readonly string[],
  allowed: Set<string>,
  options: McqaOptions | null | undefined,
): string | null {
  for (const pattern of typeof patterns === 'string' ? [patterns] : patterns) {
    const letter = parseWithCustomRegex(text, pattern, allowed, options);
    if (letter !== null) return letter;
  }
  return null;
}

/**
 * The letter mcqa extracts from a (non-empty, stripped) answer text, or null. The template
 * regex, when the row has one, goes first; the grading mode is the fallback.
 */
export function extractLetter(input: McqaInput): string | null {
  const { text, options, gradingMode, outputRegex, answerPrefix } = input;
  const allowed = allowedLetters(options);
  if (outputRegex !== undefined) {
    const letter = parseWithCustomRegexes(text, outputRegex, allowed, options);
    if (letter !== null) return letter;
  }
  switch (gradingMode) {
    case 'strict_single_letter_boxed':
      return parseStrictBoxed(text, allowed);
    case 'lenient_boxed':
      return parseStrictBoxed(text, allowed) ?? matchOptionText(text, options, allowed);
    case 'lenient_answer_colon':
      return parseAnswerColon(text, options, allowed);
    case 'lenient_answer_colon_md': {
      const letter = parseAnswerColonMarkdown(text, allowed, answerPrefix);
      return letter === null && answerPrefix ? parseStrictBoxed(text, allowed) : letter;
    }
  }
}
