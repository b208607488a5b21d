import { shQuote } from '@rollserve/core/sandbox';

/** A test's outcome, with SWE-bench's names. */
export type TestStatus = 'PASSED' | 'FAILED' | 'ERROR' | 'SKIPPED' | 'XFAIL' | 'XPASS';

/**
 * How one test framework is run and read. The environment picks one by name (the row's
 * `test_parser`, else the config's, else SWE-bench's for the row's repository); register more
 * with `registerTestParser`.
 */
export interface TestParser {
  /** The command when neither row, config nor SWE-bench's specs give one; `{tests}` becomes the targets. */
  defaultCommand: string;
  /** What the command is given to run these test ids, when the row has no test_patch to derive them from. */
  targets(ids: readonly string[]): string[];
  /**
   * SWE-bench's test directives from the files test_patch touches (non-test files already
   * left out). Omitted: the paths as they are (pytest, sympy's bin/test).
   */
  directives?(files: readonly string[]): string[];
  /** The status of each test found in the output. `expectedIds` resolves ambiguous lines. */
  parse(output: string, expectedIds: readonly string[]): Map<string, TestStatus>;
}

const unique = (values: Iterable<string>): string[] => [...new Set(values)];
const fileTargets = (ids: readonly string[]): string[] => unique(ids.map((id) => id.split('::')[0]!).filter((file) => file !== ''));

// SWE-bench's statuses; a line is a result line when it starts with one of them.
const SWE_STATUSES = ['FAILED', 'PASSED', 'SKIPPED', 'ERROR', 'XFAIL'] as const;
const startsWithStatus = (line: string): TestStatus | undefined => SWE_STATUSES.find((s) => line.startsWith(s));

// Linear on any line (a lazy `(.+?)\s*$` is quadratic on long lines the patched code can print).
const PYTEST_LINE = /^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S.*)$/;

/**
 * pytest's `-rA` summary lines as SWE-bench's `parse_log_pytest` reads them: `PASSED <nodeid>`,
 * `FAILED <nodeid> - <message>`. Node ids may hold spaces (parametrised ids), so a line is matched
 * against the expected ids first, longest first; else its first word is the id (SWE-bench's rule).
 * `SKIPPED [N] file:line: reason` is a summary, not a test.
 */
function parsePytest(output: string, expectedIds: readonly string[], rewrite: (line: string) => string = (l) => l): Map<string, TestStatus> {
  const byLength = [...expectedIds].sort((a, b) => b.length - a.length);
  const statuses = new Map<string, TestStatus>();
  for (const raw of output.split(/\r?\n/)) {
    const match = PYTEST_LINE.exec(rewrite(raw));
    if (match === null) continue;
    const status = match[1] as TestStatus;
    const rest = match[2]!.trimEnd();
    if (status === 'SKIPPED' && /^\[\d+\]/.test(rest)) continue;
    const id = byLength.find((candidate) => rest === candidate || rest.startsWith(`${candidate} `)) ?? rest.split(/\s/)[0]!;
    statuses.set(id, status);
  }
  return statuses;
}

export const pytestParser: TestParser = {
  defaultCommand: 'python3 -m pytest -rA {tests}',
  targets: fileTargets,
  parse: (output, expectedIds) => parsePytest(output, expectedIds),
};

/**
 * SWE-bench's `parse_log_pytest_options` (requests, pylint, pydicom): as pytest, but a parameter
 * that is an absolute path keeps only its last component (`test_x[/tmp/abc/file]` → `test_x[/file]`).
 */
export const pytestOptionsParser: TestParser = {
  ...pytestParser,
  parse(output, expectedIds) {
    const statuses = new Map<string, TestStatus>();
    for (const [id, status] of parsePytest(output, expectedIds)) {
      const match = /^(.*?)\[(.*)\]$/.exec(id);
      const option = match?.[2];
      if (match !== null && option !== undefined && option.startsWith('/') && !option.startsWith('//') && !option.includes('*')) {
        statuses.set(`${match[1]}[/${option.split('/').pop()}]`, status);
      } else statuses.set(id, status);
    }
    return statuses;
  },
};

const CONTROL = /[\x01-\x1f]/g;
const words = (line: string): string[] => line.split(/\s+/).filter((w) => w !== '');

/**
 * SWE-bench's `parse_log_pytest_v2` (astropy, scikit-learn, sphinx): colours stripped, the id is
 * the rest of the line (spaces kept, runs of them as one), and the older `<nodeid> PASSED` form too.
 */
export const pytestV2Parser: TestParser = {
  ...pytestParser,
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    for (const raw of output.split('\n')) {
      let line = raw.replace(/\[(\d+)m/g, '').replace(CONTROL, '');
      const status = startsWithStatus(line);
      if (status !== undefined) {
        if (status === 'FAILED') line = line.split(' - ')[0]!;
        const parts = words(line);
        if (parts.length >= 2 && !(status === 'SKIPPED' && /^\[\d+\]$/.test(parts[1]!))) statuses.set(parts.slice(1).join(' '), parts[0] as TestStatus);
        continue;
      }
      const trailing = SWE_STATUSES.find((s) => line.endsWith(s));
      if (trailing !== undefined) {
        const parts = words(line);
        if (parts.length >= 2) statuses.set(parts.slice(0, -1).join(' '), parts.at(-1) as TestStatus);
      }
    }
    return statuses;
  },
};

/** SWE-bench's `parse_log_matplotlib`: pytest, with mouse buttons printed as their numbers. */
export const matplotlibParser: TestParser = {
  ...pytestParser,
  parse: (output, expectedIds) => parsePytest(output, expectedIds, (line) => line.replaceAll('MouseButton.LEFT', '1').replaceAll('MouseButton.RIGHT', '3')),
};

