import { closeSync, constants, lstatSync, openSync, readdirSync, readFileSync, readlinkSync, statfsSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { removeStaleCgroups } from './cgroup.ts';
import { readStat } from './process.ts';

/** The file in a sandbox's directory that names the process that made it. */
export const OWNER_FILE = 'owner';

/** A process as "<pid> <start time>": a pid reused by another process does not match. */
export function processIdentity(pid: number | 'self'): string | undefined {
  const stat = readStat(pid);
  return stat?.starttime === undefined ? undefined : `${stat.pid} ${stat.starttime}`;
}

const TMPFS_MAGIC = 0x01021994;
let shmDir: string | null | undefined;

/**
 * Where a provider whose sandboxes keep all their files in tmpfs mounts of their own puts their
 * directories (empty mount points, an owner file): /dev/shm where it is a tmpfs, so that making
 * and removing them costs no ext4 journal (≈ 0.6 ms of CPU and 1-5 ms of the event loop's time a
 * sandbox, measured here). Undefined elsewhere, and where the process was given a TMPDIR: a place
 * chosen for temporary files (a node's scratch disk, a job's own directory) is kept to.
 */
export function mountPointDir(): string | undefined {
  if (process.env.TMPDIR) return undefined;
  if (shmDir === undefined) {
    try {
      shmDir = statfsSync('/dev/shm').type === TMPFS_MAGIC ? '/dev/shm' : null;
    } catch {
      shmDir = null;
    }
  }
  return shmDir ?? undefined;
}

/** Where providers put sandbox directories by default: os.tmpdir(), and mountPointDir() where there is one. */
export function sandboxDirRoots(): string[] {
  const shm = mountPointDir();
  return shm === undefined || shm === tmpdir() ? [tmpdir()] : [tmpdir(), shm];
}

/**
 * Records in a sandbox's new directory which process made it: once that process is gone (a node or
 * service killed), the directory is stale at once, whatever its age.
 */
let selfIdentity: { pid: number; identity: string | undefined } | undefined;

export function markSandboxDir(dir: string): void {
  // (read once: this process's start time does not change)
  if (selfIdentity?.pid !== process.pid) selfIdentity = { pid: process.pid, identity: processIdentity('self') };
  const self = selfIdentity.identity;
  if (self !== undefined) writeFileSync(join(dir, OWNER_FILE), self, { flag: 'wx', mode: 0o644 });
}

/** Whether the process that made `dir` is known to be gone (false when the directory does not say). */
function ownerGone(dir: string): boolean {
  let owner: string;
  try {
    const fd = openSync(join(dir, OWNER_FILE), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      owner = readFileSync(fd, 'latin1').slice(0, 64).trim();
    } finally {
      closeSync(fd);
    }
  } catch {
    return false;
  }
  const pid = Number(owner.split(' ')[0]);
  return Number.isInteger(pid) && pid > 0 && processIdentity(pid) !== owner;
}

/**
 * Whether `pid` is a kernel fork server still running: not a zombie (a server killed with its
 * service waits, until the host's init reaps it, as one: on a host whose init reaps late, a
 * while), and not another process since given its pid (its command line names no fork server).
 */
function forkServerRunning(pid: number): boolean {
  const state = readStat(pid)?.state;
  if (state === undefined || state === 'Z' || state === 'X') return false;
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes('rollserve-forkserver');
  } catch {
    return false;
  }
}

/**
 * Removes the temporary directories and cgroups of sandboxes whose service died without closing
 * them (their processes died with it: see the bwrap provider's guard). A directory is stale when no process's
 * command line names it, none works in it (bwrap runs in its sandbox's directory: its command line
 * names no host path) and it is older than `minAgeMs` or the process that made it is gone (see
 * markSandboxDir); a cgroup when it is empty and that old, or its sandbox's directory was removed
 * here (an orphan's with it).
 * Call once at service start. Returns what it removed. `ids` limits it to those sandboxes;
 * `orphansOnly`: only directories whose maker is gone (see sweepOrphanedSandboxDirs).
 */
