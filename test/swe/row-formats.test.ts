import { execFileSync } from 'node:child_process';
import { chmodSync, cpSync, linkSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import swe from '@rollserve/env-swe';
import { bwrapAvailable, createBwrapProvider, registerSandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse, missingCommands } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildSweFixtures, type SweFixture } from './fixtures.ts';
import { buildSweImages, type SweImages } from './image-fixtures.ts';

// Rows as each dataset ships them, through the NeMo Gym face (seed_session → tools → verify) on
// bwrap, with no field renamed: SWE-bench Verified's (FAIL_TO_PASS / PASS_TO_PASS as JSON
// strings, version, environment_setup_commit, difficulty), NeMo Gym's own swebench rows (those plus
// responses_create_params, subset, split), SWE-Gym's (lists; its repositories' commands; its
// `_s_` image names), SWE-smith's (image_name, no test_patch nor version, `patch` the bug, base_commit
// the bug's commit on a branch of the image's repository, or missing from it) and SWE-bench
// Multilingual's (lists, no environment_setup_commit; the spec's build and test commands run as
// they are, read by its parser). The images are the tests' own (test/swe/image-fixtures.ts), named
// under images_root as the datasets name them; the Multilingual row runs on a host repository
// (repo_path) because its `make check` needs make, which the test image does not carry.

