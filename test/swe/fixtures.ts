import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

// Small real Python repositories, built in a temp dir with a few commits each: a bug at
// base_commit, the upstream fix in a LATER commit (which the agent must never see), the gold patch
// and test_patch cut from that fix, FAIL_TO_PASS and PASS_TO_PASS lists, and patches that break
// a PASS_TO_PASS test or do not apply. Synchronous (git is fast), so a test file can build them at
// load time for describeContract.

export type SweFixtureRow = Record<string, unknown> & { responses_create_params: { input: Array<Record<string, unknown>> } };

export interface SweFixture {
  name: string;
  /** The host repository (its HEAD is the future fix commit). */
  repoPath: string;
  /** A row in SWE-bench form plus `repo_path`. */
  row: SweFixtureRow;
  baseCommit: string;
  /** The upstream fix commit after base_commit; it must not reach the agent. */
  futureCommit: string;
  goldPatch: string;
  testPatch: string;
  /** The gold fix plus a change that breaks a PASS_TO_PASS test. */
  breakingPatch: string;
  /** A patch whose context exists nowhere in the repository. */
  unappliablePatch: string;
  /** The gold patch as one str_replace of the editor tool (path relative to the repository). */
  goldEdit: { path: string; old_str: string; new_str: string };
  failToPass: string[];
  passToPass: string[];
}

interface RepoSpec {
  name: string;
  problem: string;
  /** Commits up to base_commit: each a map of file → content. */
  history: Array<Record<string, string>>;
  /** The fix (source files) and the tests it adds: the future commit. */
  fix: Record<string, string>;
  tests: Record<string, string>;
  /** Applied over the fix to produce the breaking patch. */
  breakage: Record<string, string>;
  goldEdit: { path: string; old_str: string; new_str: string };
  failToPass: string[];
  passToPass: string[];
  /** Files committed with the executable bit. */
  executables?: string[];
  /** Row fields over the defaults (a SWE-bench `repo` and `version`). */
  row?: Record<string, unknown>;
}

const GIT_ENV = {
  ...process.env,
  GIT_CONFIG_NOSYSTEM: '1',
  GIT_AUTHOR_NAME: 'Fixture Author',
  GIT_AUTHOR_EMAIL: 'author@example.com',
  GIT_COMMITTER_NAME: 'Fixture Author',
  GIT_COMMITTER_EMAIL: 'author@example.com',
};

function git(cwd: string, ...args: string[]): string {
  return execFileSync('git', args, { cwd, env: { ...GIT_ENV, HOME: cwd }, encoding: 'utf8' });
}

function writeFiles(root: string, files: Record<string, string>): void {
  for (const [path, content] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), content);
  }
}

function commit(dir: string, files: Record<string, string>, message: string, date: number, executables: readonly string[] = []): string {
  writeFiles(dir, files);
  for (const file of executables) if (file in files) chmodSync(join(dir, file), 0o755);
  git(dir, 'add', '-A');
  const when = `2024-01-${String(date).padStart(2, '0')}T12:00:00Z`;
  execFileSync('git', ['commit', '-q', '-m', message], {
    cwd: dir,
    env: { ...GIT_ENV, HOME: dir, GIT_AUTHOR_DATE: when, GIT_COMMITTER_DATE: when },
  });
  return git(dir, 'rev-parse', 'HEAD').trim();
}

// ---------------------------------------------------------------- calc: median of an even list

const CALC_STATS_V1 = `def mean(xs):
    if not xs:
        raise ValueError("mean of empty data")
    return sum(xs) / len(xs)


def median(xs):
    if not xs:
        raise ValueError("median of empty data")
    s = sorted(xs)
    return s[len(s) // 2]
`;
const CALC_VARIANCE = `

def variance(xs):
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)
`;
const CALC_TESTS_V1 = `from calc.stats import mean, median


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_odd():
    assert median([3, 1, 2]) == 2
`;
const CALC_TESTS_V2 = CALC_TESTS_V1.replace('import mean, median', 'import mean, median, variance') + `

def test_variance():
    assert variance([1, 2, 3, 4]) == 1.25
`;
const CALC_BUGGY = '    s = sorted(xs)\n    return s[len(s) // 2]\n';
const CALC_FIXED = '    s = sorted(xs)\n    mid = len(s) // 2\n    if len(s) % 2 == 0:\n        return (s[mid - 1] + s[mid]) / 2\n    return s[mid]\n';

