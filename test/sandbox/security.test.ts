import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  bwrapAvailable,
  cgroupCpuSupport,
  cgroupSupport,
  createBwrapProvider,
  inodeShares,
  removeStaleSandboxDirs,
  type Sandbox,
  type SandboxSpec,
} from '@rollserve/core/sandbox';
import { serviceHardLimit } from '../../packages/core/src/sandbox/limits.ts';
import { sandboxDirRoots } from '../../packages/core/src/sandbox/staging.ts';
import { BashSession, PythonKernel } from '@rollserve/core/sandbox';
import { SandboxPool } from '@rollserve/testing';

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip !== undefined) console.warn(`[sandbox security] skipping: ${skip}`);

/**
 * Host pids whose command line or working directory mentions `needle` (bwrap runs in its
 * sandbox's directory, which carries the sandbox id).
 */
function pidsMentioning(needle: string): number[] {
  const pids: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readFileSync(`/proc/${name}/cmdline`, 'latin1').includes(needle) || readlinkSync(`/proc/${name}/cwd`).includes(needle)) pids.push(Number(name));
    } catch {
      // exited
    }
  }
  return pids;
}

/** Host pids living in the pid namespace `ns` (e.g. 'pid:[4026532256]'). */
function pidsInNamespace(ns: string): number[] {
  const pids: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/ns/pid`) === ns) pids.push(Number(name));
    } catch {
      // exited
    }
  }
  return pids;
}

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'latin1').replaceAll('\0', ' ');
  } catch {
    return '';
  }
}

function childrenOfTest(): number[] {
  try {
    return readFileSync(`/proc/${process.pid}/task/${process.pid}/children`, 'latin1').trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

const initPid = (sandbox: Sandbox): number => (sandbox as unknown as { initPid: number }).initPid;
const namespaceOf = (sandbox: Sandbox): string => readlinkSync(`/proc/${initPid(sandbox)}/ns/pid`);

/**
 * Waits for `check`. `typicalMs` is how long it takes on a quiet machine; the wait goes on far
 * longer (a loaded machine is slow, not wrong), so only a condition that never comes fails.
 */
async function until(check: () => boolean, typicalMs: number): Promise<boolean> {
  const end = Date.now() + Math.max(typicalMs * 10, 20_000);
  while (Date.now() < end) {
    if (check()) return true;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return check();
}

describe.skipIf(skip !== undefined)('bwrap sandbox security', () => {
  const provider = createBwrapProvider();
  const pool = new SandboxPool(() => provider);
  const create = (spec: SandboxSpec = {}) => pool.create(spec);
  let server: Server;
  let port = 0;

  beforeAll(async () => {
    server = createServer((socket) => socket.end('hello from the host\n'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as { port: number }).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
  afterEach(() => pool.close());

  const connect = `python3 -c "import socket; s = socket.create_connection(('127.0.0.1', PORT), timeout=2); print(s.recv(100).decode().strip())"`;

  it('cannot reach a server on the host loopback, unless the spec asks for network', async () => {
    const closed = await create();
    const denied = await closed.exec(connect.replace('PORT', String(port)));
    expect(denied.returnCode).not.toBe(0);
    expect(denied.stdout).not.toContain('hello from the host');
    // the positive control: the same command works with network on, so the test can fail
    const open = await create({ network: true });
    const allowed = await open.exec(connect.replace('PORT', String(port)));
    expect(allowed.stdout).toBe('hello from the host\n');
  });

  it('writes only to the workspace and /tmp', async () => {
    const sandbox = await create();
    // (/dev is a tmpfs: writable, it would be one of no size the sandbox's limits name)
    for (const path of ['/usr/rs-probe', '/etc/rs-probe', '/rs-probe', '/bin/rs-probe', '/run/rs-probe', '/dev/rs-probe']) {
      const result = await sandbox.exec(`touch ${path}`);
      expect(result.returnCode, path).not.toBe(0);
      expect(existsSync(path), path).toBe(false);
    }
    expect((await sandbox.exec('touch /tmp/ok && touch ./ok && ls ./ok /tmp/ok')).returnCode).toBe(0);
  });

  it('cannot read unbound host paths nor the service environment', async () => {
    process.env.ROLLSERVE_SECRET = 'hunter2-secret-value';
    try {
      const sandbox = await create();
      expect((await sandbox.exec('ls /root')).returnCode).not.toBe(0);
      expect((await sandbox.exec('ls /home /work /var 2>&1')).returnCode).not.toBe(0);
      const env = await sandbox.exec('env; cat /proc/*/environ 2>/dev/null | tr "\\0" "\\n"');
      expect(env.stdout).not.toContain('hunter2');
      expect(env.stdout).not.toContain('ROLLSERVE_SECRET');
      const term = sandbox.spawnPty(['/bin/sh', '-c', 'env']);
      let out = '';
      term.onData((d) => {
        out += d;
      });
      await new Promise<void>((resolve) => term.onExit(() => resolve()));
      expect(out).toContain('PATH=');
      expect(out).not.toContain('hunter2');
      // only the sandbox's own processes are visible
      const procs = await sandbox.exec('ls /proc | grep -c "^[0-9]"');
      expect(Number(procs.stdout.trim())).toBeLessThan(10);
    } finally {
      delete process.env.ROLLSERVE_SECRET;
    }
  });

  it('runs as an unprivileged uid without capabilities', async () => {
    const sandbox = await create();
    const caps = await sandbox.exec('grep -E "^(CapEff|CapPrm|NoNewPrivs)" /proc/self/status; id -u');
    expect(caps.stdout).toMatch(/CapPrm:\s+0+\n/);
    expect(caps.stdout).toMatch(/CapEff:\s+0+\n/);
    expect(caps.stdout.trim().split('\n').at(-1)).not.toBe('0');
    const status = readFileSync(`/proc/${initPid(sandbox)}/status`, 'utf8');
    expect(status).not.toMatch(/^Uid:\s+0\s/m);
    expect(status).not.toMatch(/^Gid:\s+0\s/m);
    expect(status).toMatch(/^Groups:\s*$/m); // no supplementary groups carried over from the service
    expect(status).toMatch(/^NoNewPrivs:\s+1$/m);
  });

  it('contains a fork bomb without hurting the host', async () => {
    const sandbox = await create({ resources: { maxProcesses: 40 } });
    // never let the bomb loose when the limit is not in force: it would take the host down
    const limits = await sandbox.exec('grep "Max processes" /proc/self/limits');
    expect(limits.stdout).toMatch(/Max processes\s+40\s+40/);
    const ns = namespaceOf(sandbox);
    // the classic bomb, in bash: bash retries failed forks, so the pressure stays at the limit
    const bomb = sandbox.exec("bash -c ':(){ :|:& };:; sleep 5'", { timeoutMs: 1500 });
    let peak = 0;
    const sampler = setInterval(() => {
      peak = Math.max(peak, pidsInNamespace(ns).length);
    }, 25);
    // the host can still start processes while the bomb runs
    await new Promise((resolve) => setTimeout(resolve, 400));
    expect(spawnSync('/bin/true').status).toBe(0);
    const result = await bomb;
    clearInterval(sampler);
    expect(result.errorType).toBe('timeout');
    expect(peak).toBeGreaterThanOrEqual(30);
    expect(peak).toBeLessThanOrEqual(40);
    // the time limit ended the whole bomb; the sandbox still works
    expect(await until(() => pidsInNamespace(ns).length <= 3, 3000)).toBe(true);
    expect((await sandbox.exec('echo alive')).stdout).toBe('alive\n');
  });

  it('contains a memory bomb and a file-size bomb', async () => {
    const sandbox = await create({ resources: { memoryMib: 256, maxFileSizeMib: 1 } });
    const memory = await sandbox.exec('python3 -c "x = bytearray(1 << 30); print(len(x))"', { timeoutMs: 10_000 });
    expect(memory.returnCode).not.toBe(0);
    expect(memory.stderr).toContain('MemoryError');
    const file = await sandbox.exec('head -c 3000000 /dev/zero > big; wc -c < big', { timeoutMs: 10_000 });
    expect(Number(file.stdout.trim())).toBeLessThanOrEqual(1024 * 1024);
    expect((await sandbox.exec('echo alive')).stdout).toBe('alive\n');
  });

  it('stops a CPU hog at the CPU-time limit', async () => {
    const sandbox = await create({ resources: { cpuSeconds: 1 } });
    const result = await sandbox.exec('while :; do :; done', { timeoutMs: 8000 });
    expect(result.errorType).toBeUndefined();
    expect([128 + 24, 128 + 9]).toContain(result.returnCode);
  });

  // Python making files as fast as it can, in one call, in each place the count is shared by
  const makeFiles = [
    'import os',
    'made = []',
    'for d in (".", "/tmp", "/dev/shm"):',
    '    n = 0',
    '    try:',
    '        while n < 5000:',
    '            open(os.path.join(d, "f%d" % n), "w").close(); n += 1',
    '    except OSError as e:',
    '        made.append("%s:%d:%s" % (d, n, os.strerror(e.errno)))',
    '    else:',
    '        made.append("%s:%d:none" % (d, n))',
    'print(" ".join(made))',
  ].join('\n');

  it('has the kernel keep the file count, in one command: each tmpfs stops at its share with ENOSPC', async () => {
    const sandbox = await create({ resources: { maxInodes: 2000 } });
    const shares = inodeShares(2000);
    const result = await sandbox.exec(`python3 -c '${makeFiles}'`);
    // not one file past the cap (a sampled cap let a single call make 60,000 with 20,000 allowed)
    expect(result.stdout).toBe(
      `.:${shares.workspace}:No space left on device /tmp:${shares.tmp}:No space left on device /dev/shm:${shares.shm}:No space left on device\n`,
    );
    // reaching it ends the sandbox with the reason (the runner's RESOURCE_LIMIT)
    expect(sandbox.checkLimits()).toMatch(/^too many files: workspace holds the 1500 files and directories it may \(the sandbox may create 2000/);
    expect(result.returnCode).toBe(125);
  });

  it('has the kernel keep the open files of every process (EMFILE), by exec, the bash tool and the Python kernel', async () => {
    const sandbox = await create({ resources: { maxOpenFiles: 64 } });
    const openAll = 'import os\nfds = []\ntry:\n    while True: fds.append(os.open("/dev/null", os.O_RDONLY))\nexcept OSError as e:\n    print(len(fds), os.strerror(e.errno))';
    const exec = await sandbox.exec(`python3 -c '${openAll}'`);
    expect(exec.stdout).toMatch(/^\d+ Too many open files\n$/);
    expect(Number(exec.stdout.split(' ')[0])).toBeLessThan(64);
    const bash = await BashSession.start(sandbox);
    try {
      expect((await bash.run(`python3 -c '${openAll}'`)).output).toMatch(/^\d+ Too many open files\n$/);
      expect((await bash.run('ulimit -n; ulimit -Hn')).output).toBe('64\n64\n');
      // and it cannot be raised again from inside
      expect((await bash.run('ulimit -n 4096 2>&1; echo rc=$?')).output).toMatch(/rc=1/);
    } finally {
      await bash.close();
    }
    const kernel = await PythonKernel.start(sandbox);
    try {
      const result = await kernel.run(openAll);
      expect(result.stdout).toMatch(/^\d+ Too many open files\n$/);
    } finally {
      await kernel.close();
    }
    // the default holds where the spec says nothing
    const plain = await create();
    expect((await plain.exec('ulimit -n')).stdout).toBe('1024\n');
  });

  it('refuses, at create, a limit it cannot keep here, naming it, and leaves nothing behind', async () => {
    const sandboxDirs = () => sandboxDirRoots().flatMap((root) => readdirSync(root).filter((name) => name.startsWith('rollserve-rs-')));
    const before = sandboxDirs().length;
    const noCgroup = createBwrapProvider({ cgroups: false });
    expect(noCgroup.limits?.().totalMemoryMib).toBeUndefined();
    await expect(noCgroup.create({ resources: { totalMemoryMib: 256 } })).rejects.toThrow(
      /the bwrap sandbox provider cannot keep the limit totalMemoryMib \(total_memory_mib\) here/,
    );
    await expect(noCgroup.create({ resources: { cpus: 1 } })).rejects.toThrow(/cannot keep the limit cpus/);
    // its default is not applied there, and nothing is refused for it
    const sandbox = await noCgroup.create();
    expect((await sandbox.exec('echo ok')).stdout).toBe('ok\n');
    await sandbox.close();
    const hard = serviceHardLimit('Max open files');
    if (hard !== undefined) {
      await expect(create({ resources: { maxOpenFiles: hard + 1 } })).rejects.toThrow(`the service's own hard limit is ${hard}`);
    }
    expect(sandboxDirs().length).toBeLessThanOrEqual(before);
  });

  it.skipIf(!cgroupCpuSupport())('caps the CPUs of the sandbox as a whole: the kernel throttles it at its quota', async () => {
    const sandbox = await create({ resources: { cpus: 0.2 } });
    const own = readFileSync('/proc/self/cgroup', 'utf8').split('\n').find((line) => /^\d+:([^:]*,)?cpu(,[^:]*)?:/.test(line) || line.startsWith('0::'))!;
    const dir = cgroupSupport() === 1 ? join('/sys/fs/cgroup/cpu', own.split(':')[2]!, `rollserve-${sandbox.id}`) : join('/sys/fs/cgroup', own.split(':')[2]!, `rollserve-${sandbox.id}`);
    const stat = () => Object.fromEntries(readFileSync(join(dir, 'cpu.stat'), 'utf8').trim().split('\n').map((line) => line.split(' ') as [string, string]));
    expect(Number(stat().nr_throttled)).toBe(0);
    // two busy processes, each wanting a whole CPU: the sandbox may have a fifth of one
    await sandbox.exec('for i in 1 2; do (while :; do :; done) & done; sleep 1; kill $(jobs -p)', { timeoutMs: 10_000 });
    expect(Number(stat().nr_throttled)).toBeGreaterThan(0);
  });

  it('ends the whole process tree at a time limit, setsid and double forks included', async () => {
    const sandbox = await create();
    const ns = namespaceOf(sandbox);
    const result = await sandbox.exec('sleep 301 & (setsid sleep 302 &); sh -c "sleep 303 & wait" & sleep 304', { timeoutMs: 400 });
    expect(result.errorType).toBe('timeout');
    const sleepers = () => pidsInNamespace(ns).filter((pid) => cmdline(pid).startsWith('sleep'));
    expect(await until(() => sleepers().length === 0, 2000)).toBe(true);
    // a background process of a command that finished normally keeps running (like a server)
    await sandbox.exec('sleep 305 >/dev/null 2>&1 &');
    expect(await until(() => sleepers().length === 1, 2000)).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(sleepers().length).toBe(1);
  });

  it('ends a bash tool command tree at its time limit and keeps the shell', async () => {
    const sandbox = await create();
    const ns = namespaceOf(sandbox);
    const bash = await BashSession.start(sandbox);
    try {
      const result = await bash.run('sleep 311 & sleep 312', { timeoutMs: 300 });
      expect(result.timedOut).toBe(true);
      expect((await bash.run('echo back')).output).toBe('back\n');
      // the foreground job got Ctrl-C; a job the user put in the background keeps running, as in a terminal
      const sleepers = pidsInNamespace(ns).map(cmdline).filter((c) => c.startsWith('sleep'));
      expect(sleepers).toEqual(['sleep 311 ']);
    } finally {
      await bash.close();
    }
  });

  it("ends what a closed shell and kernel left behind, setsid'd, while the sandbox and its other sessions live on", async () => {
    const sandbox = await create();
    const ns = namespaceOf(sandbox);
    const sleepers = () => pidsInNamespace(ns).map(cmdline).filter((c) => c.startsWith('sleep')).sort();
    const closing = await BashSession.start(sandbox);
    const staying = await BashSession.start(sandbox);
    const kernel = await PythonKernel.start(sandbox);
    try {
      // out of their process groups and sessions: only the tag their environment carries finds them
      await closing.run('setsid sleep 401 >/dev/null 2>&1 < /dev/null &');
      await kernel.run('import subprocess\n_ = subprocess.Popen(["sleep", "402"], start_new_session=True)');
      await staying.run('setsid sleep 403 >/dev/null 2>&1 < /dev/null &');
      await sandbox.exec('setsid sleep 404 >/dev/null 2>&1 < /dev/null &');
      expect(await until(() => sleepers().length === 4, 1000)).toBe(true);
      await closing.close();
      await kernel.close();
      // (the sweep runs a moment after each end)
      expect(await until(() => sleepers().length === 2, 1000)).toBe(true);
      expect(sleepers()).toEqual(['sleep 403 ', 'sleep 404 ']);
      expect((await staying.run('echo still here')).output).toBe('still here\n');
    } finally {
      await staying.close();
    }
  });

  it('leaves no process and no temporary directory behind after close', async () => {
    const before = childrenOfTest().length;
    const sandbox = await create();
    const bash = await BashSession.start(sandbox);
    await bash.run('sleep 1000 &');
    await sandbox.exec('sleep 1001 >/dev/null 2>&1 &');
    const ns = namespaceOf(sandbox);
    const dir = sandboxDirRoots().map((root) => join(root, `rollserve-${sandbox.id}`)).find((path) => existsSync(path)) ?? join(tmpdir(), `rollserve-${sandbox.id}`);
    expect(existsSync(dir)).toBe(true);
    expect(pidsMentioning(sandbox.id).length).toBeGreaterThan(0);
    expect(pidsInNamespace(ns).length).toBeGreaterThanOrEqual(4);
    const cgroups = () => readdirSync('/sys/fs/cgroup/pids', { recursive: true }).filter((path) => String(path).endsWith(`rollserve-${sandbox.id}`));
    if (cgroupSupport() === 1) expect(cgroups()).toHaveLength(1);
    await bash.close();
    await sandbox.close();
    expect(existsSync(dir)).toBe(false);
    expect(cgroups()).toEqual([]);
    expect(pidsMentioning(sandbox.id)).toEqual([]);
    expect(pidsInNamespace(ns)).toEqual([]);
    if (process.env.RS_DEBUG) console.log("children", before, childrenOfTest().map(cmdline));
    expect(await until(() => childrenOfTest().length <= before, 2000)).toBe(true);
  });

  it('works rootless: the service itself running as an unprivileged user', async () => {
    if (process.getuid?.() !== 0) {
      console.warn('[sandbox security] the suite already runs unprivileged; the rootless case is the whole suite');
      return;
    }
    const script = [
      `import { createBwrapProvider } from ${JSON.stringify(join(import.meta.dirname, '../../packages/core/src/sandbox/index.ts'))};`,
      `import { BashSession } from ${JSON.stringify(join(import.meta.dirname, '../../packages/core/src/tools/index.ts'))};`,
      'const sandbox = await createBwrapProvider().create({ resources: { maxInodes: 2000, maxOpenFiles: 64 } });',
      "const exec = await sandbox.exec('id -u; grep \"Max processes\" /proc/self/limits; ulimit -n; touch /dev/x 2>&1');",
      'const bash = await BashSession.start(sandbox);',
      "const shell = await bash.run('echo from-bash');",
      'await bash.close();',
      `const files = await sandbox.exec(${JSON.stringify(`python3 -c '${makeFiles}'`)});`,
      'await sandbox.close();',
      'console.log(JSON.stringify({ exec, shell, files }));',
    ].join('\n');
    const child = spawnSync(
      'setpriv',
      ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '--import', 'tsx', '--input-type=module', '-e', script],
      { cwd: join(import.meta.dirname, '../..'), encoding: 'utf8', timeout: 20_000, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp' } },
    );
    expect(child.stderr).toBe('');
    const out = JSON.parse(child.stdout.trim().split('\n').at(-1)!) as { exec: { stdout: string }; shell: { output: string }; files: { stdout: string } };
    expect(out.exec.stdout).toMatch(/^65534\nMax processes\s+512\s+512.*\n64\ntouch: cannot touch '\/dev\/x': Read-only file system\n$/);
    expect(out.shell.output).toBe('from-bash\n');
    // the tmpfs inode counts hold rootless too
    const shares = inodeShares(2000);
    expect(out.files.stdout).toBe(`.:${shares.workspace}:No space left on device /tmp:${shares.tmp}:No space left on device /dev/shm:${shares.shm}:No space left on device\n`);
  });

  it('dies with the service: a killed parent takes its sandboxes along', async () => {
    const script = [
      `import { createBwrapProvider } from ${JSON.stringify(join(import.meta.dirname, '../../packages/core/src/sandbox/index.ts'))};`,
      'const sandbox = await createBwrapProvider().create();',
      "await sandbox.exec('sleep 1002 >/dev/null 2>&1 &');",
      'console.log(sandbox.id);',
      'setInterval(() => {}, 1000);',
    ].join('\n');
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'inherit'],
      cwd: join(import.meta.dirname, '../..'),
    });
    try {
      const id = await new Promise<string>((resolve, reject) => {
        let out = '';
        child.stdout!.on('data', (d: Buffer) => {
          out += d.toString();
          const match = /rs-[0-9a-f]+/.exec(out);
          if (match) resolve(match[0]);
        });
        child.on('exit', (code) => reject(new Error(`child exited with ${code}`)));
      });
      expect(pidsMentioning(id).length).toBeGreaterThan(0);
      // (the background sleep may still be a forked shell for a moment)
      expect(await until(() => pidsMentioning('sleep\u00001002').length === 1, 2000)).toBe(true);
      child.kill('SIGKILL');
      expect(await until(() => pidsMentioning(id).length === 0, 3000)).toBe(true);
      expect(await until(() => pidsMentioning('sleep\u00001002').length === 0, 3000)).toBe(true);
      // The killed processes may linger as zombies until PID 1 reaps them (under load, a while),
      // and a cgroup with a zombie in it cannot be removed yet: wait until they are all gone.
      const cgroupDirs = ['memory', 'pids', 'unified', ''].map((controller) => join('/sys/fs/cgroup', controller, `rollserve-${id}`)).filter((dir) => existsSync(dir));
      const emptied = () => cgroupDirs.every((dir) => !existsSync(dir) || readFileSync(join(dir, 'cgroup.procs'), 'utf8').trim() === '');
      expect(await until(emptied, 2_000)).toBe(true);
      // nobody was left to remove the temporary directory and the cgroup: the start-up sweep does
      const dir = sandboxDirRoots().map((root) => join(root, `rollserve-${id}`)).find((path) => existsSync(path)) ?? join(tmpdir(), `rollserve-${id}`);
      const removed = await removeStaleSandboxDirs({ minAgeMs: 0, ids: [id] });
      expect(removed).toContain(dir);
      expect(removed.filter((path) => path.startsWith('/sys/fs/cgroup/')).length).toBe(cgroupSupport() === 1 ? 2 : cgroupSupport() === 2 ? 1 : 0);
      expect(existsSync(dir)).toBe(false);
    } finally {
      child.kill('SIGKILL');
    }
  });
});