/**
 * SWE-bench's `parse_log_seaborn`: `FAILED <id>`, `PASSED <id>`, and pytest -v's
 * `<id> PASSED [ 50%]` progress lines.
 */
export const seabornParser: TestParser = {
  ...pytestParser,
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    for (const line of output.split('\n')) {
      const parts = words(line);
      if (parts.length < 2) continue;
      if (line.startsWith('FAILED')) statuses.set(parts[1]!, 'FAILED');
      else if (line.includes(' PASSED ')) {
        if (parts[1] === 'PASSED') statuses.set(parts[0]!, 'PASSED');
      } else if (line.startsWith('PASSED')) statuses.set(parts[1]!, 'PASSED');
    }
    return statuses;
  },
};

/**
 * SWE-bench's `parse_log_sympy` for `bin/test -C --verbose`: `test_name ok`, `test_name F`,
 * `test_name E` (bare names, as SWE-bench's ids are), and the `___ path.py:test_name ___` headers
 * of failure reports.
 */
/**
 * What SWE-bench's `(_*) (.*)\.py:(.*) (_*)` finds on one line, in linear time: after the first
 * space, up to the last `.py:` that a space still follows, then up to the last space.
 */
function sympyFailureHeader(line: string): string | undefined {
  const first = line.indexOf(' ');
  const last = line.lastIndexOf(' ');
  if (first < 0 || last - 4 < first + 1) return undefined;
  const py = line.lastIndexOf('.py:', last - 4);
  if (py < first + 1) return undefined;
  return `${line.slice(first + 1, py)}.py:${line.slice(py + 4, last)}`;
}

export const sympyParser: TestParser = {
  defaultCommand: 'bin/test -C --verbose {tests}',
  // sympy's ids are bare names: the files come from test_patch, not from them.
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    for (const line of output.split('\n')) {
      const header = sympyFailureHeader(line);
      if (header !== undefined) statuses.set(header, 'FAILED');
    }
    for (const raw of output.split('\n')) {
      const line = raw.trim();
      if (!line.startsWith('test_')) continue;
      const name = line.split(/\s/)[0]!;
      if (line.endsWith(' E')) statuses.set(name, 'ERROR');
      if (line.endsWith(' F')) statuses.set(name, 'FAILED');
      if (line.endsWith(' ok')) statuses.set(name, 'PASSED');
    }
    return statuses;
  },
};

const UNITTEST_RESULT: Record<string, TestStatus> = {
  ok: 'PASSED',
  FAIL: 'FAILED',
  ERROR: 'ERROR',
  'expected failure': 'XFAIL',
  'unexpected success': 'XPASS',
};

/** `name (module.Class)`; Python 3.11 prints `name (module.Class.name)`. */
function unittestId(name: string, where: string): string {
  return `${name} (${where.endsWith(`.${name}`) ? where.slice(0, -name.length - 1) : where})`;
}

const unittestTargets = (ids: readonly string[]): string[] =>
  unique(
    ids.map((id) => {
      const match = /^(\S+) \(([^)]+)\)$/.exec(id);
      if (match === null) return id;
      const where = match[2]!;
      return where.endsWith(`.${match[1]}`) ? where : `${where}.${match[1]}`;
    }),
  );

/**
 * `python -m unittest -v`: `test_x (module.Class) ... ok`, the description sometimes on the
 * next line. Ids are `test_x (module.Class)`, Python 3.11's qualified form folded into it.
 */
export const unittestParser: TestParser = {
  defaultCommand: 'python3 -m unittest -v {tests}',
  targets: unittestTargets,
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    let pending: string | undefined;
    for (const line of output.split(/\r?\n/)) {
      const head = /^(\w+) \(([\w.]+)\)/.exec(line);
      if (head !== null) pending = unittestId(head[1]!, head[2]!);
      const tail = / \.\.\. (ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)\s*$/.exec(line);
      if (tail !== null && pending !== undefined) {
        const word = tail[1]!;
        statuses.set(pending, word.startsWith('skipped') ? 'SKIPPED' : UNITTEST_RESULT[word]!);
        pending = undefined;
      }
    }
    return statuses;
  },
};

// Django's runner sometimes prints a long message between "..." and "ok" (SWE-bench's three cases).
const DJANGO_INTERRUPTED = [
  /^(.*?)\s\.\.\.\sTesting against Django installed in ([\s\S]*?) silenced\)\.\nok$/gm,
  /^(.*?)\s\.\.\.\sInternal Server Error: \/(.*)\/\nok$/gm,
  /^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$/gm,
];

/**
 * SWE-bench's `parse_log_django` for `tests/runtests.py --verbosity 2`: the id is what precedes
 * ` ... ` on the result line, exactly as printed: `test_x (module.Class)`, Python 3.11's
 * `test_x (module.Class.test_x)`, or a test's docstring when the runner prints it on its own line
 * (SWE-bench's Django ids are these). `FAIL: <id>` / `ERROR: <id>` report headers count too.
 */
