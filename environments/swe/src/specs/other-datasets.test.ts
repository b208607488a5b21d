import { describe, expect, it } from 'vitest';
import { imageFromTemplate, resolveInstance } from '../instance.ts';
import { SweConfig, SweRow } from '../schema.ts';
import { getTestParser } from '../test-parsers.ts';
import { MULTILINGUAL_SPECS } from './multilingual-table.ts';
import { datasetImage, lookupMultilingualSpec, lookupSweGymSpec, lookupSweSmithSpec, sweSmithRepo } from './other-datasets.ts';

const parse = (parser: string, log: string) => Object.fromEntries(getTestParser(parser)!.parse(log, []));

describe("the datasets' image names", () => {
  it.each([
    ['SWE-bench (lower case, __ as _1776_)', { instance_id: 'django__django-11099', repo: 'django/django' }, 'swebench/sweb.eval.x86_64.django_1776_django-11099:latest'],
    ['Multilingual', { instance_id: 'BurntSushi__ripgrep-2209', repo: 'BurntSushi/ripgrep' }, 'swebench/sweb.eval.x86_64.burntsushi_1776_ripgrep-2209:latest'],
    ['SWE-Gym (__ as _s_)', { instance_id: 'Project-MONAI__MONAI-6975', repo: 'Project-MONAI/MONAI' }, 'xingyaoww/sweb.eval.x86_64.project-monai_s_monai-6975:latest'],
    ['SWE-smith (its image_name)', { instance_id: 'a__b.1.x', image_name: 'jyangballin/swesmith.x86_64.a_1776_b.1' }, 'jyangballin/swesmith.x86_64.a_1776_b.1'],
  ])('%s', (_name, row, image) => {
    expect(datasetImage(row)).toBe(image);
  });

  it('templates: {instance_id_1776} and {instance_id_s} in lower case, {instance_image} the dataset\'s, {instance_id} as is', () => {
    expect(imageFromTemplate('docker://swebench/sweb.eval.x86_64.{instance_id_1776}:latest', 'BurntSushi__ripgrep-2209')).toBe('docker://swebench/sweb.eval.x86_64.burntsushi_1776_ripgrep-2209:latest');
    expect(imageFromTemplate('docker://xingyaoww/sweb.eval.x86_64.{instance_id_s}:latest', 'getmoto__moto-5406')).toBe('docker://xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest');
    expect(imageFromTemplate('/images/{instance_id}.sif', 'A__B-1')).toBe('/images/A__B-1.sif');
    expect(imageFromTemplate('docker://{instance_image}', 'getmoto__moto-5406', 'xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest')).toBe('docker://xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest');
  });
});

describe("SWE-Gym's specs", () => {
  it.each([
    ['getmoto/moto', '4.1', 'pytest -n0 -rA', 'pytest'],
    ['pandas-dev/pandas', '2.2', 'pytest -rA --tb=long', 'pytest'],
    ['Project-MONAI/MONAI', '1.3', 'pytest -rA ', 'pytest'],
    ['pydantic/pydantic', '2.7', 'pytest -rA --tb=short -vv -o console_output_style=classic --no-header', 'pytest_pydantic'],
  ])('%s %s: `%s` on test_patch\'s files, parsed by %s', (repo, version, command, parser) => {
    expect(lookupSweGymSpec(repo, version, '')).toMatchObject({ dataset: 'swe-gym', testCommand: command, parser, targets: 'test-patch' });
  });

  it("mypy: -k over test_patch's [case X] names, -n0 before 1.7", () => {
    const patch = 'diff --git a/test-data/unit/check-x.test b/test-data/unit/check-x.test\n+[case testOne]\n+x\n+[case testTwo-skip]\n';
    expect(lookupSweGymSpec('python/mypy', '1.4', patch)).toMatchObject({ testCommand: 'pytest -n0 -rA -k "testOne or testTwo-skip"', targets: 'none' });
    expect(lookupSweGymSpec('python/mypy', '1.10', patch)?.testCommand).toBe('pytest -rA -k "testOne or testTwo-skip"');
  });

  it("a SWE-bench repository is not SWE-Gym's", () => {
    expect(lookupSweGymSpec('django/django', '3.0', '')).toBeUndefined();
  });
});

