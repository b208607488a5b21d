import { describe, expect, it } from 'vitest';
import { parseAnswer } from './grade.ts';
import { normalizeAnswerLatex as normalizeLatex } from './latex-normalize.ts';
import { print } from './sympy/index.ts';

// Expected strings: sympy 1.14's str() of the trees latex2sympy2_extended builds for each input
// (unevaluated Mul/Add/Pow, Rational for integer fractions, Mul(-1, ...) for minus signs,
// lowercased symbols), built by hand in Python and printed.
const SYMPY: Array<[latex: string, str: string]> = [
  ['\\frac{3\\sqrt{2}}{2}', '(3*sqrt(2))/2'],
  ['\\frac{\\sqrt{2}}{2}', 'sqrt(2)/2'],
  ['\\frac{1}{\\sqrt{2}}', '1/sqrt(2)'],
  ['\\frac{x+1}{2}', '(x + 1)/2'],
  ['\\frac{x}{2}', 'x/2'],
  ['x^2-2x+1', 'x**2 - 1*2*x + 1'],
  ['2x+3y+1', '2*x + 3*y + 1'],
  ['3-x', '3 - x'],
  ['x-3', 'x - 3'],
  ['-x', '-x'],
  ['-2x', '-1*2*x'],
  ['2\\pi', '2*pi'],
  ['\\frac{\\pi}{2}', 'pi/2'],
  ['\\frac{2\\pi}{3}', '(2*pi)/3'],
  ['1+\\sqrt{3}', '1 + sqrt(3)'],
  ['\\sqrt{3}+1', '1 + sqrt(3)'],
  ['(x-1)(x+1)', '(x - 1)*(x + 1)'],
  ['2\\sqrt{3}', '2*sqrt(3)'],
  ['\\frac{1+\\sqrt{5}}{2}', '(1 + sqrt(5))/2'],
  ['\\frac{-1+\\sqrt{5}}{2}', '(-1 + sqrt(5))/2'],
  ['10^{-10^{10}}', '10**(-1*10**10)'],
  ['x^{-1}', '1/x'],
  ['\\sqrt[3]{2}', '2**(1/3)'],
  ['3\\sqrt[3]{2}', '3*2**(1/3)'],
  ['\\log x', 'log(x, 10)'],
  ['\\ln x', 'log(x, E)'],
  ['\\log_2 8', 'log(8, 2)'],
  ['e^{x}', 'e**x'],
  ['\\frac{4}{3}\\pi r^3', '4*pi*r**3/3'],
  ['4\\pi r^2', '4*pi*r**2'],
  ['\\pi r^2', 'pi*r**2'],
  ['2^{10}', '2**10'],
  ['-\\frac{1}{2}', '-1/2'],
  ['\\frac{a}{b}', 'a/b'],
  ['\\frac{a+b}{c}', '(a + b)/c'],
  ['\\frac{1}{x^2}', '1/x**2'],
  ['\\frac{x^2}{y^3}', 'x**2/(y**3)'],
  ['\\frac{1}{2x}', '1/(2*x)'],
  ['5!', 'factorial(5)'],
  ['|x|', 'Abs(x)'],
  ['\\sin x', 'sin(x)'],
  ['x^2+y^2', 'x**2 + y**2'],
  ['a^2+b^2=c^2', 'Eq(a**2 + b**2, c**2)'],
  ['2 < x', '2 < x'],
  ['x>2', 'x > 2'],
  // Math-Verify's nits turn exactly 0.5 into \frac{1}{2}.
  ['0.5', '1/2'],
  ['0.25', '0.250000000000000'],
  ['1.25', '1.25000000000000'],
  ['100.0', '100.000000000000'],
  ['1e-7', '1.00000000000000e-7'],
  ['12345678.9', '12345678.9000000'],
  ['\\infty', 'oo'],
  ['-\\infty', '-oo'],
  ['i', 'i'],
  ['2i', '2*i'],
  ['1+i', 'i + 1'],
  ['(1,2)', 'Interval.open(1, 2)'],
  ['\\frac{\\sqrt{3}}{3}', 'sqrt(3)/3'],
  ['\\frac{5\\sqrt{3}}{2}', '(5*sqrt(3))/2'],
  ['-\\frac{\\sqrt{3}}{2}', '-1*sqrt(3)/2'],
  ['\\frac{-\\sqrt{3}}{2}', '-sqrt(3)/2'],
  ['x^{2}y', 'x**2*y'],
  ['\\frac{n(n+1)}{2}', '(n*(n + 1))/2'],
  ['2^{n+1}', '2**(n + 1)'],
  ['(1+x)^{1000000}', '(x + 1)**1000000'],
  ['x^{10^{10}}+y', 'x**(10**10) + y'],
  // default_sort_key orders factors, set elements and Union arguments: functions by their class
  // rank (sin before cos), powers of numbers by the base's str, expressions by class then args.
  ['2 \\sin b \\cos a', '2*sin(b)*cos(a)'],
  ['\\sqrt{2}\\sqrt{10}', 'sqrt(10)*sqrt(2)'],
  ['\\{10^{\\frac{\\sqrt{13}-5}{6}}, 10^{-\\frac{5+\\sqrt{13}}{6}}\\}', '{10**((-5 + sqrt(13))/6), 10**(-1*(sqrt(13) + 5)/6)}'],
  ['(-\\infty, 2] \\cup [3, \\infty)', 'Union(Interval(-oo, 2), Interval(3, oo))'],
  // And keeps its arguments by node count, then default_sort_key.
  ['f(2) < f(1) < f(4)', '(f(1) < f(4)) & (f(2) < f(1))'],
  // A letter before parentheses holding an atom or a comma list is a function call.
  ['f(y) = y', 'Eq(f(y), y)'],
  ['g(1, 2)', 'g(1, 2)'],
  ['f(x+1)', 'f*(x + 1)'],
  // An index longer than one character is braced in the symbol's name.
  ['a_{37} = 19', 'Eq(a_{37}, 19)'],
  // x = a, b, c is one equation with the list on its right.
  ['x = 1, 2, 3', 'Eq(x, {1, 2, 3})'],
  ['(x, y) = (5, 8), (8, 5)', 'Eq((x, y), {Interval.open(5, 8), (8, 5)})'],
  ['a = 1, b = 2', '{Eq(a, 1), Eq(b, 2)}'],
  ['x = 1 \\pm 2', 'Eq(x, {-2 + 1, 1 + 2})'],
  // Floats: full precision in a whole answer, an interval's ends and a matrix's entries; trailing
  // zeros stripped inside an expression.
  ['\\frac{10\\sqrt{10.5}}{27}', '(10*sqrt(10.5))/27'],
  ['(0.6, 2.6667]', 'Interval.Lopen(0.600000000000000, 2.66670000000000)'],
  ['\\begin{pmatrix}0.5 \\\\ 0.25\\end{pmatrix}', 'Matrix([[0.500000000000000], [0.250000000000000]])'],
  // A matrix inside an expression prints as sympy's table, columns right-aligned.
  ['\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix} + \\begin{pmatrix}5 & 6 \\\\ 7 & 10\\end{pmatrix}', 'Matrix([\n[1, 2],\n[3, 4]]) + Matrix([\n[5,  6],\n[7, 10]])'],
  // An interval is always open at an infinite end.
  ['(1, \\infty)', 'Interval.open(1, oo)'],
  ['[1, \\infty)', 'Interval(1, oo)'],
];