export const djangoParser: TestParser = {
  defaultCommand: './tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {tests}',
  targets: unittestTargets,
  // tests/file_storage/tests.py → file_storage.tests (runtests.py takes modules under tests/)
  directives: (files) => files.map((file) => file.replace(/\.py$/, '').replace(/^tests\//, '').replaceAll('/', '.')),
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    let previous: string | undefined;
    for (const raw of output.split('\n')) {
      let line = raw.trim();
      if (line.includes('--version is equivalent to version')) statuses.set('--version is equivalent to version', 'PASSED');
      if (line.includes(' ... ')) previous = line.split(' ... ')[0]!;
      for (const suffix of [' ... ok', ' ... OK', ' ...  OK']) {
        if (!line.endsWith(suffix)) continue;
        // django__django-7188: a migration's output precedes the test's name on its line
        if (line.startsWith('Applying sites.0002_alter_domain_unique...test_no_migrations')) line = line.split('...').slice(1).join('...').trim();
        statuses.set(line.slice(0, line.length - suffix.length), 'PASSED');
        break;
      }
      if (line.includes(' ... skipped')) statuses.set(line.split(' ... skipped')[0]!, 'SKIPPED');
      if (line.endsWith(' ... FAIL')) statuses.set(line.split(' ... FAIL')[0]!, 'FAILED');
      if (line.startsWith('FAIL:')) statuses.set(words(line)[1] ?? '', 'FAILED');
      if (line.endsWith(' ... ERROR')) statuses.set(line.split(' ... ERROR')[0]!, 'ERROR');
      if (line.startsWith('ERROR:')) statuses.set(words(line)[1] ?? '', 'ERROR');
      if (line.startsWith('ok') && previous !== undefined) statuses.set(previous, 'PASSED');
    }
    for (const pattern of DJANGO_INTERRUPTED) {
      for (const match of output.matchAll(pattern)) statuses.set(match[1]!, 'PASSED');
    }
    statuses.delete('');
    return statuses;
  },
};

// The parsers of SWE-Gym, SWE-smith and SWE-bench Multilingual (their harnesses' log_parsers),
// read line by line as theirs are. Their commands come from the specs (specs/), never from targets.

/** A parser that reads lines with `read` (a [test, status] pair or nothing); later lines win. */
const byLine = (defaultCommand: string, read: (line: string) => [string, TestStatus] | undefined): TestParser => ({
  defaultCommand,
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    for (const line of output.split('\n')) {
      const found = read(line);
      if (found !== undefined) statuses.set(found[0], found[1]);
    }
    return statuses;
  },
});

/**
 * SWE-smith's `parse_log_pytest`: pytest --verbose's `<nodeid> PASSED [ 50%]` lines (the first
 * word is the id, the status the word after it).
 */
export const swesmithPytestParser: TestParser = {
  ...pytestParser,
  defaultCommand: 'pytest --disable-warnings --color=no --tb=no --verbose {tests}',
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    for (const line of output.split('\n')) {
      const match = /^(\S+)\s+(FAILED|PASSED|SKIPPED|ERROR|XFAIL)/.exec(line);
      if (match !== null) statuses.set(match[1]!, match[2] as TestStatus);
    }
    return statuses;
  },
};

/** SWE-Gym's `parse_log_pytest_pydantic`: pytest_v2, `FAILED [...]` read as FAILED. */
export const pytestPydanticParser: TestParser = {
  ...pytestV2Parser,
  parse: (output, expectedIds) => pytestV2Parser.parse(output.replace(/FAILED\s*\[.*?\]/g, 'FAILED'), expectedIds),
};

const STATUS_WORDS = { PASS: 'PASSED', FAIL: 'FAILED', SKIP: 'SKIPPED' } as const;

/** SWE-smith's tornado parser (`python -m tornado.test --verbose`). */
export const tornadoParser = byLine('python -m tornado.test --verbose', (line) => {
  if (line.endsWith('... ok')) return [line.split(' ... ')[0]!, 'PASSED'];
  if (line.includes(' ... skipped ')) return [line.split(' ... ')[0]!, 'SKIPPED'];
  if (line.startsWith('ERROR:') || line.startsWith('FAIL:')) return [line.split(/\s+/).slice(1, 3).join(' '), 'FAILED'];
  return undefined;
});

