// What the compute engine needs before it can parse what latex2sympy parses: Math-Verify's own
// normalisation (latex-normalize.ts) has run already; this only rewrites notation the engine
// reads differently (spacing commands, \text{}, \le), so that the tree built from it is the one
// latex2sympy would build.

/** Replaces `\cmd{...}` (balanced braces) by `wrap(content)`; unbalanced input is left alone. */
function replaceCommand(s: string, names: string, wrap: (content: string) => string): string {
  const re = new RegExp(`\\\\(?:${names})\\s*\\{`, 'g');
  let out = '';
  let last = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(s)) !== null) {
    const start = m.index + m[0].length;
    let depth = 1;
    let i = start;
    for (; i < s.length && depth > 0; i++) {
      if (s[i] === '\\') i++;
      else if (s[i] === '{') depth++;
      else if (s[i] === '}') depth--;
    }
    if (depth !== 0) break;
    out += s.slice(last, m.index) + wrap(s.slice(start, i - 1));
    last = i;
    re.lastIndex = i;
  }
  return out + s.slice(last);
}

/** Rewrites normalised LaTeX into the engine's dialect. */
export function prepareForEngine(input: string): string {
  let s = input.trim();
  // latex2sympy's degree postfix (^\circ, ^{\circ}, ^\degree, ^°, ...) is a no-op when Math-Verify
  // parses (convert_degrees=False): 90^\circ is 90.
  s = s.replace(/\^\s*(?:\\(?:circ|degree|circle)(?![a-zA-Z])|°|\{\s*(?:\\(?:circ|degree|circle)|°)\s*\})/g, '');
  s = s.replace(/\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits)\b/g, '');
  s = s.replace(/\\big[lr]?\b|\\Big[lr]?\b|\\bigg[lr]?\b|\\Bigg[lr]?\b/g, '');
  s = s.replace(/\\(?:,|;|:|>|quad|qquad)|(?<!\\)\\ /g, ' ').replace(/~/g, ' ');
  // latex2sympy reads \( \) as parentheses.
  s = s.replace(/(?<!\\)\\\(/g, '(').replace(/(?<!\\)\\\)/g, ')');
  s = replaceCommand(s, 'mathrm|mathbf|mathit|operatorname\\*?', (c) => ` ${c} `);
  // latex2sympy reads \text{...} (and \mbox) as one symbol: its letters without spaces or
  // parentheses, lower-cased (\text{Evelyn} is the symbol evelyn).
  s = replaceCommand(s, 'text|textbf|textit|textnormal|mbox', (c) => {
    const word = c.replace(/[\s()]/g, '');
    return /^[A-Za-z]{2,}$/.test(word) ? ` \\operatorname{${word.toLowerCase()}} ` : ` ${c} `;
  });
  // A number's subscript (a base: 204_5) is ignored by latex2sympy: the number is read as written.
  s = s.replace(/(\d)_(?:\{[^{}]*\}|[A-Za-z0-9])/g, '$1');
  s = s.replace(/\\(?:mathbb|mathcal|boldsymbol|bm)\s*\{([^{}]*)\}/g, '$1');
  // latex2sympy lexes \varnothing as one of its other symbols (a symbol named varnothing), not as
  // the empty set (\emptyset, ∅, \{\}): math_with_judge scores \varnothing against \emptyset 0.
  s = s.replace(/\\varnothing(?![a-zA-Z])/g, ' \\operatorname{varnothing} ');
  s = s.replace(/\\le(?![a-z])/g, '\\leq').replace(/\\ge(?![a-z])/g, '\\geq');
  s = s.replace(/\\leqslant\b/g, '\\leq').replace(/\\geqslant\b/g, '\\geq');
  // latex2sympy's ratio a:b is a division (the engine reads it as a loose operator).
  s = s.replace(/(?<!\\):(?!=)/g, '/');
  return s.replace(/\s+/g, ' ').trim();
}