const missing = missingCommands(['umoci', 'mksquashfs', 'ldd', 'git', 'patch', 'make']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : missing.length > 0 ? `missing ${missing.join(', ')}` : undefined;

type Verify = Record<string, unknown> & { reward: number };

const PROVIDER = 'swe-row-formats';
let dirs: { imageCacheDir: string; tmpDir: string } | undefined;
registerSandboxProvider(PROVIDER, () => createBwrapProvider({ ...dirs }));

const git = (cwd: string, ...args: string[]): string =>
  execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', '-c', 'commit.gpgsign=false', ...args], { cwd, encoding: 'utf8', env: { ...process.env, GIT_CONFIG_NOSYSTEM: '1' } });

/** One rollout: seed, the agent's bash commands, verify. */
async function rollout(url: string, row: Record<string, unknown>, commands: string[]): Promise<{ verify: Verify; outputs: string[] }> {
  const seed = await call(url, 'POST', '/seed_session', row);
  expect(seed.status, seed.text).toBe(200);
  const cookie = cookieHeader(seed.setCookies);
  const outputs: string[] = [];
  for (const command of commands) {
    const answer = await call(url, 'POST', '/bash', { command }, { cookie });
    expect(answer.status, answer.text).toBe(200);
    outputs.push(typeof answer.json === 'string' ? answer.json : answer.text);
  }
  // NeMo Gym's agent sends the row with responses_create_params (every verify request has them)
  const verify = await call(url, 'POST', '/verify', { responses_create_params: { input: [] }, ...row, response: makeResponse([]) }, { cookie });
  expect(verify.status, verify.text).toBe(200);
  return { verify: verify.json as Verify, outputs };
}

/** The agent applies `patch` (given in the command, as a heredoc) with git apply, `reverse` for a bug patch. */
const applyCommand = (patch: string, reverse = false): string => `git apply${reverse ? ' -R' : ''} <<'ROLLSERVE_EOF'\n${patch}ROLLSERVE_EOF`;

/** A jq-shaped C repository: automake's `make check` prints `PASS: tests/x` / `FAIL: tests/x`. */
function buildJqRepo(root: string): { dir: string; row: Record<string, unknown>; goldPatch: string } {
  const dir = join(root, 'jq');
  mkdirSync(join(dir, 'tests'), { recursive: true });
  mkdirSync(join(dir, 'src'));
  const write = (files: Record<string, string>): void => {
    for (const [path, text] of Object.entries(files)) writeFileSync(join(dir, path), text);
  };
  write({
    Makefile: 'all:\n\t@echo built\nclean:\n\t@:\ncheck:\n\t@for t in tests/jqtest tests/shtest; do if sh $$t >/dev/null 2>&1; then echo "PASS: $$t"; else echo "FAIL: $$t"; fi; done\n',
    'src/add.sh': 'echo $(($1 - $2))\n',
    'tests/jqtest': 'exit 0\n',
    'tests/shtest': 'test "$(sh src/add.sh 2 0)" = 2\n',
  });
  git(dir, 'init', '-q', '-b', 'master');
  git(dir, 'add', '-A');
  git(dir, 'commit', '-q', '-m', 'base');
  const base = git(dir, 'rev-parse', 'HEAD').trim();
  write({ 'src/add.sh': 'echo $(($1 + $2))\n', 'tests/jqtest': 'test "$(sh src/add.sh 2 3)" = 5\n' });
  const goldPatch = git(dir, 'diff', '--', 'src');
  const testPatch = git(dir, 'diff', '--', 'tests');
  git(dir, 'checkout', '-q', '--', '.');
  chmodSync(root, 0o755);
  execFileSync('chmod', ['-R', 'a+rX', dir]);
  // as SWE-bench/SWE-bench_Multilingual ships a row (no environment_setup_commit), plus repo_path
  const row = {
    repo: 'jqlang/jq',
    instance_id: 'jqlang__jq-2839',
    base_commit: base,
    patch: goldPatch,
    test_patch: testPatch,
    problem_statement: 'add subtracts',
    hints_text: '',
    created_at: '2023-08-01T00:00:00Z',
    version: '2839',
    FAIL_TO_PASS: ['tests/jqtest'],
    PASS_TO_PASS: ['tests/shtest'],
    repo_path: dir,
  };
  return { dir, row, goldPatch };
}

describe.skipIf(skip !== undefined)('rows as SWE-bench Verified, NeMo Gym, SWE-Gym, SWE-smith and Multilingual ship them (bwrap, NeMo Gym face)', () => {
  let built: ReturnType<typeof buildSweFixtures>;
  let calc: SweFixture;
  let images: SweImages;
  let smithImages: SweImages;
  let imagesRoot: string;
  let reposRoot: string;
  let jq: ReturnType<typeof buildJqRepo>;
  /** SWE-smith's bug: the gold fix undone, its branch commit on the image's repository. */
  let bugPatch: string;
  let bugCommit: string;
  const servers: Array<{ app: ResourcesServer; running: RunningServer }> = [];
  const serve = async (config: Record<string, unknown>): Promise<string> => {
    const app = createResourcesServer(swe, { config: { sandbox_provider: PROVIDER, images_root: imagesRoot, repos_root: reposRoot, ...config } });
    const running = await serveFetch(app);
    servers.push({ app, running });
    return running.url;
  };
  let sweBenchUrl: string;
  let sweGymUrl: string;
  let plainUrl: string;

  /** The calc row as a dataset's: no repo_path, JSON-string test lists as SWE-bench keeps them. */
  const sweBenchRow = (): Record<string, unknown> => {
    const { repo_path: _host, responses_create_params: _params, ...row } = calc.row;
    return row;
  };

  beforeAll(async () => {
    built = buildSweFixtures();
    calc = built.fixtures[0]!;
    // SWE-smith's way: a branch named after the instance, the bug patch committed on the clean tree
    bugPatch = git(calc.repoPath, 'diff', calc.futureCommit, calc.baseCommit, '--', calc.goldEdit.path);
    git(calc.repoPath, 'checkout', '-q', '-b', 'fixtures__calc.1a2b3c4d.lm_modify__x1', calc.futureCommit);
    execFileSync('git', ['apply'], { cwd: calc.repoPath, input: bugPatch });
    git(calc.repoPath, 'commit', '-q', '-am', 'Bug Patch');
    bugCommit = git(calc.repoPath, 'rev-parse', 'HEAD').trim();
    git(calc.repoPath, 'checkout', '-q', 'main');

    images = buildSweImages(calc);
    // SWE-smith's image: the repository at its clean commit (the fix), the bug on a branch
    smithImages = buildSweImages({ ...calc, baseCommit: calc.futureCommit });
    imagesRoot = mkdtempSync(join(tmpdir(), 'rollserve-swe-formats-'));
    chmodSync(imagesRoot, 0o755);
    // named as each dataset names its images (the config's templates, SWE-smith's image_name)
    linkSync(images.squashfs, join(imagesRoot, 'sweb.eval.x86_64.fixtures_1776_calc-1.sqfs'));
    linkSync(images.squashfs, join(imagesRoot, 'sweb.eval.x86_64.fixtures_s_calc-1.sqfs'));
    cpSync(smithImages.ociLayout, join(imagesRoot, 'swesmith.x86_64.fixtures__calc.1a2b3c4d'), { recursive: true });
    reposRoot = mkdtempSync(join(tmpdir(), 'rollserve-swe-formats-repos-'));
    jq = buildJqRepo(reposRoot);
    dirs = { imageCacheDir: join(imagesRoot, 'cache'), tmpDir: join(imagesRoot, 'sandboxes') };
    mkdirSync(dirs.tmpDir);
    chmodSync(dirs.tmpDir, 0o755);
    sweBenchUrl = await serve({ image_template: `squashfs:${imagesRoot}/sweb.eval.x86_64.{instance_id_1776}.sqfs` });
    sweGymUrl = await serve({ image_template: `squashfs:${imagesRoot}/sweb.eval.x86_64.{instance_id_s}.sqfs` });
    plainUrl = await serve({});
  }, 600_000);

  afterAll(async () => {
    for (const { app, running } of servers) {
      await running.close();
      await app.close();
    }
    const left = dirs === undefined ? [] : readdirSync(dirs.tmpDir);
    images?.close();
    smithImages?.close();
    built?.close();
    if (imagesRoot !== undefined) rmSync(imagesRoot, { recursive: true, force: true });
    if (reposRoot !== undefined) rmSync(reposRoot, { recursive: true, force: true });
    dirs = undefined;
    expect(left).toEqual([]);
  });

  it("SWE-bench Verified's row (JSON-string lists, version, difficulty): its image by {instance_id_1776}, its spec's command; gold 1, empty 0", async () => {
    const row: Record<string, unknown> = { ...sweBenchRow(), repo: 'pytest-dev/pytest', version: '8.0', difficulty: '<15 min fix' };
    expect(typeof row.FAIL_TO_PASS).toBe('string');
    const gold = await rollout(sweBenchUrl, row, [applyCommand(calc.goldPatch)]);
    expect(gold.verify, String(gold.verify.test_output)).toMatchObject({ reward: 1, resolved: true, test_command: "pytest -rA 'tests/test_stats.py'", f2p_passed: calc.failToPass.length });
    const empty = await rollout(sweBenchUrl, row, []);
    expect(empty.verify).toMatchObject({ reward: 0, failure_reason: 'empty_patch' });
  }, 120_000);

  it("NeMo Gym's own swebench row, unchanged (responses_create_params, subset, split, ...): gold 1", async () => {
    const row = {
      ...sweBenchRow(),
      repo: 'pallets/flask',
      version: '2.3',
      difficulty: '15 min - 1 hour',
      responses_create_params: { input: [{ role: 'user', content: calc.row.problem_statement }] },
      subset: 'verified',
      split: 'test',
    };
    const gold = await rollout(sweBenchUrl, row, [applyCommand(calc.goldPatch)]);
    expect(gold.verify, String(gold.verify.test_output)).toMatchObject({ reward: 1, resolved: true, instance_id: 'fixtures__calc-1', test_command: "pytest -rA 'tests/test_stats.py'" });
  }, 120_000);

  it("SWE-Gym's row (lists, a repository of its own): its image by {instance_id_s}, its command; gold 1, empty 0", async () => {
    const row = { ...sweBenchRow(), repo: 'pandas-dev/pandas', version: '2.2', FAIL_TO_PASS: calc.failToPass, PASS_TO_PASS: calc.passToPass };
    const gold = await rollout(sweGymUrl, row, [applyCommand(calc.goldPatch)]);
    expect(gold.verify, String(gold.verify.test_output)).toMatchObject({ reward: 1, resolved: true, test_command: "pytest -rA --tb=long 'tests/test_stats.py'" });
    const empty = await rollout(sweGymUrl, row, []);
    expect(empty.verify).toMatchObject({ reward: 0, failure_reason: 'empty_patch' });
  }, 120_000);

  it("SWE-smith's row (image_name, the bug as patch): the agent starts at the bug's commit, SWE-smith's command; the fix 1, nothing 0, its golden patch reversed 1", async () => {
    const row = {
      instance_id: 'fixtures__calc.1a2b3c4d.lm_modify__x1',
      repo: 'swesmith/fixtures__calc.1a2b3c4d',
      patch: bugPatch,
      FAIL_TO_PASS: calc.failToPass,
      PASS_TO_PASS: calc.passToPass,
      created_at: '2025-03-21T08:23:31.701599',
      image_name: 'swesmith.x86_64.fixtures__calc.1a2b3c4d',
      base_commit: bugCommit,
      problem_statement: calc.row.problem_statement,
    };
    const files = [...new Set(calc.failToPass.map((id) => id.split('::')[0]!))].map((f) => `'${f}'`).join(' ');
    const fixed = await rollout(sweBenchUrl, row, ['git log --oneline | wc -l; git status --short | wc -l', applyCommand(bugPatch, true)]);
    expect(fixed.outputs[0]!.trim().split('\n')).toEqual(['1', '0']);
    expect(fixed.verify, String(fixed.verify.test_output)).toMatchObject({ reward: 1, resolved: true, test_command: `pytest --disable-warnings --color=no --tb=no --verbose ${files}` });
    const nothing = await rollout(sweBenchUrl, row, []);
    expect(nothing.verify).toMatchObject({ reward: 0, failure_reason: 'empty_patch' });
    // the bug's commit missing from the image (SWE-smith fetches it; no network here): the bug patch applied instead
    const absent = { ...row, base_commit: '5'.repeat(40) };
    const again = await rollout(sweBenchUrl, absent, ['git diff HEAD --stat | wc -l', applyCommand(bugPatch, true)]);
    expect(again.outputs[0]!.trim()).toBe('0');
    expect(again.verify, String(again.verify.test_output)).toMatchObject({ reward: 1, resolved: true });
    const golden = await serve({ is_verifying_golden_patch: true });
    const verified = await rollout(golden, row, []);
    expect(verified.verify, String(verified.verify.test_output)).toMatchObject({ reward: 1, resolved: true, patch_applied_with: 'git apply --reverse' });
  }, 180_000);

  it("SWE-bench Multilingual's row (jq): its build and test commands under set -x, its parser; gold 1, empty 0", async () => {
    const gold = await rollout(plainUrl, jq.row, [applyCommand(jq.goldPatch)]);
    expect(gold.verify, String(gold.verify.test_output)).toMatchObject({ reward: 1, resolved: true, f2p_passed: 1, p2p_passed: 1 });
    expect(gold.verify.test_command).toContain('make check');
    expect(gold.verify.test_output).toContain('PASS: tests/jqtest');
    const empty = await rollout(plainUrl, jq.row, []);
    expect(empty.verify).toMatchObject({ reward: 0, failure_reason: 'empty_patch' });
    const wrong = await rollout(plainUrl, jq.row, ["printf 'echo 0\\n' > src/add.sh"]);
    expect(wrong.verify).toMatchObject({ reward: 0, evaluation_completed: true, failure_reason: 'tests_failed' });
  }, 120_000);

  it("bad rows are FastAPI's 422 naming the field: SWE-smith's image_name outside images_root, a test list that is not one; every Multilingual repository's parser is built in", async () => {
    const smith = { instance_id: 'x__y.1.z', repo: 'swesmith/x__y.1', patch: '', FAIL_TO_PASS: [], PASS_TO_PASS: [], base_commit: bugCommit, problem_statement: '' };
    const cases: Array<[Record<string, unknown>, unknown[]]> = [
      [{ ...smith, image_name: '../outside' }, ['body', 'image_name']],
      [{ ...sweBenchRow(), FAIL_TO_PASS: '{"not": "a list"}' }, ['body', 'FAIL_TO_PASS']],
    ];
    for (const [row, loc] of cases) {
      const answer = await call(sweBenchUrl, 'POST', '/seed_session', row);
      expect(answer.status, answer.text).toBe(422);
      const detail = (answer.json as { detail: Array<Record<string, unknown>> }).detail;
      expect(detail[0], answer.text).toMatchObject({ loc });
    }
    // a row of vue (SWE-bench's vitest parser) seeds, as does the same row with a test_parser of its own
    const vue = await call(plainUrl, 'POST', '/seed_session', { ...jq.row, repo: 'vuejs/core', instance_id: 'vuejs__core-11589', version: '11589' });
    expect(vue.status, vue.text).toBe(200);
    await call(plainUrl, 'POST', '/verify', { responses_create_params: { input: [] }, ...jq.row, response: makeResponse([]) }, { cookie: cookieHeader(vue.setCookies) });
    const named = await call(plainUrl, 'POST', '/seed_session', { ...jq.row, repo: 'vuejs/core', instance_id: 'vuejs__core-11589', version: '3.4', test_parser: 'jq' });
    expect(named.status, named.text).toBe(200);
    await call(plainUrl, 'POST', '/verify', { responses_create_params: { input: [] }, ...jq.row, response: makeResponse([]) }, { cookie: cookieHeader(named.setCookies) });
  }, 60_000);
});
