// Answer extraction: math_with_judge's last \boxed{} and Math-Verify's extraction patterns.

/** math_with_judge's `_extract_last_boxed_answer`: the last complete `\boxed{...}`, else undefined. */
export function lastBoxedAnswer(text: string): string | undefined {
  const start = text.lastIndexOf('\\boxed{');
  if (start < 0) return undefined;
  let depth = 1;
  for (let i = start + '\\boxed{'.length; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return text.slice(start + '\\boxed{'.length, i);
  }
  return undefined;
}

/** Contents of every `\boxed{...}` / `\fbox{...}` (balanced braces), in document order. */
export function boxedContents(text: string): string[] {
  // Every brace's partner in one pass (escaped \{ and \} do not count), so that many unclosed
  // \boxed{ cost no more than one.
  const partner = new Map<number, number>();
  const open: number[] = [];
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (ch === '\\') i++;
    else if (ch === '{') open.push(i);
    else if (ch === '}') {
      const start = open.pop();
      if (start !== undefined) partner.set(start, i);
    }
  }
  const found: Array<{ at: number; content: string }> = [];
  const re = /\\(?:boxed|fbox)\s*\{/g;
  let match: RegExpExecArray | null;
  while ((match = re.exec(text)) !== null) {
    const brace = match.index + match[0].length - 1;
    const end = partner.get(brace);
    if (end !== undefined) {
      found.push({ at: match.index, content: text.slice(brace + 1, end) });
      re.lastIndex = end + 1;
    }
  }
  // `\boxed 5` (no braces), as some models write it, in its place among the others.
  for (const m of text.matchAll(/\\boxed\s+([^\s${}]+)/g)) if (m[1] !== undefined) found.push({ at: m.index, content: m[1] });
  return found.sort((a, b) => a.at - b.at).map((f) => f.content);
}

// ---- Math-Verify's extraction -------------------------------------------------------------------
// Math-Verify 0.8.0 finds answers with regexes in priority groups (0: "final answer is ... I hope",
// 50: "final answer ... is" and \boxed{}, 100: "answer:", 200: "answer", 300: anywhere). Inside a
// group, matches are tried rightmost first; the first that parses wins and ends the search. The
// patterns below are its patterns, in JavaScript syntax.

/** Which extractor a pattern belongs to: plain expressions (numbers, 1/2) or LaTeX. */
export type ExtractionTarget = 'expr' | 'latex';

/** `(?i:word)` for an engine without inline flags: each letter as a two-case class. */
function ci(word: string): string {
  return word.replace(/[a-z]/gi, (ch) => `[${ch.toLowerCase()}${ch.toUpperCase()}]`);
}

// Python's `$` without MULTILINE: the end, or just before a final newline.
const END = '(?=\\n?(?![\\s\\S]))';

function exprPatterns(): Array<[string, number]> {
  const number =
    '(?<!\\d)(?:(?<integer1>-?[1-9]\\d{0,2}(?:[ ,]\\d{3})+)(?<decimal1>\\.\\d+)?|(?<integer2>-?\\d+)(?<decimal2>[.,]\\d+)|' +
    '(?<decimal3>\\.\\d+)|(?<integer3>-?\\d+))(?<percent>\\s*(?:%|[Pp]ercent|\\s*[Pp]ercentage|\\s*[Pp]ct))?';
  const ops = '\\+\\-\\*\\×\\/\\^\\(\\)\\÷';
  const chars = `[\\d\\.\\s${ops}]`;
  const expr = `(?<expr>-?\\(?-?\\d${chars}*[${ops}]${chars}+\\)?)`;
  const currency = '\\$€£¥₹₽₪₩₫฿₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₴₵₶₷₸₹₺₻₼₽₾₿';
  const prefix = '(?:^|\\s|\\=)(?:\\*\\*)?';
  const suffix = `(?:\\*\\*)?(?:\\.|,|:|\\s|\\)|\\$|${END})`;
  const exprWithAnchors = `(?:${prefix}${expr}${suffix})`;
  const numberWithAnchors = `(?:${prefix}[${currency}]?${number})`;
  const either = `(?:${exprWithAnchors}|${numberWithAnchors})`;
  const answer = ci('answer');
  return [
    [`${ci('final answer is')}\\:?\\s*${either}\\.?\\s?I hope`, 0],
    [`${ci('final answer')}.{0,100}?\\s+is\\:?${either}`, 50],
    [`${answer}:(?:.{0,100}=\\s*|.{0,50}?)${either}(?!\\s*=)`, 100],
    [`${answer}(?:.{0,100}=\\s*|.{0,50}?)${either}(?!\\s*=)`, 200],
    [exprWithAnchors, 300],
    [numberWithAnchors, 300],
  ];
}