const calc: RepoSpec = {
  name: 'calc',
  problem: 'median() returns the upper middle element for lists of even length: median([4, 1, 3, 2]) gives 3, it should give 2.5 (the mean of the two middle elements).',
  history: [
    { 'README.md': '# calc\n\nSmall statistics helpers.\n', '.gitignore': '__pycache__/\n', 'calc/__init__.py': '', 'calc/stats.py': CALC_STATS_V1, 'tests/test_stats.py': CALC_TESTS_V1 },
    { 'calc/stats.py': CALC_STATS_V1 + CALC_VARIANCE, 'tests/test_stats.py': CALC_TESTS_V2 },
  ],
  fix: { 'calc/stats.py': (CALC_STATS_V1 + CALC_VARIANCE).replace(CALC_BUGGY, CALC_FIXED) },
  tests: { 'tests/test_stats.py': CALC_TESTS_V2 + '\n\ndef test_median_even():\n    assert median([4, 1, 3, 2]) == 2.5\n' },
  breakage: { 'calc/stats.py': (CALC_STATS_V1 + CALC_VARIANCE).replace(CALC_BUGGY, CALC_FIXED).replace('return sum(xs) / len(xs)', 'return sum(xs) / (len(xs) + 1)') },
  goldEdit: { path: 'calc/stats.py', old_str: CALC_BUGGY, new_str: CALC_FIXED },
  failToPass: ['tests/test_stats.py::test_median_even'],
  passToPass: ['tests/test_stats.py::test_mean', 'tests/test_stats.py::test_median_odd', 'tests/test_stats.py::test_variance'],
};

// ---------------------------------------------------------------- textkit: slugify separators

const SLUG_V1 = `import re


def slugify(text, sep="-"):
    text = text.strip().lower()
    text = re.sub(r"[^a-z0-9]", sep, text)
    return text.strip(sep)
`;
const SLUG_TRUNCATE = `

def truncate(text, n):
    return text if len(text) <= n else text[: n - 3] + "..."
`;
const SLUG_TESTS = (extra: string) => `import pytest

from textkit.slug import slugify, truncate


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Hello", "hello"),
        ("Hello World", "hello-world"),${extra}
    ],
)
def test_slugify(text, expected):
    assert slugify(text) == expected


def test_custom_sep():
    assert slugify("a b", sep="_") == "a_b"


def test_truncate():
    assert truncate("abcdefgh", 6) == "abc..."
`;
const SLUG_BUGGY = '    text = re.sub(r"[^a-z0-9]", sep, text)\n';
const SLUG_FIXED = '    text = re.sub(r"[^a-z0-9]+", sep, text)\n';

const textkit: RepoSpec = {
  name: 'textkit',
  problem: 'slugify() does not collapse runs of separators: slugify("Hello,  World!") gives "hello---world" instead of "hello-world".',
  history: [
    { 'README.md': '# textkit\n', 'textkit/__init__.py': '', 'textkit/slug.py': SLUG_V1, 'tests/test_slug.py': SLUG_TESTS('').replace(', truncate', '').replace(/\n\n\ndef test_truncate[\s\S]*$/, '\n') },
    { 'textkit/slug.py': SLUG_V1 + SLUG_TRUNCATE, 'tests/test_slug.py': SLUG_TESTS('') },
  ],
  fix: { 'textkit/slug.py': (SLUG_V1 + SLUG_TRUNCATE).replace(SLUG_BUGGY, SLUG_FIXED) },
  tests: { 'tests/test_slug.py': SLUG_TESTS('\n        ("Hello,  World!", "hello-world"),\n        ("  many   spaces  ", "many-spaces"),') },
  breakage: { 'textkit/slug.py': (SLUG_V1 + SLUG_TRUNCATE).replace(SLUG_BUGGY, SLUG_FIXED).replace('text[: n - 3]', 'text[: n - 2]') },
  goldEdit: { path: 'textkit/slug.py', old_str: SLUG_BUGGY, new_str: SLUG_FIXED },
  failToPass: ['tests/test_slug.py::test_slugify[Hello,  World!-hello-world]', 'tests/test_slug.py::test_slugify[  many   spaces  -many-spaces]'],
  passToPass: [
    'tests/test_slug.py::test_slugify[Hello-hello]',
    'tests/test_slug.py::test_slugify[Hello World-hello-world]',
    'tests/test_slug.py::test_custom_sep',
    'tests/test_slug.py::test_truncate',
  ],
};

// ---------------------------------------------------------------- inventory: removing too much

