import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RolloutError } from '@rollserve/core';
import { buildExecArgv, buildInstanceStartArgv, limitWrapper, resolveSandboxSpec } from '@rollserve/core/sandbox';
import { afterAll, describe, expect, it } from 'vitest';
import { instanceTestCommand, resolveInstance, sandboxSpec } from './instance.ts';
import { SweConfig, SweRow } from './schema.ts';
import { freshRepoScript } from './scripts.ts';

// The operator's roots, made here: rows may name only what lies in them.
const base = mkdtempSync(join(tmpdir(), 'rollserve-swe-roots-'));
afterAll(() => rmSync(base, { recursive: true, force: true }));
const images = join(base, 'images');
const repos = join(base, 'repos');
const binds = join(base, 'binds');
for (const dir of [images, join(repos, 'astropy'), join(binds, 'wheels')]) mkdirSync(dir, { recursive: true });
for (const file of ['django.sif', 'x.sif', 'django_1776_django-11099.sif']) writeFileSync(join(images, file), 'SIF');
const rooted = (config: Record<string, unknown> = {}) => SweConfig.parse({ repos_root: repos, images_root: images, binds_root: binds, ...config });

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
    const config = rooted();
    const image = resolveInstance(SweRow.parse({ ...swebenchRow, image: 'docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest' }), config);
    expect(image).toMatchObject({ repoDir: '/testbed', workdir: '/workspace', parserName: 'pytest_v2', testCommand: 'pytest -rA', testCommandFrom: 'swe-bench', testTargets: ['x'] });
    const unknownRepo = resolveInstance(SweRow.parse({ ...swebenchRow, repo: 'someone/else', image: 'x.sif' }), config);
    expect(unknownRepo.image).toBe(join(images, 'x.sif'));
    expect(unknownRepo).toMatchObject({ parserName: 'pytest', testCommand: 'python3 -m pytest -rA {tests}', testCommandFrom: 'default' });
    expect(image.repoPath).toBeUndefined();
    const local = resolveInstance(SweRow.parse({ ...swebenchRow, repo_path: join(repos, 'astropy'), setup_script: 'pip install -e .' }), config);
    expect(local).toMatchObject({ repoDir: '/workspace', repoPath: join(repos, 'astropy'), setupScript: 'pip install -e .' });
    expect(image.image).toBe('docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest');
  });

  it("names SWE-bench images from the instance id and puts the config's env in the sandbox", () => {
    const config = rooted({ image_template: 'docker://swebench/sweb.eval.x86_64.{instance_id_1776}:latest', env: { PATH: '/opt/miniconda3/envs/testbed/bin:/usr/bin:/bin' } });
    const instance = resolveInstance(SweRow.parse(swebenchRow), config);
    expect(instance.image).toBe('docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest');
    expect(resolveInstance(SweRow.parse({ ...swebenchRow, image: `${images}/x.sif` }), config).image).toBe(`${images}/x.sif`);
    expect(sandboxSpec(instance, config).env).toMatchObject({ PYTHONDONTWRITEBYTECODE: '1', GIT_CONFIG_VALUE_0: '*', PATH: '/opt/miniconda3/envs/testbed/bin:/usr/bin:/bin' });
    expect(SweConfig.safeParse({ env: { 'A;B': 'x' } }).success).toBe(false);
  });

  it('refuses rows without a repository, with an unknown parser or an option as commit', () => {
    const config = rooted();
    const unknownParser = SweRow.safeParse({ ...swebenchRow, repo_path: 'astropy', test_parser: 'nope' });
    expect(unknownParser.success).toBe(false);
    expect(unknownParser.error?.issues[0]).toMatchObject({ path: ['test_parser'], message: expect.stringMatching(/^unknown test_parser "nope" \(known: pytest, .*sympy/) });
    expect(SweConfig.safeParse({ test_parser: 'nope' }).success).toBe(false);
    expect(failure(() => resolveInstance(SweRow.parse(swebenchRow), config))).toMatchObject({ message: expect.stringMatching(/repo_path .* or an image/) });
    expect(failure(() => resolveInstance(SweRow.parse({ ...swebenchRow, repo_path: 'astropy', base_commit: '--output=/tmp/x' }), config))).toMatchObject({ loc: ['body', 'base_commit'] });
    expect(resolveInstance(SweRow.parse({ ...swebenchRow, repo_path: 'astropy' }), config).repoPath).toBe(join(repos, 'astropy'));
  });
});

