import { shQuote } from '@rollserve/core/sandbox';

// The sh scripts run inside the sandboxes. Pure builders, so the exact text is unit-tested.

/** Where verify stages the patches inside the eval sandbox. */
export const PATCH_DIR = '/tmp/rollserve-swe';

/** Build and tool droppings that never belong in a patch. */
export const EXCLUDES = ['__pycache__/', '*.pyc', '.pytest_cache/', '*.egg-info/', '.mypy_cache/'];

/**
 * git refuses repositories owned by another user ("dubious ownership"), which a root-owned /testbed
 * in an image is; the environment variables below are git's command-line config, which may lift it.
 */
export const GIT_ENV: Record<string, string> = { GIT_CONFIG_COUNT: '1', GIT_CONFIG_KEY_0: 'safe.directory', GIT_CONFIG_VALUE_0: '*' };
const GIT_EXPORTS = `export ${Object.entries(GIT_ENV).map(([k, v]) => `${k}=${shQuote(v)}`).join(' ')}`;

/**
 * Makes the repository a fresh git repository whose one commit is the current tree: the agent sees
 * no history past (or before) base_commit, and the diff is taken against that commit. Prints its sha.
 *
 * A repository that has a HEAD (an image's /testbed, a clone reset to base_commit) hands the new
 * one the objects of HEAD's tree alone, as a pack and as the index: `git add -A` then only hashes
 * the files and writes the objects of what differs from HEAD. pack-objects reuses a clone's packed
 * objects and deltas as they are, and searches no new deltas and compresses nothing (`--window=0
 * --compression=0`: on 3,000 loose objects its default delta search took 13 s). Measured on the
 * host, 3,000 files of 12 KB: 0.34 s from a clone's pack against 0.95 s writing every file as a
 * loose object; from loose objects 0.76 s against 0.60 s. Nothing outside that tree is copied (no
 * commit, no future object). The pack is made inside the repository (the same file system as the
 * new .git); if any of it fails the tree is added from the files, as without HEAD.
 */
export function freshRepoScript(): string {
  return [
    'set -e',
    GIT_EXPORTS,
    // (this repository's own HEAD, never that of a repository around it)
    "if [ -e .git ]; then base=$(git rev-parse -q --verify 'HEAD^{tree}' 2>/dev/null) || base=''; else base=''; fi",
    'pack=.rollserve-pack-$$',
    'rm -rf "$pack"',
    'if [ -n "$base" ] && mkdir "$pack" && git rev-list --objects "$base" | git pack-objects -q --window=0 --compression=0 "$pack/pack" >/dev/null 2>&1; then :; else base=""; fi',
    'rm -rf .git',
    'git -c init.defaultBranch=main init -q',
    'if [ -n "$base" ] && mv "$pack"/pack-* .git/objects/pack/ && git read-tree "$base" 2>/dev/null; then :; else git read-tree --empty; fi',
    'rm -rf "$pack"',
    'git config user.name rollserve',
    'git config user.email rollserve@localhost',
    'git config commit.gpgsign false',
    `printf '%s\\n' ${EXCLUDES.map(shQuote).join(' ')} >> .git/info/exclude`,
    'git add -A',
    "git commit -q --no-verify --allow-empty -m 'Initial commit'",
    'git rev-parse HEAD',
  ].join('\n');
}

/**
 * Puts an image's repository at `commit` (SWE-smith's bug commit, checked out when the image has
 * it), else applies the patch given on stdin to what it has (the bug: its branch is the image's
 * commit with that patch, which SWE-smith's eval fetches and a sandbox without network cannot).
 */
export function checkoutScript(commit: string): string {
  const c = shQuote(commit);
  return [
    GIT_EXPORTS,
    `if git cat-file -e ${c}'^{commit}' 2>/dev/null; then git -c advice.detachedHead=false checkout -q -f ${c} && exit 0; fi`,
    `f=/tmp/rollserve-checkout.$$.patch; cat > "$f" || exit 1`,
    'if [ ! -s "$f" ]; then echo "the image has no commit ' + commit.replaceAll("'", '') + ' and the row no patch" >&2; rm -f "$f"; exit 1; fi',
    'git apply --whitespace=nowarn "$f" 2>&1 || patch --batch --fuzz=5 -p1 -i "$f" 2>&1; rc=$?',
    'rm -f "$f"; exit $rc',
  ].join('\n');
}

/** Copies a tar archive given on stdin into `repoDir`. */
export function extractScript(repoDir: string): string {
  return `mkdir -p ${shQuote(repoDir)} && tar -x -f - -C ${shQuote(repoDir)}`;
}

/** The agent's changes against `baseSha`: new files included, binary-safe. */
export function diffScript(baseSha: string): string {
  return `${GIT_EXPORTS}; git add -A >/dev/null && git -c core.quotepath=false diff --cached --binary --no-color --no-ext-diff ${shQuote(baseSha)}`;
}

export const APPLIED_MARKER = 'ROLLSERVE_APPLIED:';

/** Writes stdin to `file` (so a patch and its application take one exec, not two). */
export function stageScript(file: string): string {
  return `mkdir -p -- "$(dirname -- ${shQuote(file)})" && cat > ${shQuote(file)} || exit 1`;
}

/**
 * Applies a patch file: `git apply`, then `patch` with fuzz. Prints the marker and the method.
 * With `fromStdin` the patch arrives on stdin and is staged at `patchFile` first.
 */
export function applyScript(patchFile: string, options: { fuzz?: number; fromStdin?: boolean; reverse?: boolean } = {}): string {
  const file = shQuote(patchFile);
  const fuzz = options.fuzz ?? 5;
  // reversed: the patch is a bug and undoing it the fix (SWE-smith's gold)
  const [gitReverse, patchReverse] = options.reverse === true ? [' --reverse', ' -R'] : ['', ''];
  return [
    ...(options.fromStdin === true ? [stageScript(patchFile)] : []),
    GIT_EXPORTS,
    `if git apply --verbose --whitespace=nowarn${gitReverse} ${file} 2>&1; then echo '${APPLIED_MARKER}git apply${gitReverse}'; exit 0; fi`,
    `if patch --batch --fuzz=${fuzz}${patchReverse} -p1 -i ${file} 2>&1; then echo '${APPLIED_MARKER}patch --fuzz=${fuzz}${patchReverse}'; exit 0; fi`,
    'exit 1',
  ].join('\n');
}

/** Files a unified diff touches (both sides of renames; /dev/null left out). */
export function patchedFiles(diff: string): string[] {
  const files = new Set<string>();
  for (const line of diff.split('\n')) {
    const git = /^diff --git a\/(.+) b\/(.+)$/.exec(line);
    if (git !== null) {
      files.add(git[1]!);
      files.add(git[2]!);
      continue;
    }
    const side = /^(?:---|\+\+\+) (?:[ab]\/)?(\S+)/.exec(line);
    if (side !== null && side[1] !== '/dev/null') files.add(side[1]!);
  }
  return [...files];
}

/**
 * Puts the files the test patch touches back to base (SWE-bench checks the test files out before
 * applying test_patch), so the agent's edits to tests cannot block or game it.
 */
export function restoreScript(files: readonly string[]): string {
  if (files.length === 0) return ':';
  return [GIT_EXPORTS, ...files.map((f) => `git checkout -q HEAD -- ${shQuote(f)} 2>/dev/null || rm -f -- ${shQuote(f)}`)].join('\n');
}
