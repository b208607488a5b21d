import { describe, expect, it } from 'vitest';
import { buildPrlimitArgs, resolveSandboxSpec } from '../limits.ts';
import { agentScript } from './agent.ts';
import { ARGS_FD, buildBwrapArgs, buildEnterArgs, bwrapArgsOnFd, scanRoot } from './args.ts';

const input = {
  root: '/',
  entries: [
    { name: 'usr', kind: 'dir' as const },
    { name: 'bin', kind: 'symlink' as const, target: 'usr/bin' },
  ],
  workdir: '/workspace',
  inputHost: '/tmp/rollserve-rs-1/in',
  writable: { mounted: { workspace: '/m/workspace', tmp: '/m/tmp', shm: '/m/shm', output: '/m/output' } },
  network: false,
  devices: ['null'],
  env: { PATH: '/usr/bin' },
  command: ['/bin/sh', '-c', 'agent'],
};

describe('buildBwrapArgs', () => {
  it('binds an image under its overlay layer as a writable root, without capabilities, as the image user', () => {
    const args = buildBwrapArgs({ ...input, entries: [], workdir: '/testbed', writableRoot: '/tmp/rollserve-rs-1/layer/root', ids: { uid: 1234, gid: 2345 } });
    expect(args.slice(10, 18)).toEqual(['--uid', '1234', '--gid', '2345', '--cap-drop', 'ALL', '--bind', '/tmp/rollserve-rs-1/layer/root']);
    expect(args.slice(18, 19)).toEqual(['/']);
    // the workdir is the image's own directory (its files stay), and the root is not remounted read-only
    expect(args.join(' ')).toContain('--bind /m/tmp /tmp --dir /testbed --bind /m/output /run/rollserve');
    expect(args.filter((arg) => arg === '--remount-ro')).toHaveLength(1); // /dev's alone
    expect(args.join(' ')).not.toContain('/m/workspace');
  });

  it('builds the exact isolated command line', () => {
    expect(buildBwrapArgs(input)).toEqual([
      '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try', '--unshare-net',
      '--die-with-parent', '--new-session', '--hostname', 'sandbox',
      '--ro-bind', '/usr', '/usr',
      '--symlink', 'usr/bin', '/bin',
      '--proc', '/proc', '--size', '65536', '--tmpfs', '/dev',
      '--dev-bind', '/dev/null', '/dev/null',
      '--symlink', '/proc/self/fd', '/dev/fd',
      '--symlink', '/proc/self/fd/0', '/dev/stdin',
      '--symlink', '/proc/self/fd/1', '/dev/stdout',
      '--symlink', '/proc/self/fd/2', '/dev/stderr',
      // every writable place is a tmpfs of its own size and inode count, mounted before bwrap
      // (mounts.ts); the service's files come in read-only; /dev is read-only
      '--bind', '/m/shm', '/dev/shm', '--bind', '/m/tmp', '/tmp', '--bind', '/m/workspace', '/workspace',
      '--bind', '/m/output', '/run/rollserve',
      // the exec agent's output directory, the sandbox uid's
      '--perms', '0700', '--dir', '/run/rollserve/.exec',
      '--ro-bind', '/tmp/rollserve-rs-1/in', '/run/rollserve-in',
      '--remount-ro', '/dev', '--remount-ro', '/', '--chdir', '/workspace', '--clearenv', '--setenv', 'PATH', '/usr/bin',
      '--info-fd', '3', '--', '/bin/sh', '-c', 'agent',
    ]);
  });

  it("falls back to bwrap's own sized tmpfs mounts where the service cannot mount them", () => {
    const args = buildBwrapArgs({ ...input, writable: { sizes: { workspaceMib: 64, tmpMib: 32, outputMib: 8 } } }).join(' ');
    expect(args).toContain(
      `--perms 1777 --size ${8 << 20} --tmpfs /dev/shm --perms 1777 --size ${32 << 20} --tmpfs /tmp --size ${64 << 20} --tmpfs /workspace --size ${8 << 20} --tmpfs /run/rollserve`,
    );
  });

  it('keeps the host network only when asked, never uses --dev, binds extra dirs', () => {
    const args = buildBwrapArgs({ ...input, network: true, binds: [{ host: '/data', sandbox: '/data', readOnly: true }] });
    expect(args).not.toContain('--unshare-net');
    expect(args).not.toContain('--dev');
    expect(args.join(' ')).toContain('--ro-bind /data /data');
  });

  it('roots an image directory', () => {
    const args = buildBwrapArgs({ ...input, root: '/images/py', entries: [{ name: 'usr', kind: 'dir' }] });
    expect(args.join(' ')).toContain('--ro-bind /images/py/usr /usr');
  });
});