const STORE_V1 = `class Inventory:
    def __init__(self):
        self._items = {}

    def add(self, name, qty=1):
        if qty <= 0:
            raise ValueError("qty must be positive")
        self._items[name] = self._items.get(name, 0) + qty

    def count(self, name):
        return self._items.get(name, 0)

    def remove(self, name, qty=1):
        self._items[name] = self._items.get(name, 0) - qty
`;
const STORE_TOTAL = `
    def total(self):
        return sum(self._items.values())
`;
const STORE_TESTS_V1 = `import pytest

from inventory.store import Inventory


class TestInventory:
    def test_add(self):
        inv = Inventory()
        inv.add("apple", 3)
        assert inv.count("apple") == 3

    def test_add_rejects_zero(self):
        with pytest.raises(ValueError):
            Inventory().add("apple", 0)

    def test_remove(self):
        inv = Inventory()
        inv.add("apple", 3)
        inv.remove("apple", 2)
        assert inv.count("apple") == 1
`;
const STORE_TESTS_V2 = `${STORE_TESTS_V1}
    def test_total(self):
        inv = Inventory()
        inv.add("apple", 3)
        inv.add("pear", 2)
        assert inv.total() == 5
`;
const STORE_BUGGY = '    def remove(self, name, qty=1):\n        self._items[name] = self._items.get(name, 0) - qty\n';
const STORE_FIXED =
  '    def remove(self, name, qty=1):\n        have = self._items.get(name, 0)\n        if qty > have:\n            raise KeyError(name)\n' +
  '        if qty == have:\n            del self._items[name]\n        else:\n            self._items[name] = have - qty\n';

const inventory: RepoSpec = {
  name: 'inventory',
  problem: 'Inventory.remove() lets the stock go negative and accepts unknown items. Removing more than is in stock (or an unknown item) must raise KeyError and leave the stock unchanged.',
  history: [
    { 'README.md': '# inventory\n', 'inventory/__init__.py': '', 'inventory/store.py': STORE_V1, 'tests/test_store.py': STORE_TESTS_V1 },
    { 'inventory/store.py': STORE_V1 + STORE_TOTAL, 'tests/test_store.py': STORE_TESTS_V2 },
  ],
  fix: { 'inventory/store.py': (STORE_V1 + STORE_TOTAL).replace(STORE_BUGGY, STORE_FIXED) },
  tests: {
    'tests/test_store.py':
      STORE_TESTS_V2 +
      '\n    def test_remove_too_many(self):\n        inv = Inventory()\n        inv.add("apple", 1)\n        with pytest.raises(KeyError):\n            inv.remove("apple", 2)\n        assert inv.count("apple") == 1\n' +
      '\n    def test_remove_unknown(self):\n        with pytest.raises(KeyError):\n            Inventory().remove("pear")\n',
  },
  breakage: { 'inventory/store.py': (STORE_V1 + STORE_TOTAL).replace(STORE_BUGGY, STORE_FIXED).replace('return sum(self._items.values())', 'return len(self._items)') },
  goldEdit: { path: 'inventory/store.py', old_str: STORE_BUGGY, new_str: STORE_FIXED },
  failToPass: ['tests/test_store.py::TestInventory::test_remove_too_many', 'tests/test_store.py::TestInventory::test_remove_unknown'],
  passToPass: [
    'tests/test_store.py::TestInventory::test_add',
    'tests/test_store.py::TestInventory::test_add_rejects_zero',
    'tests/test_store.py::TestInventory::test_remove',
    'tests/test_store.py::TestInventory::test_total',
  ],
};

// ---------------------------------------------------------------- shop: a Django-shaped repository

// Its tests/runtests.py takes Django's arguments and prints as Django's runner does (unittest's
// verbose runner), so a row with repo django/django runs through SWE-bench's Django spec: the
// module labels from test_patch, the django parser, the ids exactly as printed.
const RUNTESTS = `#!/usr/bin/env python3
import argparse
import os
import sys
import unittest

parser = argparse.ArgumentParser()
parser.add_argument("labels", nargs="*")
parser.add_argument("--verbosity", type=int, default=1)
parser.add_argument("--settings")
parser.add_argument("--parallel", type=int, default=0)
args = parser.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.dirname(here)]
print("Testing against Django installed in '%s' with up to %d processes" % (os.path.dirname(here), args.parallel or 1), file=sys.stderr)
suite = unittest.defaultTestLoader.loadTestsFromNames(args.labels)
print("System check identified no issues (0 silenced).", file=sys.stderr)
result = unittest.TextTestRunner(verbosity=args.verbosity).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
`;
const PRICING_V1 = `def total(prices):
    return sum(prices[1:])


def cheapest(prices):
    return min(prices)
`;
const PRICING_TESTS_V1 = `import unittest

from shop.pricing import cheapest, total


class PricingTests(unittest.TestCase):
    def test_total_empty(self):
        self.assertEqual(total([]), 0)

    def test_cheapest(self):
        """The cheapest price is the smallest one."""
        self.assertEqual(cheapest([3, 1, 2]), 1)
`;
const PRICING_BUGGY = '    return sum(prices[1:])\n';
const PRICING_FIXED = '    return sum(prices)\n';