/** SWE-smith's python-slugify parser (unittest's `name ... ok`). */
export const slugifyParser = byLine('python test.py --verbose', (line) => {
  const match = /^([a-zA-Z0-9_\-,.\s()']+)\s\.{3}\s(ok|FAIL|ERROR)$/.exec(line);
  if (match === null) return undefined;
  return [match[1]!, match[2] === 'ok' ? 'PASSED' : match[2] === 'FAIL' ? 'FAILED' : 'ERROR'];
});

/** SWE-smith's paramiko parser: `-rA` lines, the first word after the status. */
export const paramikoParser: TestParser = {
  ...pytestParser,
  parse: (output) => byLine('', (line) => {
    const match = /^(FAILED|PASSED|SKIPPED|ERROR|XFAIL)\s(\S+)/.exec(line);
    return match === null ? undefined : [match[2]!, match[1] as TestStatus];
  }).parse(output, []),
};

/** SWE-smith's autograd parser: pytest-xdist's `[gw0] PASSED <id>`. */
export const autogradParser: TestParser = {
  ...pytestParser,
  parse: (output) => byLine('', (line) => {
    const match = /^\[gw\d+\]\s(FAILED|PASSED|SKIPPED|ERROR|XFAIL)\s(\S+)/.exec(line);
    return match === null ? undefined : [match[2]!, match[1] as TestStatus];
  }).parse(output, []),
};

/** SWE-smith's mypy parser: a line naming PASSED (else FAILED) is its last word's. */
export const mypyParser = byLine('pytest --color=no -rA -k', (line) => {
  const status = (['PASSED', 'FAILED'] as const).find((s) => line.includes(s));
  const words = line.split(/\s+/).filter((w) => w !== '');
  return status === undefined || words.length === 0 ? undefined : [words.at(-1)!, status];
});

/** SWE-bench's `parse_log_redis` (redis, valkey): `[ok]: name (12 ms)`. */
export const redisParser = byLine('TERM=dumb ./runtest --durable', (raw) => {
  const match = /^\[(ok|err|skip|ignore)\]:\s(.+?)(?:\s\((\d+\s*m?s)\))?$/.exec(raw.trim());
  if (match === null) return undefined;
  if (match[1] === 'ok') return [match[2]!, 'PASSED'];
  if (match[1] === 'err') return [match[2]!.replace(/\s+in\s+\S+$/, ''), 'FAILED'];
  return [match[2]!, 'SKIPPED'];
});

/** SWE-bench's `parse_log_jq`: automake's `PASS: tests/x.test`. */
export const jqParser = byLine('make check', (raw) => {
  const match = /^\s*(PASS|FAIL):\s(.+)$/.exec(raw.trim());
  return match === null ? undefined : [match[2]!, STATUS_WORDS[match[1] as 'PASS' | 'FAIL']];
});

/** SWE-bench's `parse_log_gotest`: `--- PASS: TestX (0.00s)`. */
export const gotestParser = byLine('go test -v ./...', (raw) => {
  const match = /^--- (PASS|FAIL|SKIP): (.+) \((.+)\)$/.exec(raw.trim());
  return match === null ? undefined : [match[2]!, STATUS_WORDS[match[1] as 'PASS' | 'FAIL' | 'SKIP']];
});

/** SWE-bench's `parse_log_cargo`: `test path::name ... ok`. */
export const cargoParser = byLine('cargo test', (raw) => {
  const match = /^test\s+(\S+)\s+\.\.\.\s+(\w+)$/.exec(raw.trim());
  if (match === null) return undefined;
  return match[2] === 'ok' ? [match[1]!, 'PASSED'] : match[2] === 'FAILED' ? [match[1]!, 'FAILED'] : undefined;
});

/** SWE-bench's `parse_log_googletest`: `[       OK ] Suite.Name (0 ms)`. */
export const googletestParser = byLine('ctest --output-on-failure', (raw) => {
  const match = /^.*\[\s*(OK|FAILED)\s*\]\s(.*)\s\(.*\)$/.exec(raw.trim());
  return match === null ? undefined : [match[2]!, match[1] === 'OK' ? 'PASSED' : 'FAILED'];
});

/** SWE-bench's `parse_log_jest` (jest --verbose): `✓ name (3 ms)`. */
export const jestParser = byLine('npx jest --verbose', (raw) => {
  const match = /^\s*(✓|✕|○)\s(.+?)(?:\s\((\d+\s*m?s)\))?$/.exec(raw.trim());
  if (match === null) return undefined;
  return [match[2]!, match[1] === '✓' ? 'PASSED' : match[1] === '✕' ? 'FAILED' : 'SKIPPED'];
});

/** SWE-bench's `parse_log_tap`: `ok 1 name`, `not ok 2 name`. */
export const tapParser = byLine('npm test', (raw) => {
  const match = /^(ok|not ok) (\d+) (.+)$/.exec(raw.trim());
  return match === null ? undefined : [match[3]!, match[1] === 'ok' ? 'PASSED' : 'FAILED'];
});

/**
 * SWE-bench's `parse_log_phpunit` (phpunit --testdox): `Suite (Class)` headers, then `✔ name`
 * lines, named `Suite > name`.
 */
export const phpunitParser: TestParser = {
  defaultCommand: 'vendor/bin/phpunit --testdox',
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    let suite: string | null = null;
    for (const line of output.split('\n')) {
      const header = /^(\w.+) \(.+\)$/.exec(line);
      if (header !== null) {
        suite = header[1]!;
        continue;
      }
      const test = /^\s*([✔✘↩])\s*(.*)$/.exec(line);
      if (test !== null) statuses.set(`${suite ?? 'None'} > ${test[2]}`, test[1] === '✔' ? 'PASSED' : test[1] === '✘' ? 'FAILED' : 'SKIPPED');
    }
    return statuses;
  },
};

/**
 * SWE-bench's `parse_log_maven`: each test runs alone (`mvn test -Dtest=X`, seen in the eval
 * script's `set -x` trace) and its result is the build's (`BUILD SUCCESS` / `BUILD FAILURE`).
 */
export const mavenParser: TestParser = {
  defaultCommand: 'mvn test',
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    let current = '---NO TEST NAME FOUND YET---';
    for (const raw of output.split('\n')) {
      const line = raw.trim();
      const name = /^.*-Dtest=(\S+).*$/.exec(line);
      if (name !== null) current = name[1]!;
      const result = /^.*BUILD (SUCCESS|FAILURE)$/.exec(line);
      if (result !== null) statuses.set(current, result[1] === 'SUCCESS' ? 'PASSED' : 'FAILED');
    }
    return statuses;
  },
};

// The rest of SWE-bench Multilingual's parsers (swebench/harness/log_parsers/{c,java,javascript,
// ruby}.py at 4.1.0), each to its function's rule. Lines are split on "\n" alone and `.` matches
// "\r" (the `s` flag on one line), as Python's re does; a line on which SWE-bench's own function
// would raise (a pattern it assumed matched) is skipped.

/** SWE-bench's `ansi_escape`. */
const stripAnsi = (text: string): string => text.replace(/\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])/g, '');

/** SWE-bench's `parse_log_micropython_test` (`run-tests.py`): `pass basics/fun.py`, `FAIL …`, `skip …`. */
export const micropythonParser = byLine('./run-tests.py', (raw) => {
  const match = /^(pass|FAIL|skip)\s+(.+)$/s.exec(raw.trim());
  return match === null ? undefined : [match[2]!, match[1] === 'pass' ? 'PASSED' : match[1] === 'FAIL' ? 'FAILED' : 'SKIPPED'];
});

