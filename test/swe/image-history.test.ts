import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, cpSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import swe from '@rollserve/env-swe';
import { bwrapAvailable, createBwrapProvider, registerSandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse, missingCommands, startFakePolicy, workspaceRoot } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildSweFixtures, type SweFixture } from './fixtures.ts';
import { buildSweImages, sweImageName, type SweImages } from './image-fixtures.ts';

// Images as SWE-bench and SWE-Gym ship them: /testbed is a clone with its whole history (the fix
// commit after base_commit in its objects and reflog) reset to base, and the repository's env is
// a conda env (/opt/miniconda3/envs/testbed) off the image's PATH. A row naming a SWE-bench repo
// runs the harness's eval semantics: the test files reset to base, test_patch applied, the spec's
// command (`pytest -rA`, found only in the activated env). Removing the image's /testbed/.git
// (a directory of the read-only lower layer) needs the overlay's `userxattr`
// (packages/core/src/sandbox/image/overlay.ts); before it, seed_session answered 500 with
// "rm: cannot remove '.git/objects/..': Input/output error". Run through the NeMo Gym face as a
// root service (in process: the idmapped lower layer, dropped to 65534) and as an unprivileged one
// (`rollserve start` under setpriv as uid 65534: the unprivileged overlay setup).

const missing = missingCommands(['umoci', 'unsquashfs', 'mksquashfs', 'ldd', 'git', 'patch', 'setpriv']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : missing.length > 0 ? `missing ${missing.join(', ')}` : undefined;
const isRoot = process.getuid?.() === 0;

type Verify = Record<string, unknown> & { reward: number };

const PROVIDER = 'swe-image-history';
let dirs: { imageCacheDir: string; tmpDir: string } | undefined;
registerSandboxProvider(PROVIDER, () => createBwrapProvider({ ...dirs }));

/** What the agent checks first: the image's .git is there, with one commit and no future; no pytest on its PATH. */
const HISTORY_PROBE = (future: string): string =>
  [
    'test -d .git && echo has-git',
    'git log --all --oneline | wc -l',
    `git cat-file -e ${future} 2>/dev/null && echo future-leaked || echo no-future`,
    'git reflog | wc -l', // the fresh repository's one commit: the image's reflog (the fix) is gone
    'command -v pytest || echo no-pytest-on-path',
  ].join('; ');

/** The harness's flow on one face: gold (with the agent's edits to a test file) 1, empty 0, wrong 0. */
async function harnessFlow(url: string, row: Record<string, unknown>, calc: SweFixture): Promise<void> {
  async function rollout(calls: Array<[tool: string, args: Record<string, unknown>]>): Promise<{ verify: Verify; outputs: string[] }> {
    const seed = await call(url, 'POST', '/seed_session', row);
    expect(seed.status, seed.text).toBe(200);
    const cookie = cookieHeader(seed.setCookies);
    const outputs: string[] = [];
    for (const [tool, args] of calls) {
      const answer = await call(url, 'POST', `/${tool}`, args, { cookie });
      expect(answer.status, answer.text).toBe(200);
      outputs.push(typeof answer.json === 'string' ? answer.json : answer.text);
    }
    const verify = await call(url, 'POST', '/verify', { ...row, response: makeResponse([]) }, { cookie });
    expect(verify.status, verify.text).toBe(200);
    return { verify: verify.json as Verify, outputs };
  }
  const applyPatch = (patch: string): Array<[string, Record<string, unknown>]> => [
    ['str_replace_editor', { command: 'create', path: '/tmp/agent.patch', file_text: patch }],
    ['bash', { command: 'git apply /tmp/agent.patch' }],
  ];
  const testFile = 'tests/test_stats.py';

  // gold, plus an edit of a test file that the harness resets before test_patch
  const gold = await rollout([
    ['bash', { command: HISTORY_PROBE(calc.futureCommit) }],
    ...applyPatch(calc.goldPatch),
    ['bash', { command: `printf '\\ndef test_agent_vandal():\\n    assert False\\n' >> ${testFile}; git status --short; git diff --name-only` }],
    ['submit', {}],
  ]);
  expect(gold.outputs[0]!.trim().split('\n')).toEqual(['has-git', '1', 'no-future', '1', 'no-pytest-on-path']);
  // the agent's git diff shows its own changes and nothing of the image's
  expect(gold.outputs[3]!.trimEnd().split('\n')).toEqual([` M ${calc.goldEdit.path}`, ` M ${testFile}`, calc.goldEdit.path, testFile]);
  expect(gold.verify.failure_reason, String(gold.verify.test_output)).toBeNull();
  expect(gold.verify).toMatchObject({
    reward: 1,
    resolved: true,
    patch_applied_with: 'git apply',
    // SWE-bench's spec command, run in the activated conda env (the only pytest in the image)
    test_command: `pytest -rA '${testFile}'`,
    f2p_passed: calc.failToPass.length,
    p2p_passed: calc.passToPass.length,
  });
  expect(String(gold.verify.model_patch).match(/^diff --git .*$/gm)).toEqual([`diff --git a/${calc.goldEdit.path} b/${calc.goldEdit.path}`, `diff --git a/${testFile} b/${testFile}`]);
  expect(gold.verify.test_output).not.toMatch(/test_agent_vandal/);

  const empty = await rollout([['bash', { command: 'git status --short | wc -l' }]]);
  expect(empty.outputs[0]!.trim()).toBe('0');
  expect(empty.verify).toMatchObject({ reward: 0, model_patch: '', failure_reason: 'empty_patch' });

  const wrong = await rollout(applyPatch(calc.breakingPatch));
  expect(wrong.verify).toMatchObject({ reward: 0, evaluation_completed: true, failure_reason: 'tests_failed', test_command: `pytest -rA '${testFile}'` });
}

describe.skipIf(skip !== undefined)('SWE-bench images with /testbed/.git and a conda env (bwrap)', () => {
  let built: ReturnType<typeof buildSweFixtures>;
  let calc: SweFixture;
  let images: SweImages;
  /** The calc row on the image only (no repo_path), as SWE-bench's pytest repository. */
  let harnessRow: (image: string) => Record<string, unknown>;

  beforeAll(() => {
    built = buildSweFixtures();
    calc = built.fixtures[0]!;
    images = buildSweImages(calc);
    dirs = { imageCacheDir: join(images.dir, 'cache'), tmpDir: join(images.dir, 'sandboxes') };
    mkdirSync(dirs.tmpDir);
    chmodSync(dirs.tmpDir, 0o755);
    harnessRow = (image) => {
      const { repo_path: _hostRepo, ...row } = calc.row;
      return { ...row, repo: 'pytest-dev/pytest', version: '8.0', image };
    };
  }, 300_000);

  afterAll(() => {
    const left = dirs === undefined ? [] : readdirSync(dirs.tmpDir);
    images?.close();
    built?.close();
    dirs = undefined;
    expect(left).toEqual([]);
  });

  it.each([
    { kind: 'OCI layout', image: () => `oci:${images.ociLayout}:${sweImageName(String(calc.row.instance_id))}` },
    { kind: 'squashfs', image: () => `squashfs:${images.squashfs}` },
  ])(`as the test's user (${isRoot ? 'root' : 'unprivileged'}), $kind: the harness's flow, gold 1, empty 0, wrong 0`, async ({ image }) => {
    const app = createResourcesServer(swe, { config: { sandbox_provider: PROVIDER, images_root: images.dir } });
    const running = await serveFetch(app);
    try {
      await harnessFlow(running.url, harnessRow(image()), calc);
    } finally {
      await running.close();
      await app.close();
    }
  }, 120_000);

  it.skipIf(!isRoot)('as an unprivileged service (rollserve start as uid 65534): the same flow on the OCI image', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollserve-swe-history-'));
    chmodSync(dir, 0o755);
    mkdirSync(join(dir, 'images'));
    cpSync(images.ociLayout, join(dir, 'images', basename(images.ociLayout)), { recursive: true });
    execFileSync('chown', ['-R', '65534:65534', dir]);
    const fake = await startFakePolicy({ script: () => 'Nothing to do.' });
    const argv = [process.execPath, join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js'), 'start', '--port', '0', '--llm', fake.url, '--store', `sqlite://${join(dir, 'store.db')}`, '--journal', join(dir, 'journal.jsonl')];
    const child = spawn('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', ...argv], {
      cwd: dir,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent', ROLLSERVE_DATA_DIR: dir, ROLLSERVE_IMAGE_CACHE: join(dir, 'image-cache') },
    });
    let output = '';
    child.stdout.on('data', (c: Buffer) => (output += c));
    child.stderr.on('data', (c: Buffer) => (output += c));
    try {
      const url = await sweUrl(child, () => output);
      await harnessFlow(url, harnessRow(`oci:${join(dir, 'images', basename(images.ociLayout))}:${sweImageName(String(calc.row.instance_id))}`), calc);
    } finally {
      await stop(child);
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);
});

async function sweUrl(child: ChildProcess, output: () => string): Promise<string> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const found = /^swe\s+(http:\/\/127\.0\.0\.1:\d+)/m.exec(output());
    if (found !== null) return found[1]!;
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`rollserve start did not serve swe: ${output()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  child.kill('SIGINT');
  await once(child, 'exit');
}