function latexEnvPattern(prefix: string, context: 'boxed' | 'plain'): string {
  const percent = `(?<${prefix}percent>(?:\\\\?%|[Pp]ercent|[Pp]ercentage|[Pp]ct))`;
  let displayDollar = '(?:[^$]|\\$(?!\\$))';
  let displayBracket = '(?:[^\\\\]|\\\\(?!\\]))';
  let inlineDollar = '(?:\\\\[$]|[^\\n$])';
  let inlineParen = '(?:[^\\\\\\n]|\\\\(?!\\)))';
  let inlineBracket = '[^\\n\\]\\[]';
  const shape = (c: string): string => (context === 'boxed' ? `${c}*?\\\\boxed\\{${c}+?\\}${c}*?` : `${c}+?`);
  displayDollar = shape(displayDollar);
  displayBracket = shape(displayBracket);
  inlineDollar = shape(inlineDollar);
  inlineParen = shape(inlineParen);
  inlineBracket = shape(inlineBracket);
  const patterns = [
    `(?<!\\\\)\\$\\$(?<${prefix}latexDisplayDollar>${displayDollar})(?<!\\\\)\\$\\$`,
    `(?<!\\\\)\\\\\\[(?<${prefix}latexDisplayBracket>${displayBracket})(?<!\\\\)\\\\\\]`,
    `(?<!\\\\|\\d)\\$(?<${prefix}latexInlineDollar>${inlineDollar})(?<!\\\\)\\$`,
    `(?<!\\\\)\\\\\\((?<${prefix}latexInlineParenthesis>${inlineParen})(?<!\\\\)\\\\\\)`,
    `\\s\\[(?<${prefix}latexInlineBracket>${inlineBracket})\\]\\s`,
  ];
  if (context === 'plain') {
    const simple = '-?\\d+(?:[.,]\\d+)?';
    patterns.push(`(?<${prefix}latexFraction>-?\\\\frac\\{${simple}\\}\\{${simple}\\})`);
  }
  return `(?:(?:${patterns.join('|')})\\s*${percent}?)`;
}

function latexPatterns(): Array<[string, number]> {
  const next = [1, 2, 3, 4, 5].map((i) => `(?:\\s*(?:,?and|,?or|,)\\s*${latexEnvPattern(`next${i}_`, 'plain')})?`).join('');
  const envs = `(?:${latexEnvPattern('first_', 'plain')}${next})`;
  const answer = ci('answer');
  const nextBoxed = [1, 2, 3, 4, 5]
    .map((i) => `\\s*(?:\\s*(?:,?and|,?or|,)\\s*${latexEnvPattern(`next${i}_`, 'boxed')})?`)
    .join('');
  return [
    [`${ci('final answer is')}\\:?\\s*${envs}\\.?\\s?I hope`, 0],
    [`${ci('final answer')}.{0,100}?\\s+is\\:?\\s*${envs}`, 50],
    [`${answer}:.{0,50}?${envs}`, 100],
    [`${answer}.{0,50}?${envs}`, 200],
    [envs, 300],
    [`${latexEnvPattern('first_', 'boxed')}${nextBoxed}`, 50],
    ['(?<first_latexBoxed>\\\\boxed\\{.+\\})', 50],
  ];
}

interface CompiledPattern {
  re: RegExp;
  target: ExtractionTarget;
  priority: number;
}

const compiled = new Map<string, CompiledPattern[]>();

function patternsFor(targets: readonly ExtractionTarget[]): CompiledPattern[] {
  const key = targets.join(',');
  let list = compiled.get(key);
  if (!list) {
    const all = targets.flatMap((target) =>
      (target === 'expr' ? exprPatterns() : latexPatterns()).map(([source, priority]) => ({
        re: new RegExp(source, target === 'latex' ? 'gs' : 'g'),
        target,
        priority,
      })),
    );
    // A stable sort by priority, as Python's sorted().
    list = all.map((p, i) => ({ p, i })).sort((a, b) => a.p.priority - b.p.priority || a.i - b.i).map(({ p }) => p);
    compiled.set(key, list);
  }
  return list;
}

/** One regex match of an extraction pattern. */
export interface ExtractionMatch {
  target: ExtractionTarget;
  start: number;
  end: number;
  groups: Record<string, string | undefined>;
}

