import { closeSync, openSync, readFileSync, statSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider, type Sandbox } from '../../packages/core/src/sandbox/index.ts';
import { spawnerAvailable, type EnterRequest, type Spawner } from '../../packages/core/src/sandbox/bwrap/spawner.ts';
import { openMaster } from '../../packages/core/src/sandbox/node-pty.ts';

// The bwrap provider's spawner (spawner.ts), the small perl that starts each sandbox's bwrap: a
// process of the provider's, which ends with it (at once, or once the last sandbox its callers
// still hold has closed), and whose death ends the sandboxes it started and is survived by the
// provider (the next start has a new one).

const skip = !bwrapAvailable() ? 'bwrap is not installed' : !spawnerAvailable() ? 'no perl for the spawner' : undefined;
if (skip !== undefined) console.warn(`[spawner] skipping: ${skip}`);

const spawnerOf = (sandbox: Sandbox): number => (sandbox as unknown as { spawner: { pid: number } }).spawner.pid;

/** Running (not a zombie: its parent, this process, reaps it when Node gets to it). */
function running(pid: number): boolean {
  try {
    return !/^State:\s*Z/m.test(readFileSync(`/proc/${pid}/status`, 'latin1'));
  } catch {
    return false;
  }
}

async function until(check: () => boolean, timeoutMs = 10_000): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (!check() && Date.now() < end) await new Promise((resolve) => setTimeout(resolve, 20));
  return check();
}

describe.skipIf(skip !== undefined)('the bwrap provider\'s spawner', () => {
  it('is one process per provider, a child of the service, and ends with its provider', async () => {
    const provider = createBwrapProvider();
    const a = await provider.create();
    const b = await provider.create();
    const pid = spawnerOf(a);
    expect(spawnerOf(b)).toBe(pid);
    expect(readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]!.split(' ')[1]).toBe(String(process.pid));
    await Promise.all([a.close(), b.close()]);
    expect(running(pid)).toBe(true);
    await provider.close?.();
    expect(await until(() => !running(pid))).toBe(true);
  });

  it('outlives its closed provider while a sandbox it started is open, and ends once that sandbox closes', async () => {
    const provider = createBwrapProvider();
    const sandbox = await provider.create();
    const pid = spawnerOf(sandbox);
    await provider.close?.();
    expect((await sandbox.exec('echo still here')).stdout).toBe('still here\n');
    expect(running(pid)).toBe(true);
    await sandbox.close();
    expect(await until(() => !running(pid))).toBe(true);
  });

  it('takes the sandboxes it started along when it is killed, and is replaced at the next start', async () => {
    const provider = createBwrapProvider();
    try {
      const sandbox = await provider.create();
      const pid = spawnerOf(sandbox);
      const init = (sandbox as unknown as { initPid: number }).initPid;
      process.kill(pid, 'SIGKILL');
      expect(await until(() => !running(init))).toBe(true);
      expect(await until(() => (sandbox as unknown as { alive(): boolean }).alive() === false)).toBe(true);
      await sandbox.close();
      const next = await provider.create();
      expect(spawnerOf(next)).not.toBe(pid);
      expect((await next.exec('echo ok')).stdout).toBe('ok\n');
      await next.close();
    } finally {
      await provider.close?.();
    }
  });

  it.skipIf(process.getuid?.() !== 0)('enters only the sandbox named, by its pid namespace, and runs nothing on a descriptor that is not a terminal master (root)', async () => {
    const provider = createBwrapProvider();
    const master = openMaster();
    const file = openSync('/dev/null', 'r');
    try {
      const sandbox = await provider.create();
      const spawner = (sandbox as unknown as { spawner: Spawner }).spawner;
      const init = (sandbox as unknown as { initPid: number }).initPid;
      const request: EnterRequest = {
        initPid: init,
        pidNamespace: statSync(`/proc/${init}/ns/pid`).ino,
        namespaces: [],
        cgroupProcs: [],
        user: { uid: 65534, gid: 65534 },
        rlimits: [],
        cwd: '/',
        env: { PATH: '/usr/bin:/bin' },
        argv: ['/bin/sh', '-c', 'touch /tmp/ran'],
        tty: { fd: master.fd, cols: 80, rows: 24, plain: true },
      };
      // another pid namespace than the init's (a reused pid), or no such process: refused, nothing forked
      await expect(spawner.enter({ ...request, pidNamespace: request.pidNamespace + 1 }, () => {})).rejects.toThrow(/init is gone/);
      await expect(spawner.enter({ ...request, initPid: 2 ** 22 + 1 }, () => {})).rejects.toThrow(/init is gone/);
      // a descriptor that is not a terminal master: the fork ends before it enters anything
      const code = await new Promise<number>((resolve, reject) => void spawner.enter({ ...request, tty: { ...request.tty, fd: file } }, resolve).catch(reject));
      expect(code).toBe(125);
      expect((await sandbox.exec('ls /tmp')).stdout).toBe('');
      // the terminal: it runs, in the sandbox
      const ran = await new Promise<number>((resolve, reject) => void spawner.enter(request, resolve).catch(reject));
      expect(ran).toBe(0);
      expect((await sandbox.exec('ls /tmp')).stdout).toBe('ran\n');
      await sandbox.close();
    } finally {
      closeSync(file);
      master.close();
      await provider.close?.();
    }
  });
});