// latex2sympy's grammar has intervals, tuples and sets only as list elements, and \pm only at the
// top of a list element: these do not parse (Math-Verify then keeps the matched text).
const UNPARSED = ['-[0,1)', '2(1,3)', '\\frac{1 \\pm 2}{3}', '2x = 1 \\pm 2', 'x = \\frac{1}{2}, x = \\frac{-1 \\pm \\sqrt{13}}{4}'];

describe('sympy str() of parsed answers', () => {
  it.each(SYMPY)('%s → %s', (latex, expected) => {
    const node = parseAnswer(normalizeLatex(latex));
    expect(node).toBeDefined();
    expect(print(node!)).toBe(expected);
  });

  it('prints deeply nested sums and products (each subtree once)', () => {
    let latex = 'x';
    for (let i = 0; i < 40; i++) latex = `(${latex}+${i})(x+${i + 1})`;
    const printed = print(parseAnswer(normalizeLatex(latex))!);
    expect(printed.startsWith('(x + 40)*((x + 39)*((x + 38)*')).toBe(true);
    expect(printed).toContain('*((x + 0)*(x + 1) + 1)');
  });

  it.each(UNPARSED)('%s does not parse', (latex) => {
    expect(parseAnswer(normalizeLatex(latex))).toBeUndefined();
  });
});
