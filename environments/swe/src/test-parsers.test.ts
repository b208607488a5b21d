import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  djangoParser,
  getTestParser,
  grade,
  pytestParser,
  registerTestParser,
  statusOf,
  sympyParser,
  testCommandLine,
  unittestParser,
  type TestParser,
  type TestStatus,
} from './test-parsers.ts';

// Real logs (test-logs/README.md says how each was made) and what SWE-bench's own Python parsers
// (swebench/harness/log_parsers/python.py) make of them, computed once with those parsers.
const LOGS = join(import.meta.dirname, 'test-logs');
const log = (name: string): string => readFileSync(join(LOGS, name), 'utf8');
const sweBenchParsed = JSON.parse(log('swe-bench-parsed.json')) as Record<string, Record<string, Record<string, TestStatus>>>;

describe('parsers agree with SWE-bench on real logs', () => {
  const cases = Object.entries(sweBenchParsed).flatMap(([file, byParser]) => Object.entries(byParser).map(([parser, expected]) => [file, parser, expected] as const));
  it.each(cases)('%s read by %s', (file, parser, expected) => {
    expect(Object.fromEntries(getTestParser(parser)!.parse(log(file), []))).toEqual(expected);
  });

  it('sympy: bare test names from `bin/test -C --verbose`, failure headers as path.py:name', () => {
    const statuses = sympyParser.parse(log('sympy-bin-test-verbose.log'), []);
    expect(statuses.get('test_sqrt_rational')).toBe('PASSED');
    expect(statuses.get('test_latex_basic')).toBe('FAILED');
    expect(statuses.get('test_broken_import')).toBe('ERROR');
    // the last test of a file shares its line with the file's [FAIL]: SWE-bench does not see it either
    expect(statuses.has('test_symbol_name')).toBe(false);
    expect(statuses.get('sympy/demo/tests/test_demo.py:test_broken_import')).toBe('FAILED');
  });

  it("sympy's failure-header pattern, line by line, as Python's re finds it", () => {
    const expected = JSON.parse(log('sympy-headers.json')) as Record<string, string[]>;
    for (const [line, found] of Object.entries(expected)) {
      const keys = [...sympyParser.parse(line, []).entries()].filter(([, s]) => s === 'FAILED').map(([k]) => k);
      expect(keys, line).toEqual(found);
    }
  });

  it('django: ids exactly as the runner prints them, docstrings on their own line included', () => {
    const statuses = djangoParser.parse(log('django-runtests-v2.log'), []);
    expect(statuses.get('test_callable_storage_deconstruction (file_storage.tests.FileFieldDeconstructionTests.test_callable_storage_deconstruction)')).toBe('PASSED');
    expect(statuses.get('A callable storage is deconstructed to the callable.')).toBe('PASSED');
    expect(statuses.get('--version is equivalent to version')).toBe('PASSED');
    expect(statuses.get('test_deconstruction_fails (file_storage.tests.FileFieldDeconstructionTests.test_deconstruction_fails)')).toBe('FAILED');
    expect(statuses.get('test_errors (file_storage.tests.FileFieldDeconstructionTests.test_errors)')).toBe('ERROR');
  });

  it('django: the old `name (module.Class)` form, and a result printed after other output', () => {
    const output = [
      'test_reverse (urlpatterns.tests.SimplifiedURLTests) ... ok',
      'test_slow (admin_scripts.tests.ManageRunserver) ... Testing against Django installed in /testbed/django',
      'System check identified some issues (0 silenced).',
      'ok',
      'test_error (urlpatterns.tests.SimplifiedURLTests) ... ERROR',
    ].join('\n');
    expect(Object.fromEntries(djangoParser.parse(output, []))).toEqual({
      'test_reverse (urlpatterns.tests.SimplifiedURLTests)': 'PASSED',
      'test_slow (admin_scripts.tests.ManageRunserver)': 'PASSED',
      'test_error (urlpatterns.tests.SimplifiedURLTests)': 'ERROR',
    });
  });

  it('pytest: with the expected ids, a parametrised id keeps its spaces', () => {
    const expected = ['tests/test_core.py::test_slug[Hello World-hello-world]', 'tests/test_core.py::test_slug[a  b-a-b]'];
    const statuses = pytestParser.parse(log('pytest-rA.log'), expected);
    expect(statuses.get(expected[0]!)).toBe('PASSED');
    expect(statuses.get(expected[1]!)).toBe('PASSED');
    expect(statuses.get('tests/test_core.py::test_broken')).toBe('FAILED');
    expect([...statuses.keys()].some((k) => k.startsWith('[1]'))).toBe(false);
  });
});

