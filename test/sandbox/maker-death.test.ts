import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bwrapAvailable, removeStaleSandboxDirs } from '../../packages/core/src/sandbox/index.ts';
import { makeOciLayout, makeRootfs } from './image-fixtures.ts';

// A sandbox maker (a node, a service) SIGKILLed at any moment takes every process of its sandboxes
// along: the ones running commands, the ones starting, and the Python kernels entering them.
// bwrap's --die-with-parent alone left, now and then, a sandbox's first process blocked for ever
// (bubblewrap issue 633; see tmpfsPrefix's guard): the maker (maker-probe.ts) is killed at spread
// moments of its endless starts (plain sandboxes, with Python kernels, on an image), as itself
// and, when root, as an unprivileged user (whose sandboxes start another way: mounts.ts).

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip !== undefined) console.warn(`[sandbox maker death] skipping: ${skip}`);

const ROOT = join(import.meta.dirname, '../..');
const MODES = ['plain', 'kernels', 'image'] as const;
const ROUNDS = 18;

function read(path: string): string | undefined {
  try {
    return readFileSync(path, 'latin1');
  } catch {
    return undefined;
  }
}

/** The cgroup directories sandboxes get here (v1: memory and pids; v2: the unified one), by name. */
function cgroupDirs(name: string): string[] {
  const own = read('/proc/self/cgroup') ?? '';
  const dirs: string[] = [];
  for (const line of own.split('\n')) {
    const [, controllers, path] = line.split(':');
    if (path === undefined) continue;
    if (controllers === '') dirs.push(join('/sys/fs/cgroup', path, name), join('/sys/fs/cgroup/unified', path, name));
    for (const controller of ['memory', 'pids']) if (controllers!.split(',').includes(controller)) dirs.push(join('/sys/fs/cgroup', controller, path, name));
  }
  return dirs.filter((dir) => existsSync(join(dir, 'cgroup.procs')));
}

/**
 * What is left of the sandboxes made in `dir`: processes working in a sandbox's directory there
 * (bwrap and its first process do) or in a sandbox's cgroup (every process of it, and every
 * process that entered it).
 */
function leftIn(dir: string): number[] {
  const pids = new Set<number>();
  for (const name of existsSync(dir) ? readdirSync(dir).filter((n) => n.startsWith('rollserve-rs-')) : []) {
    for (const cgroup of cgroupDirs(name)) for (const pid of (read(join(cgroup, 'cgroup.procs')) ?? '').split('\n')) if (pid !== '') pids.add(Number(pid));
  }
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readlinkSync(`/proc/${pid}/cwd`).startsWith(`${dir}/`)) pids.add(Number(pid));
    } catch {
      // exited, or not ours to see
    }
  }
  // (a zombie is gone but for its parent's wait: the kernel has killed it)
  return [...pids].filter((pid) => !/^State:\s*Z/m.test(read(`/proc/${pid}/status`) ?? 'State: Z'));
}

function describeProcess(pid: number): string {
  const status = read(`/proc/${pid}/status`) ?? '';
  const field = (key: string) => new RegExp(`^${key}:\\s*(.*)$`, 'm').exec(status)?.[1]?.replaceAll('\t', ' ');
  return `${pid} ${field('Name')} (${field('State')}, PPid ${field('PPid')}, NSpid ${field('NSpid')}, wchan ${read(`/proc/${pid}/wchan`)})`;
}

async function until(check: () => boolean, timeoutMs: number): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (check()) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return check();
}

describe.skipIf(skip !== undefined)('a sandbox maker SIGKILLed', () => {
  const dirs: string[] = [];
  let images: string;
  beforeAll(() => {
    images = mkdtempSync(join(tmpdir(), 'rollserve-maker-images-'));
    // the unprivileged maker reads the layout and has an image cache of its own
    chmodSync(images, 0o755);
    makeRootfs(join(images, 'rootfs'));
    makeOciLayout(join(images, 'rootfs'), join(images, 'layout'), { tag: 'v1', env: ['PATH=/bin'] });
    mkdirSync(join(images, 'cache'), { mode: 0o700 });
    mkdirSync(join(images, 'cache-65534'), { mode: 0o700 });
    if (process.getuid?.() === 0) chownSync(join(images, 'cache-65534'), 65534, 65534);
  }, 60_000);

  afterAll(async () => {
    for (const dir of dirs) {
      // whatever a failed round left: killed by pid (found under its own directory), then swept
      for (const pid of leftIn(dir)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await until(() => leftIn(dir).length === 0, 5_000);
      const ids = existsSync(dir) ? readdirSync(dir).filter((n) => n.startsWith('rollserve-rs-')).map((n) => n.slice('rollserve-'.length)) : [];
      if (ids.length > 0) await removeStaleSandboxDirs({ tmpDir: dir, minAgeMs: 0, ids });
      rmSync(dir, { recursive: true, force: true });
    }
    if (images) rmSync(images, { recursive: true, force: true });
    // what a maker killed while its kernel fork server started left in the temporary directory (the
    // server's scratch IPython directory), as a service's or node's sweep removes it
    await removeStaleSandboxDirs({ orphansOnly: true });
  });

  it('at any moment of its sandboxes\' starts and commands leaves nothing of them running', async () => {
    const unprivileged = process.getuid?.() === 0;
    const failures: string[] = [];
    let made = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const dir = mkdtempSync(join(tmpdir(), 'rollserve-maker-'));
      dirs.push(dir);
      // the sandbox uid (and the unprivileged maker) make their directories there
      chmodSync(dir, 0o1777);
      const asUser = unprivileged && round % 2 === 1;
      const mode = MODES[Math.floor(round / 2) % MODES.length]!;
      const image = [`oci:${images}/layout:v1`, join(images, asUser ? 'cache-65534' : 'cache')];
      const argv = [process.execPath, '--import', 'tsx', join(import.meta.dirname, 'maker-probe.ts'), dir, mode, ...image];
      const maker: ChildProcess = asUser
        ? spawn('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', ...argv], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp' } })
        : spawn(argv[0]!, argv.slice(1), { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      maker.stdout!.on('data', (chunk: Buffer) => (out += chunk));
      maker.stderr!.on('data', (chunk: Buffer) => (err += chunk));
      const exited = new Promise((resolve) => maker.once('exit', resolve));
      try {
        // once its first sandbox runs (the provider is up), at a moment spread over the rounds
        const first = await until(() => out.includes('made ') || maker.exitCode !== null, 30_000);
        expect(first && maker.exitCode === null, `the maker made no sandbox: ${err}`).toBe(true);
        await new Promise((resolve) => setTimeout(resolve, (round * 37) % 450));
      } finally {
        maker.kill('SIGKILL');
        await exited;
      }
      made += out.split('\n').filter((line) => line.startsWith('made ')).length;
      if (!(await until(() => leftIn(dir).length === 0, 5_000))) {
        failures.push(`round ${round} (${mode}, ${asUser ? 'unprivileged' : 'as the suite'}): ${leftIn(dir).map(describeProcess).join('; ')}`);
      }
    }
    expect(made).toBeGreaterThan(ROUNDS);
    expect(failures).toEqual([]);
  }, 300_000);
});