describe("SWE-smith's specs", () => {
  it('the repository from repo or image_name (old and namespaced names)', () => {
    expect(sweSmithRepo({ repo: 'swesmith/pandas-dev__pandas.95280573' })).toBe('pandas-dev/pandas');
    expect(sweSmithRepo({ image_name: 'swesmith.x86_64.pandas-dev__pandas.95280573' })).toBe('pandas-dev/pandas');
    expect(sweSmithRepo({ image_name: 'jyangballin/swesmith.x86_64.cdgriffith_1776_box.a9c1a5ff' })).toBe('cdgriffith/box');
  });

  it('pytest --verbose on the FAIL_TO_PASS files; other commands as they are; mypy by its test keys', () => {
    const f2p = ['pandas/tests/a.py::T::x[y]', 'pandas/tests/a.py::z', 'pandas/tests/b.py::w'];
    expect(lookupSweSmithSpec({ image_name: 'swesmith.x86_64.pandas-dev__pandas.95280573' }, f2p)).toMatchObject({
      dataset: 'swe-smith',
      testCommand: 'pytest --disable-warnings --color=no --tb=no --verbose',
      parser: 'swesmith_pytest',
      targets: 'fail-to-pass-files',
    });
    expect(lookupSweSmithSpec({ image_name: 'swesmith.x86_64.tornadoweb__tornado.d5ac65c1' }, f2p)).toMatchObject({ testCommand: 'python -m tornado.test --verbose', parser: 'tornado', targets: 'none' });
    expect(lookupSweSmithSpec({ image_name: 'swesmith.x86_64.python__mypy.e93f06ce' }, ['mypy/test/testcheck.py::TypeCheckSuite::check-x.test::testOne'])?.testCommand).toBe('pytest --color=no -rA -k "testOne"');
    expect(lookupSweSmithSpec({ repo: 'swesmith/pandas-dev__pandas.95280573' }, f2p)).toBeUndefined(); // no image_name: not SWE-smith's
  });

  it('a row with image_name resolves to its image, its command on the F2P files, the gold reversed, the bug commit to check out', () => {
    const config = SweConfig.parse({ images_root: '/nonexistent-images' });
    const row = SweRow.parse({
      instance_id: 'pandas-dev__pandas.95280573.pr_53652',
      repo: 'swesmith/pandas-dev__pandas.95280573',
      patch: 'diff --git a/x b/x\n',
      FAIL_TO_PASS: ['pandas/tests/indexing/test_datetime.py::TestDatetimeIndex::test_getitem_pyarrow_index[DataFrame]'],
      PASS_TO_PASS: [],
      created_at: '2025-03-21T08:23:31.701599',
      image_name: 'swesmith.x86_64.pandas-dev__pandas.95280573',
      base_commit: 'd1c5199b6a9d7ae9382d26ee2859b837107165e7',
      problem_statement: '# PyArrow timestamp indexes',
    });
    const instance = resolveInstance(row, config);
    expect(instance).toMatchObject({
      image: 'docker://swesmith.x86_64.pandas-dev__pandas.95280573',
      testCommandFrom: 'swe-smith',
      testTargets: ['pandas/tests/indexing/test_datetime.py'],
      parserName: 'swesmith_pytest',
      goldReversed: true,
      checkout: { commit: 'd1c5199b6a9d7ae9382d26ee2859b837107165e7', patch: 'diff --git a/x b/x\n' },
      repoDir: '/testbed',
    });
  });
});

describe("SWE-bench Multilingual's specs", () => {
  it('every repository of its table has a language and a parser name', () => {
    expect(Object.keys(MULTILINGUAL_SPECS)).toHaveLength(46);
    for (const spec of Object.values(MULTILINGUAL_SPECS)) expect(spec.parser).toMatch(/^[a-z0-9_]+$/);
  });

  it('build then test commands between the markers, no directives; the newest version for one it does not list; any case of the name', () => {
    const jq = lookupMultilingualSpec('jqlang/jq', '2839')!;
    expect(jq).toMatchObject({ dataset: 'swe-bench-multilingual', language: 'c', parser: 'jq', targets: 'none', script: true, exact: true });
    expect(jq.testCommand.split('\n')).toEqual([
      'git submodule update --init',
      'autoreconf -fi',
      './configure --with-oniguruma=builtin',
      'make clean',
      'touch src/parser.y src/lexer.l',
      'make -j$(nproc)',
      ": '>>>>> Start Test Output'",
      'make check',
      ": '>>>>> End Test Output'",
    ]);
    expect(lookupMultilingualSpec('BurntSushi/ripgrep', '2209')).toMatchObject({ repo: 'burntsushi/ripgrep', parser: 'cargo', exact: true });
    expect(lookupMultilingualSpec('gin-gonic/gin', '0.0')).toMatchObject({ parser: 'gotest', exact: false });
    expect(lookupMultilingualSpec('django/django', '3.0')).toBeUndefined();
  });

  it("a row of any Multilingual repository loads with SWE-bench's parser, unless it names a test_parser", () => {
    const config = SweConfig.parse({ image_template: 'docker://swebench/sweb.eval.x86_64.{instance_id_1776}:latest' });
    const row = { instance_id: 'vuejs__core-11589', repo: 'vuejs/core', version: '11589', base_commit: 'a'.repeat(40), FAIL_TO_PASS: ['x'], PASS_TO_PASS: [] };
    expect(resolveInstance(SweRow.parse(row), config)).toMatchObject({ parserName: 'vitest', testScript: true });
    expect(resolveInstance(SweRow.parse({ ...row, test_parser: 'jest' }), config)).toMatchObject({ parserName: 'jest', testScript: true });
    const jekyll = { ...row, instance_id: 'jekyll__jekyll-8761', repo: 'jekyll/jekyll', version: '8761' };
    expect(resolveInstance(SweRow.parse(jekyll), config)).toMatchObject({ parserName: 'cucumber' });
  });
});

