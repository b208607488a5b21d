import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { MULTILINGUAL_SPECS } from './specs/multilingual-table.ts';
import { lookupMultilingualSpec } from './specs/other-datasets.ts';
import { getTestParser, minitestParser, type TestStatus } from './test-parsers.ts';

// Logs shaped as each tool prints them (passed, failed, skipped or errored cases, and the noise
// around them), and what SWE-bench 4.1.0's own functions (swebench/harness/log_parsers/*.py,
// imports stubbed; jekyll's and immutable-js's with an instance id that picks the sub-parser)
// return for them: test-logs/multilingual/README.md.
const LOGS = join(import.meta.dirname, 'test-logs', 'multilingual');
const log = (name: string): string => readFileSync(join(LOGS, name), 'utf8');
const sweBenchParsed = JSON.parse(log('swe-bench-parsed.json')) as Record<string, Record<string, Record<string, TestStatus>>>;

describe("SWE-bench Multilingual's parsers agree with SWE-bench's on each tool's log", () => {
  const cases = Object.entries(sweBenchParsed).flatMap(([file, byParser]) => Object.entries(byParser).map(([parser, expected]) => [file, parser, expected] as const));
  it.each(cases)('%s read by %s', (file, parser, expected) => {
    expect(Object.keys(expected).length).toBeGreaterThan(0);
    expect(Object.fromEntries(getTestParser(parser)!.parse(log(file), []))).toEqual(expected);
  });

  it('every Multilingual repository and version resolves to a built-in parser', () => {
    for (const [repo, spec] of Object.entries(MULTILINGUAL_SPECS)) {
      for (const version of Object.keys(spec.versions)) {
        const parser = lookupMultilingualSpec(repo, version)!.parser;
        expect(getTestParser(parser), `${repo} ${version}: ${parser}`).toBeDefined();
      }
    }
  });

  it("jekyll's and immutable-js's parser is the one SWE-bench picks by the instance's number", () => {
    expect(lookupMultilingualSpec('jekyll/jekyll', '9141')!.parser).toBe('minitest');
    expect(lookupMultilingualSpec('jekyll/jekyll', '8771')!.parser).toBe('cucumber');
    expect(lookupMultilingualSpec('immutable-js/immutable-js', '2006')!.parser).toBe('jest');
    expect(lookupMultilingualSpec('immutable-js/immutable-js', '2005')!.parser).toBe('jest_json');
  });
});

describe('edge cases of their rules', () => {
  // Random logs over each tool's marks, spaces, "\r" and newlines, and what SWE-bench's function
  // returns for each (those on which it raises left out): test-logs/multilingual/README.md.
  const edgeCases = JSON.parse(log('swe-bench-edge-cases.json')) as Record<string, Array<[string, Record<string, TestStatus>]>>;
  it.each(Object.keys(edgeCases))('%s reads random logs as SWE-bench does', (parser) => {
    for (const [output, expected] of edgeCases[parser]!) expect(Object.fromEntries(getTestParser(parser)!.parse(output, [])), JSON.stringify(output)).toEqual(expected);
  });

  it("minitest: the last `. ` an `=` follows ends the name; the line's last ., F or E is the outcome (linear)", () => {
    const parse = (line: string) => Object.fromEntries(minitestParser.parse(line, []));
    expect(parse('A#test_a. b. = 0.01 s = .')).toEqual({ 'A#test_a. b': 'PASSED' });
    expect(parse('A#test_a. x = 1 s = . trailing E')).toEqual({ 'A#test_a': 'FAILED' });
    expect(parse('A#test_a = 0.01 s = .')).toEqual({}); // no `. ` before the `=`
    expect(parse('. = .')).toEqual({}); // the name needs a character
    expect(parse(`x${'. '.repeat(200_000)}`)).toEqual({});
  });

  it('doctest: no report, or one cut short, reads as nothing', () => {
    expect(getTestParser('doctest')!.parse('no xml here', []).size).toBe(0);
    expect(getTestParser('doctest')!.parse('<doctest><TestCase name="a"><SubCase name="b">', []).size).toBe(0);
  });

  it('vitest: a trailing number is taken as a duration, as SWE-bench reads it', () => {
    expect(Object.fromEntries(getTestParser('vitest')!.parse(' ✓ a > handles 2\n ↓ a > b [skipped]\n', []))).toEqual({ 'a > handles': 'PASSED', 'a > b': 'SKIPPED' });
  });
});

describe('on hostile output', () => {
  // Lines on which SWE-bench's own patterns (gradle's, Chart.js's, p5.js's, minitest's) backtrack
  // quadratically; read in linear time, they take ms, not minutes (past the test's time limit).
  const N = 200_000;
  const outputs = [
    `a${' '.repeat(N)}x`,
    `Chrome 1 (${') '.repeat(N / 2)}`,
    ' \n'.repeat(N / 2),
    '<a>'.repeat(N / 3),
    `${'. '.repeat(N / 2)}=`,
    `✓ a${' 1'.repeat(N / 2)}x`,
    `Starting browser\n ./node_modules/.bin/jest ${'\n '.repeat(N / 2)}`,
  ];
  it.each(Object.keys(JSON.parse(log('swe-bench-edge-cases.json')) as object).concat('doctest'))('%s', (parser) => {
    for (const output of outputs) expect(getTestParser(parser)!.parse(output, []).size).toBeLessThanOrEqual(1);
  });
});