describe('test targets', () => {
  it('pytest targets the files of the ids; django the modules; sympy none (its ids are bare names)', () => {
    expect(pytestParser.targets(['a/t.py::x', 'a/t.py::C::y[1 2]', 'b.py::z'])).toEqual(['a/t.py', 'b.py']);
    expect(unittestParser.targets(['test_add (calc.tests.TestCalc)', 'test_sub (calc.tests.TestCalc.test_sub)'])).toEqual(['calc.tests.TestCalc.test_add', 'calc.tests.TestCalc.test_sub']);
    expect(djangoParser.directives!(['tests/file_storage/tests.py', 'tests/migrations/test_writer.py'])).toEqual(['file_storage.tests', 'migrations.test_writer']);
    expect(sympyParser.targets(['test_latex_basic'])).toEqual([]);
  });

  it('unittest: verbose lines, Python 3.11 names folded, descriptions on their own line', () => {
    const output = [
      'test_add (calc.tests.TestCalc) ... ok',
      'test_sub (calc.tests.TestCalc.test_sub) ... FAIL',
      'test_div (calc.tests.TestCalc)',
      'Division by zero raises. ... ERROR',
      'test_skip (calc.tests.TestCalc) ... skipped "no"',
      'test_xf (calc.tests.TestCalc) ... expected failure',
    ].join('\n');
    expect(Object.fromEntries(unittestParser.parse(output, []))).toEqual({
      'test_add (calc.tests.TestCalc)': 'PASSED',
      'test_sub (calc.tests.TestCalc)': 'FAILED',
      'test_div (calc.tests.TestCalc)': 'ERROR',
      'test_skip (calc.tests.TestCalc)': 'SKIPPED',
      'test_xf (calc.tests.TestCalc)': 'XFAIL',
    });
  });
});

describe('grading and the registry', () => {
  it("grades as SWE-bench: FAIL_TO_PASS passes on PASSED/XFAIL; PASS_TO_PASS is kept when skipped too; missing counts", () => {
    const statuses = new Map<string, TestStatus>([
      ['f1', 'PASSED'],
      ['f3', 'SKIPPED'],
      ['p1', 'XFAIL'],
      ['p2', 'SKIPPED'],
      ['p3', 'FAILED'],
    ]);
    expect(grade(statuses, ['f1'], ['p1', 'p2']).resolved).toBe(true);
    expect(grade(statuses, ['f1', 'f2', 'f3'], ['p1', 'p2', 'p3'])).toEqual({
      resolved: false,
      f2pPassed: 1,
      p2pPassed: 2,
      missing: 1,
      failedTests: [
        { id: 'f2', kind: 'FAIL_TO_PASS', status: 'MISSING' },
        { id: 'f3', kind: 'FAIL_TO_PASS', status: 'SKIPPED' },
        { id: 'p3', kind: 'PASS_TO_PASS', status: 'FAILED' },
      ],
    });
  });

  it('an id SWE-bench cut inside its parameters matches the ids it begins, when they agree', () => {
    const truncated = 'astropy/units/tests/test_format.py::test_ogip_grammar_fail[log(photon';
    expect(statusOf(new Map([[`${truncated} / m**2 s)]`, 'PASSED']]), truncated)).toBe('PASSED');
    const mixed = new Map<string, TestStatus>([
      ['t.py::x[args1-None]', 'PASSED'],
      ['t.py::x[args1-No-value]', 'FAILED'],
    ]);
    expect(statusOf(mixed, 't.py::x[args1-No')).toBe('FAILED');
    expect(statusOf(new Map([['t.py::x[case-1-extended]', 'PASSED']]), 't.py::x[case-1]')).toBeUndefined(); // a whole id never prefix-matches
  });

  it('puts quoted targets in place of {tests}, else after the command; takes new parsers by name', () => {
    expect(testCommandLine('python3 -m pytest -rA {tests}', ["t/it's.py"])).toBe("python3 -m pytest -rA 't/it'\\''s.py'");
    expect(testCommandLine('./tests/runtests.py --verbosity 2', ['file_storage.tests'])).toBe("./tests/runtests.py --verbosity 2 'file_storage.tests'");
    const tap: TestParser = {
      defaultCommand: 'prove {tests}',
      targets: (ids) => [...ids],
      parse: (output) => new Map([...output.matchAll(/^(ok|not ok) \d+ - (.+)$/gm)].map((m) => [m[2]!, m[1] === 'ok' ? 'PASSED' : 'FAILED'] as const)),
    };
    registerTestParser('tap', tap);
    expect(getTestParser('tap')!.parse('ok 1 - a\nnot ok 2 - b\n', []).get('b')).toBe('FAILED');
  });
});

describe('parsers on hostile output', () => {
  // A quadratic pattern spends ~45 s on these lines (past the test's time limit); a linear one, ms.
  it('parse a long line the patched code printed, and trailing spaces', () => {
    const line = `PASSED a${' '.repeat(300_000)}b`;
    const statuses = pytestParser.parse(`${line}\nPASSED tests/test_x.py::test_ok   \n`, ['tests/test_x.py::test_ok']);
    expect(statuses.get('tests/test_x.py::test_ok')).toBe('PASSED');
    const sympyLine = `x ${'a.py:'.repeat(60_000)} ${' .py:'.repeat(60_000)}`;
    expect(sympyParser.parse(`${sympyLine}\ntest_ok ok\n`, []).get('test_ok')).toBe('PASSED');
  });
});