/**
 * The matches of Math-Verify's extraction patterns, one array per priority group (best group
 * first), each in the order Math-Verify tries them: rightmost end first, then longest.
 */
export function extractionMatchGroups(text: string, targets: readonly ExtractionTarget[]): ExtractionMatch[][] {
  const groups: ExtractionMatch[][] = [];
  const patterns = patternsFor(targets);
  let i = 0;
  while (i < patterns.length) {
    const priority = (patterns[i] as CompiledPattern).priority;
    const found: ExtractionMatch[] = [];
    for (; i < patterns.length && (patterns[i] as CompiledPattern).priority === priority; i++) {
      const { re, target } = patterns[i] as CompiledPattern;
      re.lastIndex = 0;
      for (const m of text.matchAll(re)) {
        found.push({ target, start: m.index, end: m.index + m[0].length, groups: { ...m.groups } });
      }
    }
    // sorted(key=(end, -start), reverse=True) is stable: equal keys keep their order.
    const order = found.map((m, k) => ({ m, k }));
    order.sort((a, b) => b.m.end - a.m.end || a.m.start - b.m.start || a.k - b.k);
    groups.push(order.map(({ m }) => m));
  }
  return groups;
}

/** math_with_judge's `_strip_math_delimiters`: an outer `\\( \\)`, then an outer `$ $` (once each). */
export function stripGold(expected: string): string {
  let s = expected.trim();
  if (s.startsWith('\\(') && s.endsWith('\\)')) s = s.slice(2, -2).trim();
  if (s.startsWith('$') && s.endsWith('$') && s.length > 1) s = s.slice(1, -1).trim();
  return s;
}

// ---- math_with_judge's answer candidate (what gates grading and what the judge is shown) -------

const ANSWER_LABELS = [
  'final[ \\t]+answer',
  'answer',
  'final[ \\t]+result',
  'result',
  'अंतिम[ \\t]+उत्तर',
  'उत्तर',
  'চূড়ান্ত[ \\t]+উত্তর',
  'উত্তর',
  'উত্তৰ',
  'અંતિમ[ \\t]+જવાબ',
  'જવાબ',
  'ಅಂತಿಮ[ \\t]+ಉತ್ತರ',
  'ಉತ್ತರ',
  'അന്തിമ[ \\t]+ഉത്തരം',
  'ഉത്തരം',
  'अन्तिम[ \\t]+उत्तर',
  'ଅନ୍ତିମ[ \\t]+ଉତ୍ତର',
  'ଉତ୍ତର',
  'ਅੰਤਿਮ[ \\t]+ਉੱਤਰ',
  'ਉੱਤਰ',
  'ਜਵਾਬ',
  'இறுதி[ \\t]+விடை',
  'விடை',
  'பதில்',
  'తుది[ \\t]+సమాధానం',
  'సమాధానం',
  'జవాబు',
  'حتمی[ \\t]+جواب',
  'جواب',
];
// Python's \w (str.isalnum or _), without marks.
const WORD = '[\\p{L}\\p{N}_]';
const ANSWER_LABEL_RE = new RegExp(
  `(?<!${WORD})(?:\\*\\*|__)?(?:the[ \\t]+)?(?:${ANSWER_LABELS.join('|')})(?!${WORD})` +
    '[ \\t]*(?:\\*\\*|__)?[ \\t]*(?:(?:is|है|আছে|છે|ಆಗಿದೆ|ആണ്|आहे|ਹੈ|ہے)[ \\t]*)?(?:[:：=]|-[ \\t]+)?[ \\t]*',
  'giu',
);
const OUTER_MATH_DELIMITERS: Array<[string, string]> = [
  ['\\(', '\\)'],
  ['\\[', '\\]'],
  ['$$', '$$'],
  ['$', '$'],
];

/** Python's str.splitlines(). */
function splitLines(s: string): string[] {
  const lines = s.split(/\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/);
  if (lines.at(-1) === '') lines.pop();
  return lines;
}

/** Python's str.strip() (whitespace). */
const pyStrip = (s: string): string => s.replace(/^[\s\x1c-\x1f\x85]+|[\s\x1c-\x1f\x85]+$/gu, '');

