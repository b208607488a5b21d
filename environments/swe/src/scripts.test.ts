import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { APPLIED_MARKER, applyScript, diffScript, freshRepoScript, patchedFiles, restoreScript } from './scripts.ts';

const dirs: string[] = [];
afterEach(() => {
  while (dirs.length) rmSync(dirs.pop()!, { recursive: true, force: true });
});

/** Runs a script with sh in a scratch directory, as the sandbox would (no isolation needed here). */
function sh(cwd: string, script: string, stdin?: string): { code: number; out: string } {
  const result = spawnSync('/bin/sh', ['-c', script], { cwd, input: stdin, encoding: 'utf8', env: { PATH: process.env.PATH, HOME: cwd } });
  return { code: result.status ?? -1, out: `${result.stdout}${result.stderr}` };
}

function scratch(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), 'rollserve-swe-scripts-'));
  dirs.push(dir);
  for (const [path, content] of Object.entries(files)) writeFileSync(join(dir, path), content);
  return dir;
}

const PATCH = `diff --git a/a.txt b/a.txt
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+new
`;

describe('sandbox scripts', () => {
  it('freshRepoScript leaves one commit of the tree and no history; diffScript sees edits and new files but not pyc', () => {
    const dir = scratch({ 'a.txt': 'one\ntwo\nthree\n' });
    execFileSync('git', ['init', '-q'], { cwd: dir });
    execFileSync('git', ['-c', 'user.name=x', '-c', 'user.email=x@x', 'commit', '-q', '--allow-empty', '-m', 'old history'], { cwd: dir });
    const fresh = sh(dir, freshRepoScript());
    expect(fresh.code, fresh.out).toBe(0);
    const sha = fresh.out.trim();
    expect(sha).toMatch(/^[0-9a-f]{40}$/);
    expect(sh(dir, 'git log --all --oneline').out.trim().split('\n')).toEqual([`${sha.slice(0, 7)} Initial commit`]);
    writeFileSync(join(dir, 'a.txt'), 'one\nTWO\nthree\n');
    writeFileSync(join(dir, 'new.txt'), 'new\n');
    execFileSync('mkdir', ['-p', join(dir, '__pycache__')]);
    writeFileSync(join(dir, '__pycache__', 'a.cpython-311.pyc'), 'junk');
    const diff = sh(dir, diffScript(sha));
    expect(diff.code).toBe(0);
    expect(patchedFiles(diff.out)).toEqual(['a.txt', 'new.txt']);
  });

  it("freshRepoScript on a clone reset to base: HEAD's tree is reused (its objects packed, nothing else of the history), the working tree's changes committed", () => {
    const dir = scratch({ 'a.txt': 'one\ntwo\nthree\n', 'b.txt': 'bee\n' });
    const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=x', '-c', 'user.email=x@x', ...args], { cwd: dir, encoding: 'utf8' }).trim();
    git('init', '-q');
    git('add', '-A');
    git('commit', '-q', '-m', 'base');
    const baseTree = git('rev-parse', 'HEAD^{tree}');
    writeFileSync(join(dir, 'a.txt'), 'the future\n');
    git('commit', '-q', '-am', 'future');
    const future = git('rev-parse', 'HEAD');
    const futureBlob = git('rev-parse', 'HEAD:a.txt');
    git('reset', '-q', '--hard', 'HEAD~1');
    // the image's tree at base, plus what a setup script left: an untracked file, a removed one
    writeFileSync(join(dir, 'setup.txt'), 'made by setup\n');
    rmSync(join(dir, 'b.txt'));
    const fresh = sh(dir, freshRepoScript());
    expect(fresh.code, fresh.out).toBe(0);
    const sha = fresh.out.trim();
    expect(git('log', '--all', '--format=%H')).toBe(sha);
    expect(git('ls-tree', '--name-only', 'HEAD').split('\n')).toEqual(['a.txt', 'setup.txt']);
    expect(git('status', '--short', '--untracked-files=all')).toBe('');
    // base's objects came as a pack; the future commit and its blob did not come at all
    expect(git('count-objects', '-v')).toMatch(/^in-pack: [1-9]/m);
    for (const object of [future, futureBlob]) expect(sh(dir, `git cat-file -e ${object}`).code).not.toBe(0);
    expect(sh(dir, `git cat-file -e ${baseTree}`).code).toBe(0);
    expect(readdirSync(dir).filter((name) => name.startsWith('.rollserve-pack'))).toEqual([]);
  });

  it.skipIf(process.getuid?.() !== 0)('works in a repository another user owns (a root-owned /testbed in an image)', () => {
    const dir = scratch({ 'a.txt': 'one\n' });
    chmodSync(dir, 0o777);
    chmodSync(join(dir, 'a.txt'), 0o666);
    const asNobody = (script: string) =>
      spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', '/bin/sh', '-c', script], { cwd: dir, encoding: 'utf8', env: { PATH: process.env.PATH, HOME: '/tmp' } });
    const fresh = asNobody(freshRepoScript());
    expect(fresh.status, fresh.stderr).toBe(0);
    writeFileSync(join(dir, 'a.txt'), 'two\n');
    const diff = asNobody(diffScript(fresh.stdout.trim()));
    expect(diff.status, diff.stderr).toBe(0);
    expect(diff.stdout).toContain('+two');
    // without the safe.directory override git refuses the repository
    expect(asNobody('git status').stderr).toMatch(/dubious ownership/);
  });

  it('applyScript uses git apply, falls back to patch with fuzz, and fails on what neither applies', () => {
    const dir = scratch({ 'a.txt': 'one\ntwo\nthree\n', 'p.diff': PATCH });
    const first = sh(dir, applyScript('p.diff'));
    expect(first.code, first.out).toBe(0);
    expect(first.out.trim().endsWith(`${APPLIED_MARKER}git apply`)).toBe(true);

    // the context drifted (a line added above the hunk and one context line changed): only fuzz helps
    const drifted = scratch({ 'a.txt': 'zero\none\ntwo\nthree!\n', 'p.diff': PATCH.replace(/diff --git a\/new.txt[\s\S]*$/, '') });
    const fuzzy = sh(drifted, applyScript('p.diff'));
    expect(fuzzy.code, fuzzy.out).toBe(0);
    expect(fuzzy.out.trim().endsWith(`${APPLIED_MARKER}patch --fuzz=5`)).toBe(true);
    expect(sh(drifted, 'cat a.txt').out).toBe('zero\none\nTWO\nthree!\n');

    const none = scratch({ 'a.txt': 'something else entirely\n' });
    const failed = sh(none, applyScript('p.diff', { fromStdin: true }), PATCH.replace(/diff --git a\/new.txt[\s\S]*$/, ''));
    expect(failed.code).toBe(1);
    expect(failed.out).not.toContain(APPLIED_MARKER);
  });

  it('restoreScript puts touched files back to HEAD and removes files HEAD lacks', () => {
    const dir = scratch({ 'a.txt': 'one\n' });
    expect(sh(dir, freshRepoScript()).code).toBe(0);
    writeFileSync(join(dir, 'a.txt'), 'changed\n');
    writeFileSync(join(dir, 'b.txt'), 'agent-made\n');
    expect(sh(dir, restoreScript(['a.txt', 'b.txt'])).code).toBe(0);
    expect(sh(dir, 'cat a.txt; ls').out).toBe('one\na.txt\n');
    expect(restoreScript([])).toBe(':');
  });

  it('patchedFiles reads git and plain unified diffs, renames and deletions', () => {
    expect(patchedFiles(PATCH)).toEqual(['a.txt', 'new.txt']);
    expect(patchedFiles('diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n')).toEqual(['old.py', 'new.py']);
    expect(patchedFiles('--- a/x.py\t2024-01-01\n+++ b/x.py\n@@ -1 +0,0 @@\n-x\n')).toEqual(['x.py']);
  });
});