/** SWE-bench's `parse_log_ant` (lombok's junit task): `[junit] [PASS] name`; FAIL and ERR are FAILED. */
export const antParser = byLine('ant test', (raw) => {
  const match = /^\s*\[junit\]\s+\[(PASS|FAIL|ERR)\]\s+(.*)$/s.exec(raw.trim());
  return match === null ? undefined : [match[2]!, match[1] === 'PASS' ? 'PASSED' : 'FAILED'];
});

/**
 * SWE-bench 4.1's `parse_log_gradle_custom` (lucene, rxjava, with its init script's logging):
 * `Class > method PASSED`; the name keeps all but the last space before the status, as its
 * greedy pattern does.
 */
export const gradleCustomParser = byLine('./gradlew test', (raw) => {
  // `^([^>].+)\s+(PASSED|FAILED)$` in linear time: the greedy name leaves `\s+` one character
  const line = raw.trim();
  const status = line.slice(-6);
  if (status !== 'PASSED' && status !== 'FAILED') return undefined;
  const name = line.slice(0, -7);
  return name.length >= 2 && !name.startsWith('>') && /\s/.test(line.charAt(line.length - 7)) ? [name, status] : undefined;
});

/** SWE-bench's `parse_log_ruby_unit` (test-unit's `-v`): `test_x(Suite): .`; E and F are FAILED, O (omitted) SKIPPED. */
export const rubyUnitParser = byLine('bundle exec ruby -v', (raw) => {
  const match = /^\s*(?:test: )?(.+):\s+(\.|E\b|F\b|O\b)/s.exec(raw.trim());
  if (match === null) return undefined;
  return [match[1]!, match[2] === '.' ? 'PASSED' : match[2] === 'O' ? 'SKIPPED' : 'FAILED'];
});

/**
 * SWE-bench's `parse_log_rspec_transformed_json` (fastlane, fpm, rubocop): rspec's JSON turned
 * into `description - passed` lines by the spec's jq filter; the last ` - passed|failed` ends the name.
 */
export const rspecTransformedJsonParser = byLine('bundle exec rspec --format json', (raw) => {
  const match = /^(.+) - (passed|failed)/s.exec(raw.trim());
  return match === null ? undefined : [match[1]!, match[2] === 'passed' ? 'PASSED' : 'FAILED'];
});

/**
 * SWE-bench's `parse_log_minitest` (minitest `-v`): `Suite#test_: name. = 0.01 s = .`, read as its
 * pattern `^(.+)\. .*=.*(\.|F|E).*$` reads it, in linear time: the outcome is the line's last
 * `.`, `F` or `E`; the name ends at the last `. ` that an `=` still follows before it.
 */
export const minitestParser = byLine('bundle exec ruby -I test -v', (raw) => {
  const line = raw.trim();
  const outcome = Math.max(line.lastIndexOf('.'), line.lastIndexOf('F'), line.lastIndexOf('E'));
  const equals = outcome < 0 ? -1 : line.lastIndexOf('=', outcome - 1);
  const end = equals < 2 ? -1 : line.lastIndexOf('. ', equals - 2);
  if (end < 1) return undefined;
  return [line.slice(0, end), line[outcome] === '.' ? 'PASSED' : 'FAILED'];
});

/** SWE-bench's `parse_log_cucumber` (`--format progress`): `name ....F`. */
export const cucumberParser = byLine('bundle exec cucumber --format progress', (raw) => {
  const match = /^(.*) \.+(\.|F)/s.exec(raw.trim());
  return match === null ? undefined : [match[1]!, match[2] === '.' ? 'PASSED' : 'FAILED'];
});

/** SWE-bench's `parse_log_vitest` (`--reporter=verbose`): `✓ file > suite > name 3ms`, `×`, `↓ … [skipped]`. */
export const vitestParser = byLine('npx vitest run --reporter=verbose', (raw) => {
  const match = /^\s*(✓|×|↓)\s(.+?)(?:\s(\d+\s*m?s?|\[skipped\]))?$/s.exec(raw.trim());
  if (match === null) return undefined;
  return [match[2]!, match[1] === '✓' ? 'PASSED' : match[1] === '×' ? 'FAILED' : 'SKIPPED'];
});

/** SWE-bench's `parse_log_jest_json`: jest's `--json` through the spec's jq filter, `[PASSED] suite > name`. */
export const jestJsonParser = byLine('npx jest --json', (raw) => {
  const match = /^\[(PASSED|FAILED)\]\s(.+)$/s.exec(raw.trim());
  return match === null ? undefined : [match[2]!, match[1] as TestStatus];
});

/** SWE-bench's `parse_log_marked`: only failures, mocha-style `1) name`. */
export const markedParser = byLine('npm test', (raw) => {
  const match = /^\d+\)\s(.*)/s.exec(raw);
  return match === null ? undefined : [match[1]!.trim(), 'FAILED'];
});

const REACT_PDF_PATTERNS: ReadonlyArray<[RegExp, TestStatus]> = [
  [/^PASS\s(.*)\s\([\d.]+ms\)/s, 'PASSED'],
  [/^PASS\s(.*)\s\([\d.]+\ss\)/s, 'PASSED'],
  [/^PASS\s(.*)\s\([\d.]+s\)/s, 'PASSED'],
  [/^PASS\s(.*)/s, 'PASSED'],
  [/^FAIL\s(.*)\s\([\d.]+ms\)/s, 'FAILED'],
  [/^FAIL\s(.*)\s\([\d.]+\ss\)/s, 'FAILED'],
  [/^FAIL\s(.*)\s\([\d.]+s\)/s, 'FAILED'],
  [/^FAIL\s(.*)/s, 'FAILED'],
];

