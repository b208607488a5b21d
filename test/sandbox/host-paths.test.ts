import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider, type Sandbox, type SandboxProvider } from '@rollserve/core/sandbox';
import { makeOciLayout, makeRootfs } from './image-fixtures.ts';
import { look, type Seen } from './host-paths-probe.ts';
import { sandboxDirRoots } from '../../packages/core/src/sandbox/staging.ts';

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip !== undefined) console.warn(`[sandbox host paths] skipping: ${skip}`);

/*
 * Issue 23: no path the service made on the host (its sandboxes' temporary directories, the image
 * cache, the image it was given, its working directory) shows inside a sandbox, on the host's root
 * or on an image, with the service as root and as an unprivileged user. Read from inside: the mount
 * tables (mountinfo's fourth field is a bind's path within its file system), the command lines and
 * environments of every process the sandbox sees (its pid 1 is a fork of bwrap), their working
 * directories, roots, open files and mappings, the cgroup paths, the Unix sockets.
 */
describe.skipIf(skip !== undefined)('bwrap sandboxes show no host path of the service', () => {
  let dir: string;
  let sandboxDir: string;
  let image: string;
  let provider: SandboxProvider;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'rs-host-paths-'));
    chmodSync(dir, 0o755);
    sandboxDir = join(dir, 'sandboxes');
    mkdirSync(sandboxDir);
    chmodSync(sandboxDir, 0o1777); // the unprivileged service makes its sandboxes' directories here
    makeRootfs(join(dir, 'rootfs'));
    makeOciLayout(join(dir, 'rootfs'), join(dir, 'layout'), { tag: 'v1', env: ['PATH=/bin'] });
    image = `oci:${dir}/layout:v1`;
    provider = createBwrapProvider({ tmpDir: sandboxDir, imageCacheDir: join(dir, `cache-${process.getuid!()}`) });
  }, 120_000);

  afterAll(async () => {
    await provider?.close?.();
    const left = existsSync(sandboxDir) ? readdirSync(sandboxDir) : [];
    rmSync(dir, { recursive: true, force: true });
    expect(left).toEqual([]);
  });

  /** Lines of what the sandbox saw that name a host path of the service's or its sandbox's id. */
  function leaks(seen: Seen, id: string): string[] {
    const needles = [dir, sandboxDir, ...sandboxDirRoots().map((root) => (root === '/tmp' ? '/tmp/rollserve-' : join(root, 'rollserve-'))), `rollserve-${id}`, id, process.cwd()];
    return `${seen.exec}\n${seen.spawned}`
      .split('\n')
      .filter((line) => needles.some((needle) => line.includes(needle)));
  }

  function expectSaw(seen: Seen): void {
    // the dump ran whole, through both ways in
    for (const text of [seen.exec, seen.spawned]) {
      expect(text).toContain('== /proc/self/mountinfo');
      expect(text).toContain(' /run/rollserve-in ');
      expect(text).toContain('== cwd ');
    }
  }

  async function within(spec: { image?: string }, body: (sandbox: Sandbox) => Promise<void>): Promise<void> {
    const sandbox = await provider.create(spec);
    try {
      await body(sandbox);
    } finally {
      await sandbox.close();
    }
  }

  it('on the host root: mount table, processes, cgroup, sockets (exec, an entering process, the Python kernel)', async () => {
    await within({}, async (sandbox) => {
      const seen = await look(sandbox, true);
      expectSaw(seen);
      expect(seen.exec).toContain('python3'); // the kernel was running, and was looked at
      expect(leaks(seen, sandbox.id)).toEqual([]);
      // the service's files for the sandbox come from a tmpfs of their own, read-only inside
      const input = seen.exec.split('\n').find((line) => line.includes(' /run/rollserve-in '))!;
      expect(input).toMatch(/^\d+ \d+ \d+:\d+ \/ \/run\/rollserve-in ro,.* - tmpfs /);
    });
  });

  it('on an image: mount table, processes, cgroup (exec and an entering process)', async () => {
    await within({ image }, async (sandbox) => {
      const seen = await look(sandbox, false);
      expectSaw(seen);
      expect(leaks(seen, sandbox.id)).toEqual([]);
    });
  }, 60_000);

  it('the input directory stays the service\'s: nothing inside changes a staged file, and staging still works', async () => {
    await within({}, async (sandbox) => {
      const staged = sandbox.stageFile('note.txt', 'from the service\n');
      const attempt = await sandbox.exec(
        `cat ${staged}; echo x > ${staged} 2>/dev/null && echo wrote; rm -f ${staged} 2>/dev/null; ln -s /etc/passwd /run/rollserve-in/evil 2>/dev/null && echo linked; cat ${staged}`,
      );
      expect(attempt.stdout).toBe('from the service\nfrom the service\n');
      expect(() => sandbox.stageFile('note.txt', 'again')).toThrow(/EEXIST/);
      // a command's stdin and script come through it as before
      expect((await sandbox.exec('cat', { stdin: 'piped\n' })).stdout).toBe('piped\n');
    });
  });

  it('refuses a path holding a NUL (it would split into two bwrap options), leaving nothing behind', async () => {
    await expect(provider.create({ binds: [{ host: '/usr\u0000--bind\u0000/\u0000/host', sandbox: '/data', readOnly: true }] })).rejects.toThrow(/NUL/);
    expect(readdirSync(sandboxDir)).toEqual([]);
  });

  it('the same with the service running as an unprivileged user (plain and image)', () => {
    if (process.getuid?.() !== 0) {
      console.warn('[sandbox host paths] the suite already runs unprivileged');
      return;
    }
    const cache = join(dir, 'cache-65534');
    mkdirSync(cache, { mode: 0o700 });
    chownSync(cache, 65534, 65534);
    const child = spawnSync(
      'setpriv',
      ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '--import', 'tsx', join(import.meta.dirname, 'host-paths-probe.ts'), sandboxDir, cache, image],
      // a generous limit: the probe compiles itself (tsx, as a user with no cache) and unpacks the image into a cache of its own, on a host CI may load heavily
      { cwd: join(import.meta.dirname, '../..'), encoding: 'utf8', timeout: 240_000, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp' } },
    );
    // all three at once, so a failure says whether it was killed, exited, or wrote an error
    expect({ status: child.status, signal: child.signal, stderr: child.stderr }).toEqual({ status: 0, signal: null, stderr: '' });
    const out = JSON.parse(child.stdout.trim().split('\n').at(-1)!) as { uid: number; seen: Record<string, Seen> };
    expect(out.uid).toBe(65534);
    for (const label of ['plain', 'image']) {
      const seen = out.seen[label]!;
      expectSaw(seen);
      expect(leaks(seen, out.seen[`${label}-id`]!.exec), label).toEqual([]);
    }
    expect(out.seen.plain!.exec).toContain('python3');
  }, 300_000);
});