describe('bwrapArgsOnFd', () => {
  it('leaves only the command on the command line (no host path), the options NUL-separated for --args', () => {
    const args = buildBwrapArgs(input);
    const { argv, options } = bwrapArgsOnFd(args, input.command);
    expect(argv).toEqual(['--args', String(ARGS_FD), '--', '/bin/sh', '-c', 'agent']);
    expect(options.toString('utf8').split('\0')).toEqual([...args.slice(0, -4), '']);
    expect(argv.join(' ')).not.toContain('/tmp/rollserve-rs-1');
  });

  it('refuses an option holding a NUL: it would be two options to bwrap', () => {
    const args = buildBwrapArgs({ ...input, binds: [{ host: '/data\0--bind\0/\0/host', sandbox: '/data', readOnly: true }] });
    expect(() => bwrapArgsOnFd(args, input.command)).toThrow(/NUL/);
  });
});

describe('buildEnterArgs', () => {
  it('enters every namespace of the sandbox, dropping to the sandbox uid when root', () => {
    expect(buildEnterArgs({ initPid: 42, user: { uid: 65534, gid: 65534 } })).toEqual([
      'setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', '--no-new-privs', '--',
      'nsenter', '-t', '42', '-U', '-m', '-p', '-n', '-i', '-u', '-C', '--preserve-credentials', '--',
    ]);
    expect(buildEnterArgs({ initPid: 42 })).not.toContain('setpriv');
    // a sandbox with network shares the host's: that one is not entered
    expect(buildEnterArgs({ initPid: 42, namespaces: ['ipc', 'uts'] })).toEqual(['nsenter', '-t', '42', '-U', '-m', '-p', '-i', '-u', '--preserve-credentials', '--']);
  });

  it('joins the sandbox cgroup first, as the service, then drops privileges', () => {
    const args = buildEnterArgs({ initPid: 42, user: { uid: 65534, gid: 65534 }, cgroupProcs: ['/cg/mem/procs', '/cg/pids/procs'] });
    expect(args.slice(0, 7)).toEqual(['/bin/sh', '-c', expect.stringContaining('exec "$@"'), 'rs-cgroup', '2', '/cg/mem/procs', '/cg/pids/procs']);
    expect(args[7]).toBe('setpriv');
  });

  it('prlimit sets the per-process limits and leaves RLIMIT_NPROC out (the local provider)', () => {
    expect(buildPrlimitArgs({ memoryMib: 1, maxFileSizeMib: 2, cpuSeconds: 3, maxOpenFiles: 64 })).toEqual([
      'prlimit', '--as=1048576', '--fsize=2097152', '--cpu=3', '--nofile=64', '--core=0', '--',
    ]);
  });
});

describe('agentScript', () => {
  it('sets the limits inside the sandbox (ulimit -f in 512-byte blocks), each or nothing', () => {
    const { resources } = resolveSandboxSpec({ resources: { memoryMib: 100, maxProcesses: 9, maxFileSizeMib: 1, cpuSeconds: 5, maxOpenFiles: 77 } });
    const script = agentScript(resources);
    expect(script).toContain('ulimit -v 102400 ||');
    expect(script).toContain('ulimit -f 2048 ||');
    expect(script).toContain('ulimit -t 5 ||');
    expect(script).toContain('ulimit -n 77 ||');
    expect(script).toContain('{ ulimit -u 9 2>/dev/null || ulimit -p 9; } ||');
    // a limit that cannot be set ends the agent before it says it is ready
    expect(script.indexOf('exit 1')).toBeLessThan(script.indexOf("printf 'R"));
  });
});