export async function removeStaleSandboxDirs(options: { tmpDir?: string; minAgeMs?: number; ids?: string[]; orphansOnly?: boolean } = {}): Promise<string[]> {
  const minAgeMs = options.minAgeMs ?? 60_000;
  const only = options.ids === undefined ? undefined : new Set(options.ids.map((id) => `rollserve-${id}`));
  const cgroups = options.orphansOnly ? [] : removeStaleCgroups({ minAgeMs, ...(only === undefined ? {} : { only: (name: string) => only.has(name) }) });
  // by default, every place a provider puts them
  const dirs = options.tmpDir !== undefined ? [options.tmpDir] : sandboxDirRoots();
  const paths: string[] = [];
  for (const root of dirs) {
    try {
      for (const name of readdirSync(root)) if (/^rollserve-rs-[0-9a-f]{12}$/.test(name) && (only === undefined || only.has(name))) paths.push(join(root, name));
    } catch {
      // no such directory
    }
  }
  // a kernel fork server's scratch IPython directory in the temporary directory (removed within
  // its first second): one whose server is gone, or that old, was left by a server killed at its
  // start. Swept with the default places only.
  const scratch: string[] = [];
  if (options.ids === undefined && options.tmpDir === undefined) {
    try {
      for (const name of readdirSync(tmpdir())) {
        const server = /^rollserve-forkserver-(\d+)-[\w]+$/.exec(name);
        if (server === null) continue;
        const path = join(tmpdir(), name);
        try {
          const stat = lstatSync(path);
          if (!stat.isDirectory() || (process.getuid !== undefined && process.getuid() !== 0 && stat.uid !== process.getuid())) continue;
          if (forkServerRunning(Number(server[1])) && Date.now() - stat.mtimeMs < minAgeMs) continue;
          await rm(path, { recursive: true, force: true });
          scratch.push(path);
        } catch {
          // removed meanwhile
        }
      }
    } catch {
      // no temporary directory
    }
  }
  const candidates = paths
    .filter((path) => {
      try {
        const stat = lstatSync(path);
        // another user's (whose processes' working directories we cannot see), unless we are root
        if (process.getuid !== undefined && process.getuid() !== 0 && stat.uid !== process.getuid()) return false;
        // young: maybe a sandbox being made right now (its bwrap not started yet), unless its maker is gone
        return options.orphansOnly ? ownerGone(path) : Date.now() - stat.mtimeMs >= minAgeMs || ownerGone(path);
      } catch {
        return false;
      }
    });
  if (candidates.length === 0) return [...cgroups, ...scratch];
  const cmdlines: string[] = [];
  const cwds: string[] = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      cmdlines.push(readFileSync(`/proc/${pid}/cmdline`, 'latin1'));
      cwds.push(readlinkSync(`/proc/${pid}/cwd`));
    } catch {
      // exited, or another user's
    }
  }
  const removed: string[] = [];
  for (const path of candidates) {
    if (cmdlines.some((cmdline) => cmdline.includes(path)) || cwds.some((cwd) => cwd === path || cwd.startsWith(`${path}/`))) continue;
    await rm(path, { recursive: true, force: true });
    removed.push(path);
  }
  // the cgroups of the sandboxes just removed, whatever their age (an orphan's too: nothing runs
  // its sandbox any more), where they are empty; the rest wait for their age
  const ended = new Set(removed.map((path) => basename(path)));
  const theirs = ended.size === 0 ? [] : removeStaleCgroups({ minAgeMs: 0, only: (name) => ended.has(name) });
  return [...cgroups, ...theirs, ...scratch, ...removed];
}

/**
 * Sweeps, every `everyMs`, the directories of sandboxes whose maker is gone (a node or service on
 * this host killed: its sandboxes died with it), so that they do not wait for the next start on
 * this host. Cheap while there are none: the owner files are read, /proc only when one is gone.
 */
export function sweepOrphanedSandboxDirs(everyMs = 30_000, options: { tmpDir?: string } = {}): () => void {
  let running = false;
  const timer = setInterval(() => {
    if (running) return;
    running = true;
    void removeStaleSandboxDirs({ ...options, orphansOnly: true })
      .catch(() => [])
      .finally(() => (running = false));
  }, everyMs).unref();
  return () => clearInterval(timer);
}

