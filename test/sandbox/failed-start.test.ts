import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bwrapAvailable } from '../../packages/core/src/sandbox/index.ts';

// A sandbox whose start fails (bwrap never says the sandbox runs) leaves no zombie: the guard
// (mounts.ts) is killed, and bwrap's monitor, its child, dies with it as an orphan. That orphan
// went to the host's init, which in a container may be the service itself, reaping nothing: it
// stayed a zombie for good. The spawner (spawner.ts) is a child subreaper and reaps it. The
// service here is pid 1 of its own pid namespace, as in such a container (root only: the
// namespace is made with unshare), as root and as an unprivileged user.

const root = process.getuid?.() === 0;
const hasUnshare = spawnSync('unshare', ['--version'], { stdio: 'ignore' }).status === 0;
const skip = !bwrapAvailable() ? 'bwrap is not installed' : !root ? 'needs root (a pid namespace of its own)' : !hasUnshare ? 'no unshare' : undefined;
if (skip !== undefined) console.warn(`[failed start] skipping: ${skip}`);

const ROOT = join(import.meta.dirname, '../..');

describe.skipIf(skip !== undefined)('a failed sandbox start', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'rollserve-failed-start-'));
    // the sandbox uid and the unprivileged service make their directories there
    chmodSync(dir, 0o1777);
    // a "bwrap" that runs and never answers: the start times out while it runs
    writeFileSync(join(dir, 'fake-bwrap'), '#!/bin/sh\nexec sleep 1001\n', { mode: 0o755 });
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  for (const asUser of [false, true]) {
    it(`leaves no zombie and nothing running (${asUser ? 'an unprivileged service' : 'a root service'})`, () => {
      const node = [process.execPath, '--import', 'tsx', join(import.meta.dirname, 'failed-start-probe.ts'), dir, join(dir, 'fake-bwrap')];
      const argv = ['--pid', '--fork', '--mount-proc', ...(asUser ? ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups'] : []), ...node];
      const probe = spawnSync('unshare', argv, {
        cwd: ROOT,
        encoding: 'utf8',
        timeout: 60_000,
        env: asUser ? { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp' } : process.env,
      });
      const out = JSON.parse(probe.stdout.trim().split('\n').at(-1) ?? '{}') as { error: string; ran: number; zombies: string[]; left: number[] };
      expect(out.error, probe.stderr).toMatch(/sandbox not ready after 1500 ms/);
      // the fake bwrap did run as the guard's child, and was killed with the start
      expect(out.ran).toBe(1);
      expect(out.left).toEqual([]);
      expect(out.zombies).toEqual([]);
    }, 90_000);
  }
});