/** math_with_judge's `_clean_answer_candidate`. */
function cleanAnswerCandidate(line: string): string | undefined {
  let candidate = pyStrip(line);
  candidate = candidate.replace(/^(?:\*\*|__|`)+/, '');
  candidate = pyStrip(candidate.replace(/(?:\*\*|__|`)+$/, ''));
  candidate = candidate.replace(/^[ \t]*(?:[:：=]|-[ \t]+)[ \t]*/, '');
  candidate = pyStrip(candidate.replace(/[ \t]*(?:\*\*|__)+$/, ''));
  for (const [opening, closing] of OUTER_MATH_DELIMITERS) {
    if (candidate.startsWith(opening) && candidate.endsWith(closing) && candidate.length > opening.length + closing.length) {
      candidate = pyStrip(candidate.slice(opening.length, candidate.length - closing.length));
      break;
    }
  }
  candidate = pyStrip(candidate.replace(/[.|।۔]+$/, ''));
  return candidate || undefined;
}

/** math_with_judge's `_extract_unboxed_answer_candidate`: a marked or concise final answer. */
export function unboxedAnswerCandidate(response: string): string | undefined {
  let lastEnd = -1;
  for (const m of response.matchAll(ANSWER_LABEL_RE)) lastEnd = m.index + m[0].length;
  if (lastEnd >= 0) {
    for (const line of splitLines(response.slice(lastEnd))) {
      const candidate = cleanAnswerCandidate(line);
      if (candidate) return candidate;
    }
  }
  const nonEmpty = splitLines(response).filter((line) => pyStrip(line) !== '');
  if (nonEmpty.length === 0) return undefined;
  const candidate = cleanAnswerCandidate(nonEmpty.at(-1) as string);
  if (candidate === undefined || candidate.length > 512 || /^(?:#|- |\* )/.test(candidate)) return undefined;
  const words = candidate.split(/[\s\x1c-\x1f\x85]+/u).filter(Boolean).length;
  const hasMathSignal = /\p{Nd}|\\|[{}[\]()+\-*/^=<>]/u.test(candidate);
  const shortText = /^[\p{L}\p{N}_\s'"]+$/u.test(candidate) && words <= 8;
  return (hasMathSignal && words <= 50) || shortText ? candidate : undefined;
}

/** The value of a Unicode decimal digit (its place in its run of ten). */
function digitValue(s: string, index: number): number {
  let run = 0;
  for (let cp = (s.codePointAt(index) as number) - 1; cp >= 0 && /\p{Nd}/u.test(String.fromCodePoint(cp)); cp--) run++;
  return run % 10;
}

/** `unicodedata.decimal` on every character: Unicode decimal digits to ASCII. */
export function normalizeUnicodeDigits(response: string): string {
  if (!/[^\x00-\x7f]/.test(response)) return response;
  return response.replace(/(?![0-9])\p{Nd}/gu, (ch) => String(digitValue(ch, 0)));
}

/** math_with_judge's `_repair_final_unclosed_box`: closes one missing outer brace of the last box. */
export function repairFinalUnclosedBox(response: string): string {
  const boxedStart = response.lastIndexOf('\\boxed{');
  if (boxedStart < 0 || lastBoxedAnswer(response) !== undefined) return response;
  let stripped = response.replace(/[\s\x1c-\x1f\x85]+$/u, '');
  let suffix = '';
  for (const delimiter of ['$$', '\\]', '$', '\\)']) {
    if (stripped.endsWith(delimiter)) {
      stripped = stripped.slice(0, -delimiter.length).replace(/[\s\x1c-\x1f\x85]+$/u, '');
      suffix = delimiter;
      break;
    }
  }
  let depth = 0;
  for (let i = boxedStart; i < stripped.length; i++) {
    if (stripped[i] === '{') depth++;
    else if (stripped[i] === '}' && --depth < 0) return response;
  }
  return depth === 1 ? `${stripped}}${suffix}` : response;
}

/**
 * math_with_judge's gate before grading: the response Math-Verify is given (format-tolerant
 * repairs applied) and the answer candidate (the last `\boxed{}`, or with the option a marked or
 * concise final line); no candidate, or a blank one, means reward 0 with no extracted answer.
 */
export function answerCandidate(response: string, formatTolerant: boolean): { text: string; candidate: string | undefined } {
  const text = formatTolerant ? repairFinalUnclosedBox(normalizeUnicodeDigits(response)) : response;
  let candidate = lastBoxedAnswer(text);
  if (candidate === undefined && formatTolerant) candidate = unboxedAnswerCandidate(text);
  return { text, candidate: candidate !== undefined && pyStrip(candidate) !== '' ? candidate : undefined };
}
