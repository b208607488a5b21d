import { execFile } from 'node:child_process';
import { invalidInputError, RolloutError } from '@rollserve/core';
import type { Sandbox } from '@rollserve/core/sandbox';
import type { SweInstance } from './instance.ts';
import { checkoutScript, extractScript, freshRepoScript } from './scripts.ts';

const MAX_ARCHIVES = 16;
const archives = new Map<string, Promise<Buffer>>();

/**
 * Who git runs as for a row: as root, the bwrap sandbox's default user (nobody), so that git reads
 * only what a sandbox could (a root-only repository, or one whose .git or alternates lead to one,
 * stays unreadable); otherwise the service's own user, which its sandboxes run as anyway.
 */
const GIT_USER = { uid: 65534, gid: 65534 };

/**
 * git's environment for a row's repository: no system or global config and a neutral HOME (the
 * service's are not the row's business), and the repository trusted whoever owns it (git refuses
 * a repository owned by another user otherwise: safe.directory, honoured from the command line).
 */
const gitEnv = (): NodeJS.ProcessEnv => ({
  PATH: process.env.PATH ?? '/usr/bin:/bin',
  HOME: '/',
  LC_ALL: 'C',
  GIT_CONFIG_NOSYSTEM: '1',
  GIT_CONFIG_GLOBAL: '/dev/null',
  GIT_ATTR_NOSYSTEM: '1',
});

/**
 * The tree of `commit` in the host repository `repoPath` as a tar archive (`git archive`: no
 * .git, so no history at all), read with no more privilege than a sandbox has (GIT_USER). The
 * last few are kept: every rollout of a GRPO group and its eval sandbox copy the same tree.
 */
export function archiveTree(repoPath: string, commit: string): Promise<Buffer> {
  const key = `${repoPath}\0${commit}`;
  let archive = archives.get(key);
  if (archive !== undefined) {
    archives.delete(key); // most recently used goes last
    archives.set(key, archive);
    return archive;
  }
  archive = new Promise<Buffer>((resolve, reject) => {
    execFile(
      'git',
      ['-c', 'safe.directory=*', '-C', repoPath, 'archive', '--format=tar', `${commit}^{tree}`],
      {
        encoding: 'buffer',
        maxBuffer: 2 ** 31 - 1,
        env: gitEnv(),
        cwd: '/',
        ...(process.getuid?.() === 0 ? { uid: GIT_USER.uid, gid: GIT_USER.gid } : {}),
      },
      (error, stdout, stderr) => {
        if (error === null) resolve(stdout);
        else {
          // a bad row, not a server fault: the 422 of a pydantic validator, at the field to blame
          const why = stderr.toString().trim() || error.message;
          const field = /not a git repository|No such file|cannot change to|Permission denied|dubious ownership/i.test(why) ? 'repo_path' : 'base_commit';
          reject(invalidInputError([field], `cannot read ${commit} of ${repoPath}: ${why}`, field === 'repo_path' ? repoPath : commit));
        }
      },
    );
  });
  archives.set(key, archive);
  archive.catch(() => archives.delete(key));
  while (archives.size > MAX_ARCHIVES) archives.delete(archives.keys().next().value!);
  return archive;
}

/** Fails with the command's output when it did not succeed. */
export function ensureOk(result: { returnCode: number; stdout: string; stderr: string }, what: string): string {
  if (result.returnCode === 0) return result.stdout;
  const output = `${result.stdout}\n${result.stderr}`.trim().slice(-2000);
  throw new RolloutError({ code: 'SANDBOX', message: `${what} failed (exit ${result.returnCode}): ${output}` });
}

/**
 * Puts the repository at base_commit in the sandbox: the host tree copied in (repo_path rows) or
 * the image's own, then the setup script, then a fresh one-commit git repository. Returns the sha
 * of that commit, which diffs are taken against.
 */
export async function prepareRepository(sandbox: Sandbox, instance: SweInstance, timeoutMs: number): Promise<string> {
  if (instance.repoPath !== undefined) {
    const tar = await archiveTree(instance.repoPath, instance.baseCommit);
    const copied = await sandbox.exec(extractScript(instance.repoDir), { cwd: '/', stdin: tar, timeoutMs });
    // the archive is the service's own: what fails here is the row's or config's repo_dir (a
    // directory of the sandbox it may not write, e.g. /testbed without an image, or a workspace too
    // small for the tree), so the client hears of it as a 422 on the field, not a 500
    if (copied.returnCode !== 0) {
      const why = `${copied.stdout}\n${copied.stderr}`.trim().split('\n').slice(-3).join('\n');
      throw invalidInputError(['repo_dir'], `cannot copy the repository into ${instance.repoDir} in the sandbox (without an image only its workdir, ${sandbox.workdir}, and /tmp are writable): ${why}`, instance.repoDir);
    }
  }
  if (instance.checkout !== undefined) {
    ensureOk(await sandbox.exec(checkoutScript(instance.checkout.commit), { cwd: instance.repoDir, stdin: instance.checkout.patch, timeoutMs }), `putting the repository at ${instance.checkout.commit}`);
  }
  if (instance.setupScript !== undefined) {
    ensureOk(await sandbox.exec(instance.setupScript, { cwd: instance.repoDir, timeoutMs }), 'setup_script');
  }
  const out = ensureOk(await sandbox.exec(freshRepoScript(), { cwd: instance.repoDir, timeoutMs }), 'preparing the git repository');
  const sha = out.trim().split('\n').pop() ?? '';
  if (!/^[0-9a-f]{40,64}$/.test(sha)) throw new RolloutError({ code: 'SANDBOX', message: `unexpected output preparing the git repository: ${out.slice(-500)}` });
  return sha;
}
