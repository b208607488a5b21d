import { describe, expect, it } from 'vitest';
import { extractBoxedInner, extractLetter, type GradingMode, type McqaOptions } from './mcqa.ts';

// Expected letters are what NeMo Gym's Python mcqa extracts for the same input (each case was
// checked against the Python functions).

const ABCD: McqaOptions = [{ A: 'opt1' }, { B: 'opt2' }, { C: 'opt3' }, { D: 'opt4' }];
const WITH_NULL: McqaOptions = [{ A: 'apple' }, { B: 'banana split' }, { C: null }, { D: 'cherry' }];

type Case = [name: string, text: string, expected: string | null, options?: McqaOptions];

const table: Record<GradingMode, Case[]> = {
  strict_single_letter_boxed: [
    ['bare letter', 'so \\boxed{C}', 'C'],
    ['letter with brackets', 'Final: \\boxed{ [C] }', 'C'],
    ['parenthesised letter', '\\boxed{(B)}', 'B'],
    ['\\text{} unwrapped', '\\boxed{\\text{D}}', 'D'],
    ['nested \\text{} unwrapped', '\\boxed{ \\text{ \\text{A} } }', 'A'],
    ['letter then colon and option text', '\\boxed{\nC: An individual with a family history\n}', 'C'],
    ['letter then parenthesis', '\\boxed{B) opt2}', 'B'],
    ['letter then period', '\\boxed{B. opt2}', 'B'],
    ['letter then dash', '\\boxed{B - opt2}', 'B'],
    ['the last box wins', '\\boxed{A} no wait \\boxed{D}', 'D'],
    ['braces counted inside the box', '\\boxed{{B}}', 'B'],
    ['lower-case letter is not strict', '\\boxed{c}', null],
    ['letter not among the options', '\\boxed{E}', null],
    ['option whose text is null', '\\boxed{C}', null, WITH_NULL],
    ['two letters', '\\boxed{A, B}', null],
    ['a word', '\\boxed{Both}', null],
    ['option text only', '\\boxed{opt3}', null],
    ['last box unclosed: earlier box ignored', '\\boxed{B} and \\boxed{C', null],
    ['no box', 'The answer is C.', null],
    ['Answer: line is not strict', 'Answer: C', null],
  ],
  lenient_boxed: [
    ['strict form first', '\\boxed{C}', 'C'],
    ['option text inside the box', 'Final: \\boxed{ opt3 }', 'C'],
    ['option text in \\text{}', '\\boxed{\\text{OPT2}}', 'B'],
    ['whitespace collapsed and lower-cased', '\\boxed{Banana   SPLIT}', 'B', WITH_NULL],
    ['substring of a longer answer', '\\boxed{I pick cherry.}', 'D', WITH_NULL],
    ['two options contained: ambiguous', '\\boxed{apple or cherry}', null, WITH_NULL],
    ['null option never matches', '\\boxed{banana split}', 'B', [{ A: 'apple' }, { B: 'banana split' }, { C: null }]],
    ['no box', 'opt3', null],
    ['option text outside the box', 'opt3 \\boxed{unsure}', null],
  ],
  lenient_answer_colon: [
    ['letter', 'I think B.\n\nAnswer: B', 'B'],
    ['lower-case letter', 'Answer: c', 'C'],
    ['exact option text', 'Answer: opt3', 'C'],
    ['option text, case and spaces normalised', 'answer :   OPT3', 'C'],
    ['\\text{} unwrapped', 'Answer: \\text{D}', 'D'],
    ['the first Answer: is used', 'Answer: A\nAnswer: B', 'A'],
    ['markdown bold is not read', '**Answer: C**', null],
    ['trailing period is not a letter', 'Answer: C.', null],
    ['letter not an option', 'Answer: Z', null],
    ['text on the next line', 'Answer:\nB', 'B'],
  ],
  lenient_answer_colon_md: [
    ['plain', 'The answer is B.\n\nAnswer: B', 'B'],
    ['bold', 'Reasoning here.\n\n**Answer: C**', 'C'],
    ['bold label', '**Answer:** D', 'D'],
    ['underscores', '__Answer__: A', 'A'],
    ['leading letter with explanation', 'Answer: B because opt2 is right', 'B'],
    ['last standalone capital', 'Answer: the correct one is (C)', 'C'],
    ['the last Answer: wins', 'Answer: A\n...\nAnswer: D', 'D'],
    ['a later line without a letter falls back to an earlier one', 'Answer: B\nAnswer: none of these', 'B'],
    ['ambiguous "A or B"', 'Answer: A or B', null],
    ['ambiguous "A/B"', 'Answer: A/B', null],
    ['ambiguous "B, C"', 'Answer: B, C', null],
    ['ambiguous "A and C"', 'Answer: A and C', null],
    ['same letter twice is not ambiguous', 'Answer: B or B', 'B'],
    ['Arabic letter', 'Answer: ج', 'C'],
    ['Bengali letter', 'Answer: ব', 'B'],
    ['full-width letter', 'Answer: Ｄ', 'D'],
    ['full-width colon and label (NFKC)', 'ＡＮＳＷＥＲ：Ａ', 'A'],
    ['no Answer:', "I think it might be B but I'm not sure", null],
    ['letter not an option', 'Answer: E', null],
  ],
};

