import { buildExecArgv, buildInstanceStartArgv, limitWrapper, RolloutError } from '@rollserve/core';
import { describe, expect, it } from 'vitest';
import { instanceTestCommand, resolveInstance, sandboxSpec } from './instance.ts';
import { SweConfig, SweRow } from './schema.ts';
import { freshRepoScript } from './scripts.ts';

const swebenchRow = {
  repo: 'astropy/astropy',
  instance_id: 'astropy__astropy-12907',
  base_commit: 'd16bfe05a744909de4b27f5875fe0d4ed41ce607',
  test_patch: 'diff --git a/x b/x\n',
  FAIL_TO_PASS: '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
  PASS_TO_PASS: '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
  version: '4.3',
};

describe('rows and config', () => {
  it('reads SWE-bench rows: FAIL_TO_PASS / PASS_TO_PASS as JSON strings or lists', () => {
    const row = SweRow.parse(swebenchRow);
    expect(row.FAIL_TO_PASS).toEqual(['astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]']);
    expect(SweRow.parse({ ...swebenchRow, FAIL_TO_PASS: ['a'], PASS_TO_PASS: undefined }).PASS_TO_PASS).toEqual([]);
    expect(SweRow.safeParse({ ...swebenchRow, FAIL_TO_PASS: 'not json' }).success).toBe(false);
    expect(row.version).toBe('4.3'); // other keys pass through
  });

  it("an image row runs in /testbed with SWE-bench's spec of its repository; a repo_path row in the workspace", () => {
    const config = SweConfig.parse({});
    const image = resolveInstance(SweRow.parse({ ...swebenchRow, image: 'docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest' }), config);
    expect(image).toMatchObject({ repoDir: '/testbed', workdir: '/workspace', parserName: 'pytest_v2', testCommand: 'pytest -rA', testCommandFrom: 'swe-bench', testTargets: ['x'] });
    const unknownRepo = resolveInstance(SweRow.parse({ ...swebenchRow, repo: 'someone/else', image: 'x.sif' }), config);
    expect(unknownRepo).toMatchObject({ parserName: 'pytest', testCommand: 'python3 -m pytest -rA {tests}', testCommandFrom: 'default' });
    expect(image.repoPath).toBeUndefined();
    const local = resolveInstance(SweRow.parse({ ...swebenchRow, repo_path: '/srv/repos/astropy', setup_script: 'pip install -e .' }), config);
    expect(local).toMatchObject({ repoDir: '/workspace', repoPath: '/srv/repos/astropy', setupScript: 'pip install -e .' });
    expect(image.image).toBe('docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest');
  });

  it("names SWE-bench images from the instance id and puts the config's env in the sandbox", () => {
    const config = SweConfig.parse({ image_template: 'docker://swebench/sweb.eval.x86_64.{instance_id_1776}:latest', env: { PATH: '/opt/miniconda3/envs/testbed/bin:/usr/bin:/bin' } });
    const instance = resolveInstance(SweRow.parse(swebenchRow), config);
    expect(instance.image).toBe('docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest');
    expect(resolveInstance(SweRow.parse({ ...swebenchRow, image: '/images/x.sif' }), config).image).toBe('/images/x.sif');
    expect(sandboxSpec(instance, config).env).toMatchObject({ PYTHONDONTWRITEBYTECODE: '1', GIT_CONFIG_VALUE_0: '*', PATH: '/opt/miniconda3/envs/testbed/bin:/usr/bin:/bin' });
    expect(SweConfig.safeParse({ env: { 'A;B': 'x' } }).success).toBe(false);
  });

  it('refuses rows without a repository, outside repos_root, with an unknown parser or an option as commit', () => {
    const config = SweConfig.parse({ repos_root: '/srv/repos' });
    const fails = (row: Record<string, unknown>, pattern: RegExp) => {
      let error: unknown;
      try {
        resolveInstance(SweRow.parse({ ...swebenchRow, ...row }), config);
      } catch (e) {
        error = e;
      }
      expect(RolloutError.isInstance(error) && error.code === 'UNPROCESSABLE').toBe(true); // a 422 on both faces
      expect((error as Error).message).toMatch(pattern);
    };
    fails({}, /repo_path .* or an image/);
    fails({ repo_path: '../etc' }, /outside repos_root/);
    fails({ repo_path: 'astropy', binds: [{ host: '/etc', sandbox: '/data' }] }, /bind "\/etc" is outside repos_root/);
    const unknownParser = SweRow.safeParse({ ...swebenchRow, repo_path: 'astropy', test_parser: 'nope' });
    expect(unknownParser.success).toBe(false);
    expect(unknownParser.error?.issues[0]).toMatchObject({ path: ['test_parser'], message: expect.stringMatching(/^unknown test_parser "nope" \(known: pytest, .*sympy/) });
    expect(SweConfig.safeParse({ test_parser: 'nope' }).success).toBe(false);
    fails({ repo_path: 'astropy', base_commit: '--output=/tmp/x' }, /invalid base_commit/);
    expect(resolveInstance(SweRow.parse({ ...swebenchRow, repo_path: 'astropy' }), config).repoPath).toBe('/srv/repos/astropy');
  });
});

describe("SWE-bench's specs, overrides, env and binds", () => {
  const djangoRow = {
    repo: 'django/django',
    instance_id: 'django__django-11099',
    base_commit: 'd26b2424437dabeeca94d7900b37d2df4410da0c',
    version: '3.0',
    image: '/images/django.sif',
    test_patch: 'diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n--- a/tests/auth_tests/test_validators.py\n+++ b/tests/auth_tests/test_validators.py\n',
    FAIL_TO_PASS: '["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]',
    PASS_TO_PASS: '[]',
  };

  it("django runs runtests.py on the test_patch's modules with SWE-bench's locale; row and config override", () => {
    const config = SweConfig.parse({});
    const instance = resolveInstance(SweRow.parse(djangoRow), config);
    expect(instance).toMatchObject({ parserName: 'django', testTargets: ['auth_tests.test_validators'] });
    expect(instanceTestCommand(instance)).toBe("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 'auth_tests.test_validators'");
    expect(instance.testEnv).toMatchObject({ LANG: 'en_US.UTF-8', LC_ALL: 'en_US.UTF-8' });
    const row = resolveInstance(SweRow.parse({ ...djangoRow, test_command: 'python -m pytest -rA {tests}', test_parser: 'pytest' }), config);
    expect(row).toMatchObject({ parserName: 'pytest', testCommandFrom: 'row', testTargets: ['tests/auth_tests/test_validators.py'] });
    const configured = resolveInstance(SweRow.parse(djangoRow), SweConfig.parse({ test_command: 'make test', test_parser: 'unittest' }));
    expect(configured).toMatchObject({ parserName: 'unittest', testCommand: 'make test', testCommandFrom: 'config' });
  });

  it('sympy runs bin/test on the files of test_patch, whatever its bare test names', () => {
    const instance = resolveInstance(
      SweRow.parse({
        ...djangoRow,
        repo: 'sympy/sympy',
        instance_id: 'sympy__sympy-20590',
        version: '1.7',
        test_patch: 'diff --git a/sympy/core/tests/test_basic.py b/sympy/core/tests/test_basic.py\n',
        FAIL_TO_PASS: '["test_immutable"]',
        PASS_TO_PASS: '["test_structure"]',
      }),
      SweConfig.parse({}),
    );
    expect(instanceTestCommand(instance)).toBe("PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose 'sympy/core/tests/test_basic.py'");
    expect(instance.parserName).toBe('sympy');
  });

  it("puts the row's env (over the config's) and binds in the sandbox spec, and its image_template", () => {
    const config = SweConfig.parse({ env: { A: 'config', B: 'config' }, image_template: 'docker://x/{instance_id}' });
    const instance = resolveInstance(
      SweRow.parse({ ...djangoRow, image: undefined, image_template: '/images/{instance_id_1776}.sif', env: { B: 'row', PYTHONPATH: '/testbed' }, binds: [{ host: '/data/wheels', sandbox: '/wheels' }] }),
      config,
    );
    expect(instance.image).toBe('/images/django_1776_django-11099.sif');
    const spec = sandboxSpec(instance, config);
    expect(spec.env).toMatchObject({ A: 'config', B: 'row', PYTHONPATH: '/testbed' });
    expect(spec.binds).toEqual([{ host: '/data/wheels', sandbox: '/wheels', readOnly: true }]);
    expect(instance.testEnv).toMatchObject({ LANG: 'en_US.UTF-8', B: 'row' });
    expect(SweRow.safeParse({ ...djangoRow, env: { 'A;B': 'x' } }).success).toBe(false);
    expect(SweRow.safeParse({ ...djangoRow, binds: [{ host: 'relative', sandbox: '/x' }] }).success).toBe(false);
    expect(SweRow.safeParse({ ...djangoRow, verify_from: 'elsewhere' }).success).toBe(false);
  });
});

describe('the apptainer command lines of a SWE-bench instance', () => {
  it('starts the instance image without network, the workspace bound in, and runs the scripts in the repository', () => {
    const config = SweConfig.parse({ image: 'swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest', resources: { memoryMib: 8192, cpus: 2 } });
    const instance = resolveInstance(SweRow.parse(swebenchRow), config);
    const spec = sandboxSpec(instance, config);
    expect(spec).toEqual({
      image: 'swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest',
      workdir: '/workspace',
      network: false,
      env: { PYTHONDONTWRITEBYTECODE: '1', GIT_CONFIG_COUNT: '1', GIT_CONFIG_KEY_0: 'safe.directory', GIT_CONFIG_VALUE_0: '*' },
      resources: { memoryMib: 8192, cpus: 2 },
    });
    const start = buildInstanceStartArgv({
      binary: '/opt/apptainer/bin/apptainer',
      image: spec.image!,
      name: 'rollserve-rs-0123456789ab',
      workspaceHost: '/tmp/rollserve-rs-0123456789ab/workspace',
      workdir: spec.workdir!,
      socketHost: '/tmp/rollserve-rs-0123456789ab/sock',
      network: spec.network!,
      resources: spec.resources!,
      applyResourceLimits: true,
    });
    expect(start).toEqual([
      '/opt/apptainer/bin/apptainer', 'instance', 'start', '--containall', '--writable-tmpfs', '--no-home',
      '--net', '--network', 'none',
      '--bind', '/tmp/rollserve-rs-0123456789ab/workspace:/workspace',
      '--bind', '/tmp/rollserve-rs-0123456789ab/sock:/run/rollserve',
      '--cpus', '2', '--memory', '8192M',
      'docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest', 'rollserve-rs-0123456789ab',
    ]);
    const exec = buildExecArgv({
      binary: '/opt/apptainer/bin/apptainer',
      name: 'rollserve-rs-0123456789ab',
      envFile: '/tmp/rollserve-rs-0123456789ab/env/1.env',
      command: [...limitWrapper(spec.resources), '/bin/sh', '-c', `cd '${instance.repoDir}' || exit 1\n${freshRepoScript()}`],
    });
    expect(exec.slice(0, 5)).toEqual(['/opt/apptainer/bin/apptainer', 'exec', '--env-file', '/tmp/rollserve-rs-0123456789ab/env/1.env', 'instance://rollserve-rs-0123456789ab']);
    expect(exec.at(-1)).toBe(`cd '/testbed' || exit 1\n${freshRepoScript()}`);
  });
});