describe('the parsers of SWE-Gym, SWE-smith and Multilingual (their harnesses\' rules)', () => {
  it.each<[string, string, Record<string, string>]>([
    ['swesmith_pytest', 'tests/a.py::test_x PASSED  [ 50%]\ntests/a.py::test_y[1 2] FAILED [100%]\nnoise', { 'tests/a.py::test_x': 'PASSED' }], // an id with a space is not SWE-smith's
    ['swesmith_pytest', 'tests/a.py::test_z ERROR\ntests/a.py::test_w XFAIL', { 'tests/a.py::test_z': 'ERROR', 'tests/a.py::test_w': 'XFAIL' }],
    ['pytest_pydantic', 'PASSED tests/a.py::x\nFAILED [ 50%] tests/a.py::y - boom', { 'tests/a.py::x': 'PASSED', 'tests/a.py::y': 'FAILED' }],
    ['redis', '[ok]: GETRANGE basics (3 ms)\n[err]: SETRANGE x in tests/unit/type/string.tcl\n[skip]: z', { 'GETRANGE basics': 'PASSED', 'SETRANGE x': 'FAILED', z: 'SKIPPED' }],
    ['jq', 'PASS: tests/jqtest\nFAIL: tests/shtest\n# TOTAL: 2', { 'tests/jqtest': 'PASSED', 'tests/shtest': 'FAILED' }],
    ['gotest', '=== RUN   TestA\n--- PASS: TestA (0.00s)\n    --- FAIL: TestA/sub (0.01s)\n--- SKIP: TestB (0.00s)', { TestA: 'PASSED', 'TestA/sub': 'FAILED', TestB: 'SKIPPED' }],
    ['cargo', 'test regression::r2208 ... ok\ntest a::b ... FAILED\ntest c ... ignored', { 'regression::r2208': 'PASSED', 'a::b': 'FAILED' }],
    ['googletest', '[       OK ] Suite.A (0 ms)\n[  FAILED  ] Suite.B (1 ms)', { 'Suite.A': 'PASSED', 'Suite.B': 'FAILED' }],
    ['jest', '  ✓ adds (3 ms)\n  ✕ subtracts\n  ○ skipped one', { adds: 'PASSED', subtracts: 'FAILED', 'skipped one': 'SKIPPED' }],
    ['tap', 'ok 1 first\nnot ok 2 second', { first: 'PASSED', second: 'FAILED' }],
    ['phpunit', 'Calculator (Tests\\Calculator)\n ✔ Adds\n ✘ Subtracts\n ↩ Skips', { 'Calculator > Adds': 'PASSED', 'Calculator > Subtracts': 'FAILED', 'Calculator > Skips': 'SKIPPED' }],
    ['maven', '+ mvn test -Dtest=com.x.ATest\n[INFO] BUILD SUCCESS\n+ mvn test -Dtest=com.x.BTest#m\n[INFO] BUILD FAILURE', { 'com.x.ATest': 'PASSED', 'com.x.BTest#m': 'FAILED' }],
    ['tornado', 'test_a (tornado.test.x.T) ... ok\nFAIL: test_b (tornado.test.x.T)\ntest_c (tornado.test.x.T) ... skipped \'no\'', { 'test_a (tornado.test.x.T)': 'PASSED', 'test_b (tornado.test.x.T)': 'FAILED', 'test_c (tornado.test.x.T)': 'SKIPPED' }],
    ['python_slugify', 'test_a (test.T) ... ok\ntest_b (test.T) ... FAIL', { 'test_a (test.T)': 'PASSED', 'test_b (test.T)': 'FAILED' }],
    ['paramiko', 'PASSED tests/a.py::x\nFAILED tests/a.py::y - e', { 'tests/a.py::x': 'PASSED', 'tests/a.py::y': 'FAILED' }],
    ['autograd', '[gw0] PASSED tests/a.py::x\n[gw1] FAILED tests/a.py::y', { 'tests/a.py::x': 'PASSED', 'tests/a.py::y': 'FAILED' }],
  ])('%s', (parser, log, expected) => {
    expect(parse(parser, log)).toEqual(expected);
  });
});
