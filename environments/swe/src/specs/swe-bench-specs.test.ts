import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { djangoParser, getTestParser } from '../test-parsers.ts';
import { condaActivateScript, lookupSweBenchSpec, sweBenchRepos } from './swe-bench-specs.ts';
import { testFilesOfPatch } from './test-directives.ts';

describe("SWE-bench's per-repository specs", () => {
  it.each([
    ['django/django', '3.0', './tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1', 'django'],
    ['django/django', '1.9', './tests/runtests.py --verbosity 2', 'django'],
    ['sympy/sympy', '1.7', "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose", 'sympy'],
    ['sphinx-doc/sphinx', '3.5', 'tox --current-env -epy39 -v --', 'pytest_v2'],
    ['astropy/astropy', '4.3', 'pytest -rA', 'pytest_v2'],
    ['astropy/astropy', '1.3', 'pytest -rA -vv -o console_output_style=classic --tb=no', 'pytest_v2'],
    ['mwaskom/seaborn', '0.12', 'pytest --no-header -rA', 'seaborn'],
    ['matplotlib/matplotlib', '3.5', 'pytest -rA', 'matplotlib'],
    ['psf/requests', '2.0', 'pytest -rA', 'pytest_options'],
    ['pylint-dev/pylint', '2.15', 'pytest -rA', 'pytest_options'],
    ['scikit-learn/scikit-learn', '0.22', 'pytest -rA', 'pytest_v2'],
    ['pydata/xarray', '2022.06', 'pytest -rA', 'pytest'],
    ['pallets/flask', '2.3', 'pytest -rA', 'pytest'],
    ['marshmallow-code/marshmallow', '3.0', 'pytest -rA', 'pytest'],
    ['pytest-dev/pytest', '5.4', 'pytest -rA', 'pytest'],
  ])('%s %s: `%s`, parsed by %s', (repo, version, command, parser) => {
    expect(lookupSweBenchSpec(repo, version)).toMatchObject({ repo, version, testCommand: command, parser, exact: true });
    expect(getTestParser(parser)).toBeDefined();
  });

  it('no pytest command disables the cache plugin (SWE-bench does not)', () => {
    for (const repo of sweBenchRepos()) expect(lookupSweBenchSpec(repo, undefined)!.testCommand).not.toContain('no:cacheprovider');
  });

  it("exports Django's locale where SWE-bench's eval script does, and nothing elsewhere", () => {
    expect(lookupSweBenchSpec('django/django', '2.2')!.env).toEqual({ LANG: 'en_US.UTF-8', LC_ALL: 'en_US.UTF-8', PYTHONIOENCODING: 'utf8', LANGUAGE: 'en_US:en' });
    expect(lookupSweBenchSpec('django/django', '4.0')!.env).toEqual({});
    expect(lookupSweBenchSpec('sympy/sympy', '1.7')!.env).toEqual({});
  });

  it("an unlisted version gets the repository's newest spec; an unknown repository none; numbers read as SWE-bench writes them", () => {
    expect(lookupSweBenchSpec('django/django', '9.9')).toMatchObject({ testCommand: './tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1', exact: false });
    expect(lookupSweBenchSpec('someone/else', '1.0')).toBeUndefined();
    expect(lookupSweBenchSpec('toString', '1.0')).toBeUndefined();
    expect(lookupSweBenchSpec(undefined, '1.0')).toBeUndefined();
    expect(lookupSweBenchSpec('django/django', 3)).toMatchObject({ version: '3.0', exact: true });
    expect(lookupSweBenchSpec('sympy/sympy', 1.1)).toMatchObject({ version: '1.1', exact: true });
  });
});

describe("the conda env of SWE-bench's images", () => {
  it("puts the env's bin first on PATH when it exists, and leaves PATH alone when not", () => {
    const root = mkdtempSync(join(tmpdir(), 'rollserve-conda-'));
    try {
      const prefix = join(root, 'envs', 'testbed');
      const run = () => execFileSync('/bin/sh', ['-c', `${condaActivateScript(prefix)}\necho "$PATH|$CONDA_PREFIX"`], { env: { PATH: '/usr/bin:/bin' }, encoding: 'utf8' }).trim();
      expect(run()).toBe('/usr/bin:/bin|');
      mkdirSync(join(prefix, 'bin'), { recursive: true });
      expect(run()).toBe(`${prefix}/bin:/usr/bin:/bin|${prefix}`);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

// Test patches shaped like SWE-bench's (django__django-11099, sympy__sympy-20590).
const DJANGO_TEST_PATCH = `diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py
--- a/tests/auth_tests/test_validators.py
+++ b/tests/auth_tests/test_validators.py
@@ -237,7 +237,7 @@ def test_unicode_validator(self):
         invalid_usernames = [
             "o'connell", "عبد ال",
             "zerowidth\\u200Bspace", "nonbreaking\\u00A0space",
-            "en\\u2013dash",
+            "en\\u2013dash", 'trailingnewline\\u000A',
         ]
diff --git a/tests/auth_tests/fixtures/regular.json b/tests/auth_tests/fixtures/regular.json
--- a/tests/auth_tests/fixtures/regular.json
+++ b/tests/auth_tests/fixtures/regular.json
@@ -1 +1 @@
-[]
+[{}]
diff --git a/tests/migrations/test_writer.py b/tests/migrations/test_writer.py
new file mode 100644
--- /dev/null
+++ b/tests/migrations/test_writer.py
@@ -0,0 +1 @@
+import os
`;
const SYMPY_TEST_PATCH = `diff --git a/sympy/core/tests/test_basic.py b/sympy/core/tests/test_basic.py
--- a/sympy/core/tests/test_basic.py
+++ b/sympy/core/tests/test_basic.py
@@ -34,6 +34,12 @@ def test_structure():
     assert bool(b1)
 
 
+def test_immutable():
+    assert not hasattr(b1, '__dict__')
+    with raises(AttributeError):
+        b1.x = 1
+
+
 def test_equality():
diff --git a/doc/src/modules/core.rst b/doc/src/modules/core.rst
--- a/doc/src/modules/core.rst
+++ b/doc/src/modules/core.rst
@@ -1 +1 @@
-a
+b
`;

describe('test files from test_patch, as SWE-bench derives them', () => {
  it("django: runtests.py's module labels; data files left out", () => {
    const files = testFilesOfPatch(DJANGO_TEST_PATCH);
    expect(files).toEqual(['tests/auth_tests/test_validators.py', 'tests/migrations/test_writer.py']);
    expect(djangoParser.directives!(files)).toEqual(['auth_tests.test_validators', 'migrations.test_writer']);
  });

  it('sympy: the paths themselves (its FAIL_TO_PASS ids are bare names like test_immutable)', () => {
    // SWE-bench's NON_TEST_EXTS does not list .rst, so the doc file is a directive too
    expect(testFilesOfPatch(SYMPY_TEST_PATCH)).toEqual(['sympy/core/tests/test_basic.py', 'doc/src/modules/core.rst']);
  });

  it('renames give the new path; "csv" without a dot as SWE-bench lists it; an empty patch none', () => {
    expect(testFilesOfPatch('diff --git a/tests/old_test.py b/tests/new_test.py\nsimilarity index 90%\n')).toEqual(['tests/new_test.py']);
    expect(testFilesOfPatch('diff --git a/tests/data/table.csv b/tests/data/table.csv\ndiff --git a/tests/datacsv b/tests/datacsv\n')).toEqual([]);
    expect(testFilesOfPatch('')).toEqual([]);
  });
});