describe('scanRoot', () => {
  it('lists dirs and symlinks of the host root', () => {
    const entries = scanRoot('/', ['usr', 'etc', 'does-not-exist']);
    expect(entries.map((e) => e.name)).toEqual(['usr', 'etc']);
    expect(entries.every((e) => e.kind === 'dir' || e.kind === 'symlink')).toBe(true);
  });
});

describe('bwrap image root (real sandbox)', () => {
  it('roots the sandbox in an image directory instead of the host', async () => {
    const { chmodSync, mkdtempSync, mkdirSync, rmSync, symlinkSync, writeFileSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const { bwrapAvailable, createBwrapProvider } = await import('./provider.ts');
    if (!bwrapAvailable()) {
      console.warn('[bwrap image test] skipped: bwrap is not installed');
      return;
    }
    const image = mkdtempSync(join(tmpdir(), 'rs-image-'));
    chmodSync(image, 0o755); // the sandbox uid must be able to read the image
    mkdirSync(join(image, 'etc'));
    mkdirSync(join(image, 'usr'));
    writeFileSync(join(image, 'etc', 'image-marker'), 'from the image\n');
    for (const dir of ['bin', 'lib', 'lib64']) symlinkSync(`usr/${dir}`, join(image, dir));
    // the image's /usr is the host's, bound read-only (a real image would ship its own)
    const sandbox = await createBwrapProvider().create({ image, binds: [{ host: '/usr', sandbox: '/usr', readOnly: true }] });
    try {
      expect((await sandbox.exec('cat /etc/image-marker')).stdout).toBe('from the image\n');
      expect((await sandbox.exec('ls /etc')).stdout).toBe('image-marker\n');
      expect((await sandbox.exec('touch /etc/x')).returnCode).not.toBe(0);
    } finally {
      await sandbox.close();
      rmSync(image, { recursive: true, force: true });
    }
  });
});

describe('removeStaleSandboxDirs', () => {
  it('with orphansOnly removes only directories whose maker is gone, whatever their age', async () => {
    const { mkdtempSync, mkdirSync, rmSync, existsSync, utimesSync, writeFileSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const { removeStaleSandboxDirs } = await import('../staging.ts');
    const dir = mkdtempSync(join(tmpdir(), 'rs-orphans-'));
    try {
      const old = join(dir, 'rollserve-rs-0123456789ab'); // old, maker unknown: left to the start-up sweep
      const orphan = join(dir, 'rollserve-rs-00000000000c');
      for (const d of [old, orphan]) mkdirSync(d);
      writeFileSync(join(orphan, 'owner'), `${process.pid} 1`);
      const then = new Date(Date.now() - 3_600_000);
      utimesSync(old, then, then);
      expect(await removeStaleSandboxDirs({ tmpDir: dir, orphansOnly: true })).toEqual([orphan]);
      expect(existsSync(old)).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("removes a kernel fork server's scratch directory once its server is gone or it is old, not a live server's", async () => {
    const { mkdirSync, existsSync, readFileSync, rmSync, utimesSync } = await import('node:fs');
    const { spawn, spawnSync } = await import('node:child_process');
    const readStat = (pid: number): string => {
      try {
        return readFileSync(`/proc/${pid}/stat`, 'latin1');
      } catch {
        return '';
      }
    };
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const { removeStaleSandboxDirs } = await import('../staging.ts');
    const dead = spawnSync('true').pid!;
    // a live process whose command line is a fork server's (its loader names `<rollserve-forkserver>`)
    const server = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60_000)', '<rollserve-forkserver>'], { stdio: ['ignore', 'pipe', 'ignore'] });
    // a server killed with its service and not yet reaped (a zombie: its parent, here a sleep, reaps nothing)
    const parent = spawn('sh', ['-c', 'sleep 0 & echo $!; exec sleep 60'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const zombie = await new Promise<Buffer>((resolve) => parent.stdout!.once('data', resolve));
    const gone = join(tmpdir(), `rollserve-forkserver-${dead}-t3stgone`);
    const live = join(tmpdir(), `rollserve-forkserver-${server.pid}-t3stlive`);
    const old = join(tmpdir(), `rollserve-forkserver-${server.pid}-t3st0old`);
    const unreaped = join(tmpdir(), `rollserve-forkserver-${Number(zombie)}-t3stzomb`);
    // its pid since given to another process: this one
    const reused = join(tmpdir(), `rollserve-forkserver-${process.pid}-t3streus`);
    const dirs = [gone, live, old, unreaped, reused];
    try {
      for (let i = 0; i < 100 && !/^\S+ \(\S+\) Z/.test(readStat(Number(zombie))); i++) await new Promise((resolve) => setTimeout(resolve, 20));
      expect(readStat(Number(zombie))).toMatch(/^\S+ \(\S+\) Z/);
      for (const d of dirs) mkdirSync(join(d, 'profile_default'), { recursive: true });
      const then = new Date(Date.now() - 3_600_000);
      utimesSync(old, then, then);
      const removed = await removeStaleSandboxDirs({ orphansOnly: true });
      expect(removed.filter((path) => path.includes('-t3st')).sort()).toEqual([gone, old, unreaped, reused].sort());
      expect(existsSync(live)).toBe(true);
    } finally {
      server.kill('SIGKILL');
      parent.kill('SIGKILL');
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
    }
  });

  it('removes only old sandbox dirs that no process names', async () => {
    const { chmodSync, mkdtempSync, mkdirSync, rmSync, existsSync, utimesSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const { removeStaleSandboxDirs } = await import('../staging.ts');
    const { createBwrapProvider, bwrapAvailable } = await import('./provider.ts');
    const dir = mkdtempSync(join(tmpdir(), 'rs-stale-'));
    chmodSync(dir, 0o755); // the sandbox uid must be able to reach its directories
    try {
      const stale = join(dir, 'rollserve-rs-0123456789ab');
      const fresh = join(dir, 'rollserve-rs-ba9876543210');
      const other = join(dir, 'rollserve-something-else');
      // young, but made by a process that is gone (a node killed): stale at once; young and made by a live one: kept
      const orphan = join(dir, 'rollserve-rs-00000000000a');
      const ours = join(dir, 'rollserve-rs-00000000000b');
      for (const d of [stale, fresh, other, orphan, ours]) mkdirSync(join(d, 'workspace'), { recursive: true });
      const { writeFileSync, readFileSync } = await import('node:fs');
      const selfStart = readFileSync('/proc/self/stat', 'latin1').split(') ')[1]!.split(' ')[19];
      writeFileSync(join(ours, 'owner'), `${process.pid} ${selfStart}`);
      writeFileSync(join(orphan, 'owner'), `${process.pid} 1`); // this pid, another start time: a pid reused
      const old = new Date(Date.now() - 3_600_000);
      utimesSync(stale, old, old);
      utimesSync(other, old, old);
      let live: { close(): Promise<void>; id: string } | undefined;
      if (bwrapAvailable()) {
        live = await createBwrapProvider({ tmpDir: dir }).create();
        const livePath = join(dir, `rollserve-${live.id}`);
        utimesSync(livePath, old, old);
      }
      // (stale cgroups of dead services, if any, go too)
      expect((await removeStaleSandboxDirs({ tmpDir: dir })).filter((path) => path.startsWith(dir)).sort()).toEqual([stale, orphan].sort());
      expect(existsSync(fresh) && existsSync(other) && existsSync(ours)).toBe(true);
      if (live) {
        expect(existsSync(join(dir, `rollserve-${live.id}`))).toBe(true);
        await live.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