/** SWE-bench's `parse_log_react_pdf`: jest's per-file `PASS path (1.2 s)` / `FAIL path` lines. */
export const reactPdfParser = byLine('yarn test', (line) => {
  for (const [pattern, status] of REACT_PDF_PATTERNS) {
    const match = pattern.exec(line);
    if (match !== null) return [match[1]!, status];
  }
  return undefined;
});

/**
 * SWE-bench's `parse_log_chart_js` (karma in Chrome): only failures, `Chrome 120.0.0.0 (Linux
 * x86_64) suite name FAILED` at a line's end, colours stripped.
 */
export const chartJsParser: TestParser = {
  defaultCommand: 'karma start --single-run',
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    // A match ends a line that ends in FAILED and starts on it, or at a `Chrome` ending the line
    // before (`\s` takes the newline): only those lines are searched, so a long line is linear.
    const lines = stripAnsi(output).split('\n');
    for (const [i, line] of lines.entries()) {
      if (!line.endsWith('FAILED')) continue;
      const before = i > 0 && lines[i - 1]!.endsWith('Chrome') ? `${lines[i - 1]}\n` : '';
      const match = /Chrome\s[\d.]+[^\S\r\n]\([^\n]+?\)[^\S\r\n]([^\n]*)FAILED$/.exec(before + line);
      if (match !== null) statuses.set(match[1]!, 'FAILED');
    }
    return statuses;
  },
};

/**
 * SWE-bench's `parse_log_karma` (preact): after `Starting browser`, until `SUMMARY:`, indented
 * suite lines nest (one level in, one out) and `✔ name` / `✖ name` are `suite > name`.
 */
export const karmaParser: TestParser = {
  defaultCommand: 'npx karma start karma.conf.js --single-run',
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    let indentation = -1;
    const suite: string[] = [];
    let started = false;
    for (const line of output.split('\n')) {
      if (line.startsWith('SUMMARY:')) break;
      if (line.includes('Starting browser')) {
        started = true;
        continue;
      }
      if (!started) continue;
      const match = /^(\s*)?([✔✖])?\s(.*)$/s.exec(line);
      if (match === null) continue;
      const [, indent, status, name] = match;
      if (indent && status === undefined) {
        if (indent.length > indentation) {
          indentation = indent.length;
          suite.push(name!);
        } else if (indent.length < indentation) {
          indentation = indent.length;
          suite.pop();
          continue;
        }
      }
      if (status !== undefined) statuses.set([...suite, name!].join(' > '), status === '✔' ? 'PASSED' : 'FAILED');
    }
    return statuses;
  },
};

/**
 * SWE-bench's `parse_log_calypso` (jest --verbose after ` ./node_modules/.bin/jest `): indented
 * lines are suites (a shallower one closes the deeper), `✓ name (12ms)` / `✕ name` are
 * `suite - … - name`; `Test Suites` or a `  ● ` failure report ends a run.
 */
export const calypsoParser: TestParser = {
  defaultCommand: 'npm run test-client',
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    const suite: Array<[string, number]> = [];
    const name = (rest: string): string => [suite.map(([s]) => s).join(' - '), rest].join(' - ').trim();
    for (const run of output.split(' ./node_modules/.bin/jest ').slice(1)) {
      for (const line of run.split('\n')) {
        if (line.startsWith('Test Suites') || line.startsWith('  ● ')) break;
        const trimmed = line.trim();
        const mark = trimmed.startsWith('✓') ? '✓' : trimmed.startsWith('✕') ? '✕' : undefined;
        if (mark !== undefined) {
          const timed = /\(\d+ms\)/.test(line);
          const match = (timed ? new RegExp(`^\\s+${mark}\\s(.*)\\(\\d+ms\\)$`, 's') : new RegExp(`^\\s+${mark}\\s(.*)`, 's')).exec(line);
          if (match !== null) statuses.set(name(match[1]!), mark === '✓' ? 'PASSED' : 'FAILED');
          continue;
        }
        const indent = line.length - line.trimStart().length;
        if (indent > 0) {
          while (suite.length > 0 && suite.at(-1)![1] >= indent) suite.pop();
          suite.push([trimmed, indent]);
        }
      }
    }
    return statuses;
  },
};

/** p5.js's log without JSON blocks (a line ending `{` or `[` to its closing line) and one-line JSON. */
function withoutJsonBlocks(log: string): string {
  const kept: string[] = [];
  let inObject = false;
  let inList = false;
  for (const line of log.split('\n')) {
    const end = line.trimEnd();
    if (end.endsWith('{')) {
      inObject = true;
      continue;
    }
    if (end.endsWith('[')) {
      inList = true;
      continue;
    }
    if (end === '}' && inObject) {
      inObject = false;
      continue;
    }
    if (end === ']' && inList) {
      inList = false;
      continue;
    }
    if (inObject || inList) continue;
    if ((end.startsWith('{') && end.endsWith('}')) || (end.startsWith('[') && end.endsWith(']'))) continue;
    kept.push(line);
  }
  return kept.join('\n');
}

/**
 * p5.js's log with each `<tag>…</tag>` block cut, leaving the extra opening tags it held: SWE-bench's
 * search for `<(\w+)>[\s\S]*?</\1>` from the start, again after each cut. A tag found with no
 * closing tag after it never gets one (cuts only remove text), so it is not searched again.
 */