/** The 422 a call throws: its message and the field it names (FastAPI's `loc`). */
function failure(fn: () => unknown): { message: string; loc: unknown } | undefined {
  try {
    fn();
  } catch (error) {
    expect(RolloutError.isInstance(error) && error.code === 'UNPROCESSABLE', String(error)).toBe(true); // a 422 on both faces
    const e = error as RolloutError;
    return { message: e.message, loc: (e.details as Array<{ loc: unknown }>)[0]?.loc };
  }
  return undefined;
}

describe('a row names host paths only under the roots the operator configured', () => {
  const config = rooted();
  const row = (fields: Record<string, unknown>) => SweRow.parse({ ...swebenchRow, repo_path: 'astropy', ...fields });
  const refused = (fields: Record<string, unknown>, loc: unknown[], pattern: RegExp, cfg = config) => {
    const got = failure(() => resolveInstance(row(fields), cfg));
    expect(got, JSON.stringify(fields)).toBeDefined();
    expect(got!.loc, JSON.stringify(fields)).toEqual(['body', ...loc]);
    expect(got!.message).toMatch(pattern);
  };

  it('repo_path: under repos_root after symlinks and "..", an existing directory', () => {
    symlinkSync('/etc', join(repos, 'etc-link'));
    symlinkSync(join(repos, 'astropy'), join(repos, 'inner-link'));
    refused({ repo_path: '/etc' }, ['repo_path'], /outside repos_root/);
    refused({ repo_path: '../binds/wheels' }, ['repo_path'], /outside repos_root/);
    refused({ repo_path: `${repos}/../images` }, ['repo_path'], /outside repos_root/);
    refused({ repo_path: 'etc-link' }, ['repo_path'], /outside repos_root.*resolves to \/etc/);
    refused({ repo_path: 'missing' }, ['repo_path'], /does not exist/);
    refused({ repo_path: '/' }, ['repo_path'], /outside repos_root/);
    writeFileSync(join(repos, 'file'), 'x');
    refused({ repo_path: 'file' }, ['repo_path'], /not a directory/);
    // a symlink that stays inside is followed: the real path is what is used
    expect(resolveInstance(row({ repo_path: 'inner-link' }), config).repoPath).toBe(join(repos, 'astropy'));
    // a root that does not exist admits nothing (the default, <data dir>/repos, until made)
    refused({}, ['repo_path'], /repos_root .* does not exist/, rooted({ repos_root: join(base, 'no-such-root') }));
  });

  it('image and image_template: under images_root (registry references name no host path); the instance id in a template is a name', () => {
    refused({ image: '/' }, ['image'], /outside images_root/);
    refused({ image: '/etc/passwd' }, ['image'], /outside images_root/);
    refused({ image: `oci:${base}/repos:latest` }, ['image'], /outside images_root/);
    refused({ image: 'sif:../repos/file' }, ['image'], /outside images_root/);
    refused({ image: 'docker-daemon:alpine:latest' }, ['image'], /unknown image transport/);
    refused({ image: 'containers-storage:[overlay@/var/lib/containers]alpine' }, ['image'], /unknown image transport/);
    refused({ image: './../repos/file.sif' }, ['image'], /outside images_root/);
    // a bare registry name is a registry reference, never a path of the service's working directory
    expect(resolveInstance(row({ image: 'swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest' }), config).image).toBe('docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest');
    expect(resolveInstance(row({ image: 'etc' }), config).image).toBe('docker://etc');
    expect(resolveInstance(row({ image: 'docker-daemon:alpine' }), config).image).toBe('docker://docker-daemon:alpine');
    // unless it names what is under images_root
    expect(resolveInstance(row({ image: 'django.sif' }), config).image).toBe(join(images, 'django.sif'));
    refused({ image_template: '/etc/{instance_id}' }, ['image_template'], /outside images_root/);
    expect(resolveInstance(row({ image: 'sif:django.sif' }), config).image).toBe(`sif:${images}/django.sif`);
    refused({ image: 'oci:django.sif:v1' }, ['image'], /not a directory/);
    expect(resolveInstance(row({ image: 'docker://swebench/x:latest' }), config).image).toBe('docker://swebench/x:latest');
    expect(resolveInstance(row({ image_template: '{instance_id}.sif', instance_id: 'x' }), config).image).toBe(`${images}/x.sif`);
    // the operator's template may name anything, but a row's instance id cannot walk out of it
    const templated = rooted({ image_template: `sif:${images}/{instance_id}.sif` });
    refused({ instance_id: '../../etc/passwd' }, ['instance_id'], /cannot name an image/, templated);
    refused({ instance_id: 'a:b' }, ['instance_id'], /cannot name an image/, templated);
    expect(resolveInstance(row({ instance_id: 'x' }), templated).image).toBe(`sif:${images}/x.sif`);
  });

  it('binds: under binds_root, a directory or regular file (no socket, device or fifo), read-only unless the operator allows writable ones, never over /proc, /dev, /sys or /run', async () => {
    const socketPath = join(binds, 'service.sock');
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    try {
      symlinkSync('/var/tmp', join(binds, 'var-tmp'));
      symlinkSync('/dev/null', join(binds, 'null'));
      const bind = (b: Record<string, unknown>) => ({ binds: [{ sandbox: '/data', ...b }] });
      refused(bind({ host: '/etc' }), ['binds', 0, 'host'], /outside binds_root/);
      refused(bind({ host: '/var/tmp' }), ['binds', 0, 'host'], /outside binds_root/);
      refused(bind({ host: `${binds}/var-tmp` }), ['binds', 0, 'host'], /resolves to \/var\/tmp/);
      refused(bind({ host: `${binds}/null` }), ['binds', 0, 'host'], /outside binds_root/);
      refused(bind({ host: socketPath }), ['binds', 0, 'host'], /neither a directory nor a regular file/);
      refused(bind({ host: `${binds}/wheels`, read_only: false }), ['binds', 0, 'read_only'], /read-only unless the config sets row_writable_binds/);
      refused(bind({ host: `${binds}/wheels`, sandbox: '/proc/1' }), ['binds', 0, 'sandbox'], /may not cover/);
      refused(bind({ host: `${binds}/wheels`, sandbox: '/' }), ['binds', 0, 'sandbox'], /may not cover/);
      refused(bind({ host: `${binds}/wheels`, sandbox: '/run/rollserve-in' }), ['binds', 0, 'sandbox'], /may not cover/);
      const writable = resolveInstance(row(bind({ host: `${binds}/wheels`, read_only: false })), rooted({ row_writable_binds: true }));
      expect(writable.binds).toEqual([{ host: `${binds}/wheels`, sandbox: '/data', readOnly: false }]);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('checks again at use: a directory swapped for a symlink since the row was accepted is refused', () => {
    mkdirSync(join(binds, 'swapped'));
    const instance = resolveInstance(row({ binds: [{ host: `${binds}/swapped`, sandbox: '/data' }] }), config);
    expect(sandboxSpec(instance, config).binds).toEqual([{ host: join(binds, 'swapped'), sandbox: '/data', readOnly: true }]);
    rmSync(join(binds, 'swapped'), { recursive: true });
    symlinkSync('/etc', join(binds, 'swapped'));
    const got = failure(() => sandboxSpec(instance, config));
    expect(got).toMatchObject({ loc: ['body', 'binds', 0, 'host'] });
  });
});

describe("SWE-bench's specs, overrides, env and binds", () => {
  const djangoRow = {
    repo: 'django/django',
    instance_id: 'django__django-11099',
    base_commit: 'd26b2424437dabeeca94d7900b37d2df4410da0c',
    version: '3.0',
    image: 'django.sif',
    test_patch: 'diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n--- a/tests/auth_tests/test_validators.py\n+++ b/tests/auth_tests/test_validators.py\n',
    FAIL_TO_PASS: '["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]',
    PASS_TO_PASS: '[]',
  };

  it("django runs runtests.py on the test_patch's modules with SWE-bench's locale; row and config override", () => {
    const config = rooted();
    const instance = resolveInstance(SweRow.parse(djangoRow), config);
    expect(instance).toMatchObject({ parserName: 'django', testTargets: ['auth_tests.test_validators'] });
    expect(instanceTestCommand(instance)).toBe("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 'auth_tests.test_validators'");
    expect(instance.testEnv).toMatchObject({ LANG: 'en_US.UTF-8', LC_ALL: 'en_US.UTF-8' });
    const row = resolveInstance(SweRow.parse({ ...djangoRow, test_command: 'python -m pytest -rA {tests}', test_parser: 'pytest' }), config);
    expect(row).toMatchObject({ parserName: 'pytest', testCommandFrom: 'row', testTargets: ['tests/auth_tests/test_validators.py'] });
    const configured = resolveInstance(SweRow.parse(djangoRow), rooted({ test_command: 'make test', test_parser: 'unittest' }));
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
      rooted(),
    );
    expect(instanceTestCommand(instance)).toBe("PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose 'sympy/core/tests/test_basic.py'");
    expect(instance.parserName).toBe('sympy');
  });

  it("puts the row's env (over the config's) and binds in the sandbox spec, and its image_template", () => {
    const config = rooted({ env: { A: 'config', B: 'config' }, image_template: 'docker://x/{instance_id}' });
    const instance = resolveInstance(
      SweRow.parse({ ...djangoRow, image: undefined, image_template: `${images}/{instance_id_1776}.sif`, env: { B: 'row', PYTHONPATH: '/testbed' }, binds: [{ host: `${binds}/wheels`, sandbox: '/wheels' }] }),
      config,
    );
    expect(instance.image).toBe(`${images}/django_1776_django-11099.sif`);
    const spec = sandboxSpec(instance, config);
    expect(spec.env).toMatchObject({ A: 'config', B: 'row', PYTHONPATH: '/testbed' });
    expect(spec.binds).toEqual([{ host: `${binds}/wheels`, sandbox: '/wheels', readOnly: true }]);
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
      resources: resolveSandboxSpec(spec).resources,
      applyResourceLimits: true,
    });
    expect(start).toEqual([
      '/opt/apptainer/bin/apptainer', 'instance', 'start', '--containall', '--writable-tmpfs', '--no-home',
      '--net', '--network', 'none',
      '--bind', '/tmp/rollserve-rs-0123456789ab/workspace:/workspace',
      '--bind', '/tmp/rollserve-rs-0123456789ab/sock:/run/rollserve',
      // the instance's cgroup keeps the whole-instance limits (defaults where the config gave none);
      // the per-process memoryMib is an rlimit (limitWrapper), not the container's memory
      '--memory', '4096M', '--memory-swap', '4096M', '--pids-limit', '576', '--cpus', '2',
      'docker://swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest', 'rollserve-rs-0123456789ab',
    ]);
    const exec = buildExecArgv({
      binary: '/opt/apptainer/bin/apptainer',
      name: 'rollserve-rs-0123456789ab',
      envFile: '/tmp/rollserve-rs-0123456789ab/env/1.env',
      command: [...limitWrapper(resolveSandboxSpec(spec).resources), '/bin/sh', '-c', `cd '${instance.repoDir}' || exit 1\n${freshRepoScript()}`],
    });
    expect(exec.slice(0, 5)).toEqual(['/opt/apptainer/bin/apptainer', 'exec', '--env-file', '/tmp/rollserve-rs-0123456789ab/env/1.env', 'instance://rollserve-rs-0123456789ab']);
    expect(exec.at(-1)).toBe(`cd '/testbed' || exit 1\n${freshRepoScript()}`);
  });
});
