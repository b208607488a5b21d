// The LaTeX clean-up Math-Verify 0.8.0 applies to each extracted answer before parsing it
// (latex2sympy2_extended 1.10.2's normalize_latex with Math-Verify's configuration: basic LaTeX,
// units, malformed operators, nits, and \boxed{} contents). Its rules are mirrored, quirks included
// (a unit list that also strips a trailing "t" or "m"), since rewards must agree with NeMo Gym's.

/** Which \boxed{} contents to keep: all (joined by commas) or the last run of them. */
export type BoxedMode = 'all' | 'last' | 'none';

const LEFT = /\\m?left(\\\{|\{|\\\||\||\[|\(|\\rbracl|\\lgroup|\\lbrace|\\lbrack|\\vert|\\lvert|\\lceil|\\lfloor|\\vert|\\lvert|\\langle|\\llcorner|\\ulcorner)/g;
const RIGHT = /\\m?right(\\\}|\}|\\\||\||\]|\)|\\rbrack|\\rgroup|\\rbrace|\\rbrack|\\vert|\\rvert|\\rceil|\\rfloor|\\vert|\\rvert|\\rangle|\\lrcorner|\\urcorner)/g;

// latex2sympy2_extended's unit words (its list, in its order; "integer" "point" is one word there).
const UNITS = [
  'integerpoint', 'feet', 'sue', 'digit', 'pound', 'meal', 'edge', 'student', 'children ticket', 'multiple', 'east',
  'degree', 'mph', 'kmph', 'ft', 'm square', ' m east', 'sq m', 'deg', 'mile', 'q .', 'monkey', 'prime', 'ratio',
  'profit of rs', 'rd', 'o', 'gm', 'p . m', 'lb', 'tile', 'per', 'dm', 'lt', 'gain', 'ab', 'way', 'west', 'a .', 'b .',
  'c .', 'd .', 'e .', 'f .', 'g .', 'h .', 't', 'h', 'no change', 'men', 'soldier', 'pie', 'bc', 'excess', 'st',
  'inches', 'noon', 'cent', 'by', 'gal', 'kmh', 'c', 'acre', 'rise', 'a . m', 'th', 'π r 2', 'sq', 'mark', 'l', 'toy',
  'coin', 'sq . m', 'gallon', '° f', 'profit', 'minw', 'yr', 'women', 'am', 'pm', 'hr', 'cu cm', 'square', 'v â € ™',
  'are', 'rupee', 'rounds', 'cubic', 'cc', 'mtr', 's', 'ohm', 'number', 'kmph', 'day', 'hour', 'minute', 'min',
  'second', 'man', 'woman', 'sec', 'cube', 'mt', 'sq inch', 'mp', '∏ cm ³', 'hectare', 'more', 'sec', 'unit',
  'cu . m', 'cm 2', 'rs .', 'rs', 'kg', 'g', 'month', 'km', 'm', 'cm', 'mm', 'apple', 'liter', 'loss', 'yard', 'pure',
  'year', 'increase', 'decrease', 'd', 'less', 'Surface', 'litre', 'pi sq m', 's .', 'metre', 'meter', 'inch',
];
// The words are used as regex source there (so "q ." has a wildcard dot), as here.
const UNITS_RE = new RegExp(`(\\d|\\}|\\s)\\s*(?:(?:${UNITS.join('|')})(?:s|es)?)\\s*$`);
const UNIT_SUPERSCRIPT = /(\\(?:text|mbox)\{.*?\})(\^\d|\{\^\d\})?$/;