function withoutXmlBlocks(log: string): string {
  let text = log;
  const unclosed = new Set<string>();
  const opening = /<([\p{L}\p{N}_]+)>/gu;
  for (let match = opening.exec(text); match !== null; match = opening.exec(text)) {
    const name = match[1]!;
    if (unclosed.has(name)) continue;
    const close = text.indexOf(`</${name}>`, opening.lastIndex);
    if (close < 0) {
      unclosed.add(name);
      continue;
    }
    const end = close + name.length + 3;
    const open = `<${name}>`;
    const extra = Math.max(text.slice(match.index, end).split(open).length - 2, 0);
    text = text.slice(0, match.index) + open.repeat(extra) + text.slice(end);
    opening.lastIndex = match.index;
  }
  return text;
}

/**
 * What `^\s*(\d+)\)(.{0,1000}?):` (MULTILINE, DOTALL) finds, each match's second group, in linear
 * time: a line start, its whitespace run (blank lines too), `N)`, then up to the first `:` within
 * 1,000 characters. Every line start inside one whitespace run fails or matches alike.
 */
function* p5jsFailures(log: string): Generator<string> {
  const space = /\s*/y;
  const number = /\d+\)/y;
  let at = 0;
  while (at <= log.length) {
    const start = at === 0 || log[at - 1] === '\n' ? at : log.indexOf('\n', at) + 1;
    if (start === 0 && at > 0) return;
    space.lastIndex = start;
    space.exec(log);
    number.lastIndex = space.lastIndex;
    const found = number.exec(log);
    if (found !== null) {
      const colon = log.indexOf(':', number.lastIndex);
      if (colon >= 0 && colon - number.lastIndex <= 1000) {
        yield log.slice(number.lastIndex, colon);
        at = colon + 1;
        continue;
      }
    }
    at = space.lastIndex + 1;
  }
}

/**
 * SWE-bench's `parse_log_p5js` (mocha in a browser, through grunt): only failures, `  1) suite`
 * then deeper-indented lines up to a `:`, named `suite:test`; JSON and XML blocks the tests print
 * are cut first.
 */
export const p5jsParser: TestParser = {
  defaultCommand: 'npm test',
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    const log = withoutXmlBlocks(withoutJsonBlocks(stripAnsi(output)));
    for (const failure of p5jsFailures(log)) {
      const lines = failure.split('\n');
      let last = 0;
      const valid = lines.every((line) => {
        const indent = line.length - line.trimStart().length;
        const deeper = indent > last;
        last = indent;
        return deeper;
      });
      if (valid) statuses.set(lines.map((line) => line.trim()).join(':'), 'FAILED');
    }
    return statuses;
  },
};