describe('extractLetter per grading mode (Python mcqa parity)', () => {
  for (const [mode, cases] of Object.entries(table) as Array<[GradingMode, Case[]]>) {
    describe(mode, () => {
      it.each(cases)('%s', (_name, text, expected, options = ABCD) => {
        expect(extractLetter({ text, options, gradingMode: mode })).toBe(expected);
      });
    });
  }
});

describe('letter normalisation (Arabic, Bengali, full-width to A–D)', () => {
  const letters: Array<[string, string]> = [
    ['أ', 'A'], ['ب', 'B'], ['ج', 'C'], ['د', 'D'],
    ['অ', 'A'], ['ব', 'B'], ['ড', 'C'], ['ঢ', 'D'],
    ['Ａ', 'A'], ['Ｂ', 'B'], ['Ｃ', 'C'], ['Ｄ', 'D'],
  ];
  it.each(letters)('%s is %s after Answer: (markdown mode) and in a template capture', (local, latin) => {
    expect(extractLetter({ text: `**Answer:** ${local}`, options: ABCD, gradingMode: 'lenient_answer_colon_md' })).toBe(latin);
    expect(
      extractLetter({ text: `Choice: ${local}`, options: ABCD, gradingMode: 'strict_single_letter_boxed', outputRegex: 'Choice:\\s*(\\S)' }),
    ).toBe(latin);
  });

  it('is not applied in the other modes', () => {
    expect(extractLetter({ text: 'Answer: ب', options: ABCD, gradingMode: 'lenient_answer_colon' })).toBeNull();
    expect(extractLetter({ text: '\\boxed{ب}', options: ABCD, gradingMode: 'strict_single_letter_boxed' })).toBeNull();
  });
});

describe('template_metadata.output_regex (before the grading mode)', () => {
  const cases: Array<[name: string, text: string, regex: string | string[], expected: string | null, options?: McqaOptions]> = [
    ['custom marker', 'Option Selected: B', 'Option Selected:\\s*([A-Za-z])', 'B'],
    ['case-insensitive', 'ANSWER IS b', 'answer is\\s*([A-Z])', 'B'],
    ['the last match wins', 'Maybe Answer: A? Let me reconsider. Final Answer: B', 'Answer:\\s*([A-Za-z])', 'B'],
    ['list: first pattern that extracts', 'Antwort: B', ['Answer\\s*:\\s*([A-Za-z])', 'Antwort\\s*:\\s*([A-Za-z])'], 'B'],
    ['Arabic letters normalised', 'الإجابة: ب', ['الإجابة:\\s*([أ-د])'], 'B'],
    ['a letter that is not an option is trusted', 'Selected: Z', 'Selected:\\s*([A-Za-z])', 'Z'],
    ['no options at all', 'Selected: B', 'Selected:\\s*([A-Za-z])', 'B', []],
    ['captured option text', 'Choice: opt4', 'Choice:\\s*(\\w+)', 'D'],
    ['Python-only syntax (?P<name>...) and a literal {', 'Answer: {C}', 'Answer: {(?P<l>[A-D])}', 'C'],
    ['invalid regex falls back to the grading mode', '\\boxed{B}', '([', 'B'],
    ['no match falls back to the grading mode', '\\boxed{A}', 'Final Choice:\\s*([A-Z])', 'A'],
    ['template pattern of the fixture rows', "Answer: \\boxed{{B}}", '\\\\boxed\\{\\s*([A-Za-z])\\s*\\}', 'B'],
  ];
  it.each(cases)('%s', (_name, text, outputRegex, expected, options = ABCD) => {
    expect(extractLetter({ text, options, gradingMode: 'strict_single_letter_boxed', outputRegex })).toBe(expected);
  });

  it('answer_prefix adds a marker in the markdown mode, with a boxed fallback', () => {
    const base = { options: ABCD, gradingMode: 'lenient_answer_colon_md' as const, answerPrefix: 'Final Choice:' };
    expect(extractLetter({ ...base, text: 'Final Choice: C' })).toBe('C');
    expect(extractLetter({ ...base, text: 'so \\boxed{D}' })).toBe('D');
    expect(extractLetter({ ...base, answerPrefix: undefined, text: 'so \\boxed{D}' })).toBeNull();
  });
});

describe('extractBoxedInner', () => {
  it('counts braces and takes the last box', () => {
    expect(extractBoxedInner('\\boxed{a} \\boxed{\\frac{1}{2}}')).toBe('\\frac{1}{2}');
    expect(extractBoxedInner('\\boxed{{{')).toBeNull();
    expect(extractBoxedInner('none')).toBeNull();
  });
});