const TO_REMOVE = /\\mathrm\{th\}|\\!\s*|\\text\s*\{\s*\}|\\\$|\$|(?<!\\)["']|\\displaystyle/g;

// (name, pattern, replacement), tried as one alternation left to right, as there.
const TO_REPLACE: Array<[string, string]> = [
  ['\\\\math(?:rm|it|bf)', '\\text'],
  ['\\\\text(?:normal|bf|it|rm)', '\\text'],
  ['\\\\(?:d|t|c)frac', '\\frac'],
  ['\\s\\.', ' 0.'],
  ['\\{\\.', '{0.'],
  ['\\~\\=', '\\approx'],
  ['\\s*\\{\\s*,\\s*\\}', ','],
  ['(?<![a-zA-Z])(?:,?\\s*(?:and|or))(?![a-zA-Z])', ','],
  ['(?:,?\\s*\\\\text\\{\\s*(?:and|or)\\s*\\})', ','],
  ['(?<!\\\\)\\\\\\s', ' '],
  ['infinity', '\\infty'],
  [',?(?:\\\\ldots)', ' '],
  ['\\s*percentage', '\\%'],
  ['\\\\text\\{percentage\\}', '\\%'],
  ['\\s*percent', '\\%'],
  ['\\\\text\\{percent\\}', '\\%'],
  ['\\s*pct', '\\%'],
  ['\\\\text\\{pct\\}', '\\%'],
  ['(?:(?<!\\\\)inf(?!inity))', '\\infty'],
  [' sqrt', '\\sqrt'],
];
const TO_REPLACE_RE = new RegExp(TO_REPLACE.map(([p]) => `(${p})`).join('|'), 'g');

const COMMAND_SLASH = /\\\\(?=[a-zA-Z])/g;
const PERMUTATION = /\(([a-zA-Z0-9+\-*/\\ ]+?)\)_\{([a-zA-Z0-9+\-*/\\ ]+?)\}/g;

const MALFORMED: Array<[RegExp, string]> = [
  [/\^\s?\((.*?)\)/g, '^{$1}'],
  [/sqrt\s?\((.*?)\)/g, '\\sqrt{$1}'],
  [/\\frac\s?(\d)\s?(\d+)/g, '\\frac{$1}{$2}'],
  [/\\log_\s?(\d)\s?(\d+)/g, '\\log_{$1}{$2}'],
  [/\\frac\s?\{(.*?)\}\s?(\d)/g, '\\frac{$1}{$2}'],
  [/\\frac\s?(\d)\s?\{(.*?)\}/g, '\\frac{$1}{$2}'],
  [/\\sqrt\s?(\d)/g, '\\sqrt{$1}'],
];

const SEPARATOR = /and|or|,|;/;

/**
 * The contents of the \boxed{} / \fbox{} of a text, searched from the right. 'all' joins every
 * box with commas; 'last' keeps the last box and those before it that are close to it (under 10
 * characters apart, or under 70 with a separator between and different contents). A text without
 * a box is returned unchanged.
 */
export function extractBoxedContent(text: string, mode: 'last' | 'all'): string {
  const results: string[] = [];
  let currentPos = text.length;
  let lastBoxedStart: number | undefined;
  let maxPos = text.length;
  for (;;) {
    const b = lastBefore(text, '\\boxed', currentPos);
    const f = lastBefore(text, '\\fbox', currentPos);
    if (b < 0 && f < 0) break;
    const start = Math.max(b, f);
    let next = start + (b > f ? 6 : 5);
    while (next < maxPos && /\s/.test(text[next] as string)) next++;
    if (next >= maxPos) break;
    if (text[next] === '{') {
      let depth = 1;
      let end = -1;
      for (let i = next + 1; i < maxPos; i++) {
        if (text[i] === '{') depth++;
        else if (text[i] === '}' && --depth === 0) {
          end = i;
          break;
        }
      }
      if (end < 0) {
        if (results.length === 0) results.push(text.slice(next));
        break;
      }
      const content = text.slice(next + 1, end).trim();
      if (mode === 'last' && lastBoxedStart !== undefined) {
        const between = text.slice(end + 1, lastBoxedStart);
        const previous = results.at(-1) ?? '';
        const close = between.length < 10 || (previous !== content && between.length < 70 && SEPARATOR.test(between));
        if (!close) break;
      }
      results.push(content);
      lastBoxedStart = start;
      maxPos = start;
    } else {
      if (results.length === 0) results.push(text.slice(next));
      break;
    }
    currentPos = start;
  }
  if (results.length === 0) return text;
  return results.reverse().join(',');
}

/** Python's rfind(needle, 0, end): the last occurrence lying wholly before `end`. */
function lastBefore(text: string, needle: string, end: number): number {
  return end < needle.length ? -1 : text.lastIndexOf(needle, end - needle.length);
}

/** hendrycks' \frac12 → \frac{1}{2}. */
function fixFracs(text: string): string {
  const parts = text.split('\\frac');
  let out = parts[0] ?? '';
  for (const raw of parts.slice(1)) {
    const part = raw.replace(/^\s+/, '');
    out += '\\frac';
    if (part.startsWith('{')) out += part;
    else if (part.length < 2) return text;
    else {
      const a = part[0] as string;
      const b = part[1] as string;
      if (b !== '{') out += `{${a}}{${b}}${part.slice(2)}`;
      else out += `{${a}}${b}${part.slice(2)}`;
    }
  }
  return out;
}

/** hendrycks' 2/3 → \frac{2}{3} (the whole answer only). */
function fixSlash(text: string): string {
  const parts = text.split('/');
  if (parts.length !== 2) return text;
  const [a, b] = parts as [string, string];
  if (!/^\s*[-+]?\d+\s*$/.test(a) || !/^\s*[-+]?\d+\s*$/.test(b)) return text;
  const ai = BigInt(a.trim());
  const bi = BigInt(b.trim());
  if (text !== `${ai}/${bi}`) return text;
  return `\\frac{${ai}}{${bi}}`;
}

/** hendrycks' \sqrt3 → \sqrt{3}. */
function fixSqrt(text: string): string {
  if (!text.includes('\\sqrt')) return text;
  const parts = text.split('\\sqrt');
  let out = parts[0] ?? '';
  for (const raw of parts.slice(1)) {
    const part = raw.replace(/^\s+/, '');
    if (part.length > 0 && part[0] !== '{' && part[0] !== '[') out += `\\sqrt{${part[0]}}${part.slice(1)}`;
    else out += `\\sqrt${part}`;
  }
  return out;
}

/**
 * Math-Verify's normalisation of an extracted LaTeX answer (LatexExtractionConfig's
 * NormalizationConfig: basic_latex, units, malformed_operators, nits; boxed as given).
 * @example normalizeAnswerLatex('\\boxed{28 pct}', 'all') // '28\\%'
 */
export function normalizeAnswerLatex(input: string, boxed: BoxedMode = 'all'): string {
  let text = input;
  if (boxed !== 'none') text = extractBoxedContent(text, boxed);

  text = text.replaceAll('\\mathrm{T}', 'T');
  text = text.replaceAll('\\mathrm{d}', 'd').replaceAll('{\\rm d}', 'd');
  text = text.replaceAll('\\left[\\begin{matrix}', '\\begin{bmatrix}').replaceAll('\\end{matrix}\\right]', '\\end{bmatrix}');
  text = text.replace(LEFT, '$1').replace(RIGHT, '$1');
  text = text.replace(PERMUTATION, (_m, n: string, k: string) => `\\frac{(${n})!}{((${n})-(${k}))!}`);
  text = text.replace(TO_REMOVE, '');
  text = text.replace(TO_REPLACE_RE, (...args: unknown[]) => {
    for (let g = 0; g < TO_REPLACE.length; g++) if (args[g + 1] !== undefined) return (TO_REPLACE[g] as [string, string])[1];
    return args[0] as string;
  });
  text = text.replaceAll('\n', ' ').replaceAll('\t', ' ');
  if (!text.includes('matrix')) text = text.replace(COMMAND_SLASH, '\\');

  // Units, and a unit's superscript.
  const noSuperscript = text.replace(UNIT_SUPERSCRIPT, '').trim();
  if (noSuperscript !== '' && noSuperscript !== text) text = noSuperscript;
  for (let i = 0; i < 2; i++) {
    const stripped = text.replace(UNITS_RE, '$1');
    if (stripped !== '' && stripped !== text) text = stripped;
  }

  // Nits.
  if (text.startsWith('.')) text = `0${text}`;
  if (text === '0.5') text = '\\frac{1}{2}';

  // Malformed operators.
  for (const [re, replacement] of MALFORMED) text = text.replace(re, replacement);
  text = text.replaceAll(' sqrt', '\\sqrt');
  text = fixSqrt(text);
  text = fixFracs(text);
  text = fixSlash(text);
  return text.trim();
}
