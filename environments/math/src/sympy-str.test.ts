import { describe, expect, it } from 'vitest';
import { parseAnswer } from './grade.ts';
import { normalizeAnswerLatex as normalizeLatex } from './latex-normalize.ts';
import { print } from './sympy-str.ts';

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
];

describe('sympy str() of parsed answers', () => {
  it.each(SYMPY)('%s → %s', (latex, expected) => {
    const node = parseAnswer(normalizeLatex(latex));
    expect(node).toBeDefined();
    expect(print(node!)).toBe(expected);
  });
});