const XML_ENTITIES: Record<string, string> = { lt: '<', gt: '>', amp: '&', quot: '"', apos: "'" };
const xmlText = (text: string): string =>
  text.replace(/&(#x[0-9a-fA-F]+|#\d+|\w+);/g, (entity, body: string) =>
    body.startsWith('#x') ? String.fromCodePoint(Number.parseInt(body.slice(2), 16)) : body.startsWith('#') ? String.fromCodePoint(Number(body.slice(1))) : (XML_ENTITIES[body] ?? entity),
  );

interface XmlElement {
  tag: string;
  attributes: Map<string, string>;
  children: XmlElement[];
}

/** The elements of doctest's XML report (tags and attributes only: its text is not read). */
function xmlElements(xml: string): XmlElement {
  const root: XmlElement = { tag: '', attributes: new Map(), children: [] };
  const open = [root];
  const tags = /<!--[\s\S]*?-->|<!\[CDATA\[[\s\S]*?\]\]>|<[?!][^>]*>|<(\/?)([^\s/>]+)((?:[^>"']|"[^"]*"|'[^']*')*?)(\/?)>/g;
  for (const [, closing, tag, rest, selfClosing] of xml.matchAll(tags)) {
    if (tag === undefined) continue;
    if (closing === '/') {
      if (open.length > 1) open.pop();
      continue;
    }
    const attributes = new Map([...rest!.matchAll(/([^\s=]+)\s*=\s*(?:"([^"]*)"|'([^']*)')/g)].map((m) => [m[1]!, xmlText(m[2] ?? m[3]!)] as const));
    const element: XmlElement = { tag, attributes, children: [] };
    open.at(-1)!.children.push(element);
    if (selfClosing !== '/') open.push(element);
  }
  return root;
}

const descendants = function* (element: XmlElement, tag: string): Generator<XmlElement> {
  for (const child of element.children) {
    if (child.tag === tag) yield child;
    yield* descendants(child, tag);
  }
};

/**
 * SWE-bench's `parse_log_doctest` (nlohmann/json, a doctest binary run with `-s -r=xml`): the
 * `<doctest>` report's every SubCase under each TestCase, `case > subcase`, PASSED when every
 * Expression under it has success="true".
 */
export const doctestParser: TestParser = {
  defaultCommand: './test -s -r=xml',
  targets: () => [],
  parse(output) {
    const statuses = new Map<string, TestStatus>();
    const start = output.indexOf('<doctest');
    const end = start < 0 ? -1 : output.indexOf('</doctest>', start);
    if (end < 0) return statuses;
    const root = xmlElements(output.slice(start, end + '</doctest>'.length));
    for (const testCase of descendants(root, 'TestCase')) {
      for (const subCase of descendants(testCase, 'SubCase')) {
        const ok = [...descendants(subCase, 'Expression')].every((expression) => expression.attributes.get('success') === 'true');
        statuses.set(`${testCase.attributes.get('name') ?? 'None'} > ${subCase.attributes.get('name') ?? 'None'}`, ok ? 'PASSED' : 'FAILED');
      }
    }
    return statuses;
  },
};

const parsers = new Map<string, TestParser>([
  ['pytest', pytestParser],
  ['pytest_options', pytestOptionsParser],
  ['pytest_v2', pytestV2Parser],
  ['django', djangoParser],
  ['sympy', sympyParser],
  ['seaborn', seabornParser],
  ['matplotlib', matplotlibParser],
  ['unittest', unittestParser],
  // SWE-bench's per-repository names for the same parsers
  ...(['astropy', 'scikit', 'sphinx'] as const).map((name): [string, TestParser] => [name, pytestV2Parser]),
  ...(['requests', 'pylint', 'pydicom'] as const).map((name): [string, TestParser] => [name, pytestOptionsParser]),
  ...(['flask', 'marshmallow', 'xarray', 'pvlib', 'pyvista', 'sqlfluff', 'astroid'] as const).map((name): [string, TestParser] => [name, pytestParser]),
  // SWE-Gym's and SWE-smith's
  ['pytest_pydantic', pytestPydanticParser],
  ['swesmith_pytest', swesmithPytestParser],
  ['tornado', tornadoParser],
  ['python_slugify', slugifyParser],
  ['paramiko', paramikoParser],
  ['autograd', autogradParser],
  ['mypy', mypyParser],
  // SWE-bench Multilingual's
  ['redis', redisParser],
  ['jq', jqParser],
  ['gotest', gotestParser],
  ['cargo', cargoParser],
  ['googletest', googletestParser],
  ['jest', jestParser],
  ['tap', tapParser],
  ['phpunit', phpunitParser],
  ['maven', mavenParser],
  ['micropython_test', micropythonParser],
  ['doctest', doctestParser],
  ['ant', antParser],
  ['gradle_custom', gradleCustomParser],
  ['calypso', calypsoParser],
  ['chart_js', chartJsParser],
  ['marked', markedParser],
  ['p5js', p5jsParser],
  ['react_pdf', reactPdfParser],
  ['vitest', vitestParser],
  ['karma', karmaParser],
  ['jest_json', jestJsonParser],
  ['ruby_unit', rubyUnitParser],
  ['rspec_transformed_json', rspecTransformedJsonParser],
  ['minitest', minitestParser],
  ['cucumber', cucumberParser],
]);

/** Adds a parser (or replaces one) under `name`. */
export function registerTestParser(name: string, parser: TestParser): void {
  parsers.set(name, parser);
}

export function getTestParser(name: string): TestParser | undefined {
  return parsers.get(name);
}

export function testParserNames(): string[] {
  return [...parsers.keys()];
}

/** The command line that runs `targets` (shell-quoted): in place of `{tests}`, else appended. */
export function testCommandLine(template: string, targets: readonly string[]): string {
  const quoted = targets.map(shQuote).join(' ');
  return template.includes('{tests}') ? template.replaceAll('{tests}', quoted) : `${template} ${quoted}`.trimEnd();
}

/** A FAIL_TO_PASS test passes as SWE-bench counts it: PASSED or XFAIL. */
export const passed = (status: TestStatus | undefined): boolean => status === 'PASSED' || status === 'XFAIL';
/** A PASS_TO_PASS test is kept when it passes or is skipped (SWE-bench's `test_maintained`). */
export const maintained = (status: TestStatus | undefined): boolean => passed(status) || status === 'SKIPPED';

export interface Grade {
  resolved: boolean;
  f2pPassed: number;
  p2pPassed: number;
  /** Expected tests that did not pass, with what happened to them ('MISSING' when not run). */
  failedTests: Array<{ id: string; kind: 'FAIL_TO_PASS' | 'PASS_TO_PASS'; status: TestStatus | 'MISSING' }>;
  /** How many expected tests the output does not mention at all. */
  missing: number;
}

const count = (text: string, char: string): number => text.split(char).length - 1;

/**
 * The status of `id`: its own, or, for an id SWE-bench's datasets cut inside its parameters (an
 * unclosed `[`), that of the ids it begins, when they agree on passing or not.
 */
export function statusOf(statuses: ReadonlyMap<string, TestStatus>, id: string, ok: (s: TestStatus) => boolean = passed): TestStatus | undefined {
  const own = statuses.get(id);
  if (own !== undefined || count(id, '[') <= count(id, ']')) return own;
  const found = [...statuses].filter(([key]) => key.startsWith(id)).map(([, status]) => status);
  if (found.length === 0) return undefined;
  return found.every(ok) || !found.some(ok) ? found[0] : 'FAILED';
}

/**
 * Resolved exactly when every FAIL_TO_PASS test passes and every PASS_TO_PASS test is kept, as
 * SWE-bench grades (`get_eval_tests_report`).
 */
export function grade(statuses: ReadonlyMap<string, TestStatus>, failToPass: readonly string[], passToPass: readonly string[]): Grade {
  const failedTests: Grade['failedTests'] = [];
  let missing = 0;
  const tally = (ids: readonly string[], kind: 'FAIL_TO_PASS' | 'PASS_TO_PASS', ok: (s: TestStatus | undefined) => boolean): number => {
    let n = 0;
    for (const id of ids) {
      const status = statusOf(statuses, id, ok);
      if (status === undefined) missing++;
      if (ok(status)) n++;
      else failedTests.push({ id, kind, status: status ?? 'MISSING' });
    }
    return n;
  };
  const f2pPassed = tally(failToPass, 'FAIL_TO_PASS', passed);
  const p2pPassed = tally(passToPass, 'PASS_TO_PASS', maintained);
  return { resolved: f2pPassed === failToPass.length && p2pPassed === passToPass.length, f2pPassed, p2pPassed, failedTests, missing };
}