const shop: RepoSpec = {
  name: 'shop',
  problem: 'total() leaves out the first price: total([1, 2, 3]) gives 5, it should give 6.',
  history: [
    {
      'README.md': '# shop\n',
      'shop/__init__.py': '',
      'shop/pricing.py': PRICING_V1,
      'tests/runtests.py': RUNTESTS,
      'tests/pricing_tests/__init__.py': '',
      'tests/pricing_tests/tests.py': PRICING_TESTS_V1,
    },
  ],
  fix: { 'shop/pricing.py': PRICING_V1.replace(PRICING_BUGGY, PRICING_FIXED) },
  tests: { 'tests/pricing_tests/tests.py': `${PRICING_TESTS_V1}\n    def test_total_many(self):\n        self.assertEqual(total([1, 2, 3]), 6)\n` },
  breakage: { 'shop/pricing.py': PRICING_V1.replace(PRICING_BUGGY, PRICING_FIXED).replace('min(prices)', 'max(prices)') },
  goldEdit: { path: 'shop/pricing.py', old_str: PRICING_BUGGY, new_str: PRICING_FIXED },
  // as Django's runner prints them on Python 3.11; a docstring stands for its test (SWE-bench's ids do too)
  failToPass: ['test_total_many (pricing_tests.tests.PricingTests.test_total_many)'],
  passToPass: ['test_total_empty (pricing_tests.tests.PricingTests.test_total_empty)', 'The cheapest price is the smallest one.'],
  executables: ['tests/runtests.py'],
  row: { repo: 'django/django', version: '4.0' },
};

export const REPO_SPECS: readonly RepoSpec[] = [calc, textkit, inventory, shop];

function buildRepo(root: string, spec: RepoSpec): SweFixture {
  const dir = join(root, spec.name);
  mkdirSync(dir);
  git(dir, 'init', '-q', '-b', 'main');
  let day = 1;
  for (const [i, files] of spec.history.entries()) commit(dir, files, i === 0 ? 'Initial version' : `Add feature ${i}`, day++, spec.executables);
  const baseCommit = git(dir, 'rev-parse', 'HEAD').trim();
  const futureCommit = commit(dir, { ...spec.fix, ...spec.tests }, `Fix: ${spec.problem.split(':')[0]}`, day++);
  const diff = (...paths: string[]) => git(dir, 'diff', baseCommit, futureCommit, '--', ...paths);
  const goldPatch = diff(...Object.keys(spec.fix));
  const testPatch = diff(...Object.keys(spec.tests));
  // the breaking patch: base + fix + breakage, as a diff against base
  git(dir, 'checkout', '-q', '--detach', baseCommit);
  writeFiles(dir, spec.breakage);
  const breakingPatch = git(dir, 'diff');
  git(dir, 'checkout', '-q', '-f', 'main');
  const file = Object.keys(spec.fix)[0]!;
  const unappliablePatch = `diff --git a/${file} b/${file}\n--- a/${file}\n+++ b/${file}\n@@ -1,3 +1,3 @@\n-this line is not in the file\n+nor is this one\n context that does not exist\n`;
  const row = {
    repo: `fixtures/${spec.name}`,
    instance_id: `fixtures__${spec.name}-1`,
    base_commit: baseCommit,
    patch: goldPatch,
    test_patch: testPatch,
    problem_statement: spec.problem,
    hints_text: '',
    created_at: '2024-01-03T12:00:00Z',
    version: '1.0',
    FAIL_TO_PASS: JSON.stringify(spec.failToPass),
    PASS_TO_PASS: JSON.stringify(spec.passToPass),
    environment_setup_commit: baseCommit,
    repo_path: dir,
    ...spec.row,
    responses_create_params: {
      input: [
        {
          role: 'user',
          content: `The repository is at /workspace. ${spec.problem}\nFix it with the tools you have, then call submit.`,
        },
      ],
    },
  };
  return {
    name: spec.name,
    repoPath: dir,
    row,
    baseCommit,
    futureCommit,
    goldPatch,
    testPatch,
    breakingPatch,
    unappliablePatch,
    goldEdit: spec.goldEdit,
    failToPass: spec.failToPass,
    passToPass: spec.passToPass,
  };
}

export interface SweFixtures {
  /** The repositories' directory: the config's `repos_root` for the fixture rows. */
  root: string;
  fixtures: SweFixture[];
  /** Removes the repositories. */
  close(): void;
}

/** Builds the four fixture repositories in a fresh temp dir (each call its own). */
export function buildSweFixtures(): SweFixtures {
  const root = mkdtempSync(join(tmpdir(), 'rollserve-swe-fixtures-'));
  // the SWE environment reads a row's repository as the sandbox user (nobody) under a root
  // service: the repositories are readable by others, as an operator's repos_root would be
  chmodSync(root, 0o755);
  try {
    return { root, fixtures: REPO_SPECS.map((spec) => buildRepo(root, spec)), close: () => rmSync(root, { recursive: true, force: true }) };
  } catch (error) {
    rmSync(root, { recursive: true, force: true });
    throw error;
  }
}
