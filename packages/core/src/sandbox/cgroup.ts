import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/*
 * Per-sandbox control groups: the memory of the sandbox as a whole (processes, page cache and its
 * tmpfs files alike) and its process count, which rlimits cannot give (RLIMIT_AS is per process).
 *
 * cgroup v2 is used where the service's own cgroup delegates the memory and pids controllers to
 * its children (cgroup.subtree_control lists them: systemd's Delegate=yes, or a container runtime
 * that hands out a writable cgroup); cgroup v1 where the memory and pids hierarchies are mounted and
 * writable (a root service on a hybrid host, as on this project's CI). Elsewhere there is no
 * cgroup: the sandbox's total memory is not kept (a spec giving `totalMemoryMib` is refused), and
 * the rlimits per process inside the sandbox's user namespace and the tmpfs caps hold. The
 * kernel memory of open files is charged to the memory cgroup too (measured: 20,000 open files
 * of one process, ≈ 5 MiB).
 */

export interface CgroupLimits {
  memoryBytes: number;
  maxProcesses: number;
  /** CPUs of the sandbox as a whole (a CFS quota per 100 ms period); only where `cgroupCpuSupport()`. */
  cpus?: number;
}

export interface SandboxCgroup {
  readonly version: 1 | 2;
  /** The `cgroup.procs` files a process is written to, to join. */
  readonly procsFiles: string[];
  /** Moves a running process (its thread group) in. */
  join(pid: number): void;
  /**
   * The host pids of every process in it (its first `cgroup.procs`), or undefined when it cannot
   * be read (removed): what a sweep of the sandbox's processes looks at, rather than all of /proc.
   */
  pids(): number[] | undefined;
  /** Why the sandbox ran out of something, once it did; undefined while within its limits. */
  exceeded(): string | undefined;
  /** Removes the group (once its processes are gone; retried by the caller). */
  remove(): boolean;
}

interface Backend {
  version: 1 | 2;
  /** Parent directories: v2 one, v1 memory and pids. */
  memory: string;
  pids: string;
  /** The cpu controller's parent directory, where it is delegated too (v2: the same one). */
  cpu?: string;
}

let detected: Backend | null | undefined;

function ownPath(controller: string | null): string | undefined {
  let text: string;
  try {
    text = readFileSync('/proc/self/cgroup', 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    const [, controllers, path] = line.split(':');
    if (path === undefined) continue;
    if (controller === null ? controllers === '' && line.startsWith('0::') : controllers!.split(',').includes(controller)) return path;
  }
  return undefined;
}

function writable(dir: string): boolean {
  const probe = join(dir, `rollserve-probe-${process.pid}`);
  try {
    mkdirSync(probe);
    rmdirSync(probe);
    return true;
  } catch {
    return false;
  }
}

function detect(): Backend | null {
  if (process.platform !== 'linux' || process.env.ROLLSERVE_CGROUP === 'off') return null;
  // v2: the unified hierarchy at /sys/fs/cgroup (pure v2) or /sys/fs/cgroup/unified (hybrid)
  const v2Path = ownPath(null);
  if (v2Path !== undefined) {
    for (const mount of ['/sys/fs/cgroup', '/sys/fs/cgroup/unified']) {
      const dir = join(mount, v2Path);
      try {
        const delegated = readFileSync(join(dir, 'cgroup.subtree_control'), 'utf8').split(/\s+/);
        if (delegated.includes('memory') && delegated.includes('pids') && writable(dir)) {
          return { version: 2, memory: dir, pids: dir, ...(delegated.includes('cpu') ? { cpu: dir } : {}) };
        }
      } catch {
        // not this mount
      }
    }
  }
  const memoryPath = ownPath('memory');
  const pidsPath = ownPath('pids');
  if (memoryPath !== undefined && pidsPath !== undefined) {
    const memory = join('/sys/fs/cgroup/memory', memoryPath);
    const pids = join('/sys/fs/cgroup/pids', pidsPath);
    if (writable(memory) && writable(pids)) {
      const cpuPath = ownPath('cpu');
      const cpu = cpuPath === undefined ? undefined : join('/sys/fs/cgroup/cpu', cpuPath);
      return { version: 1, memory, pids, ...(cpu !== undefined && existsSync(join(cpu, 'cpu.cfs_quota_us')) && writable(cpu) ? { cpu } : {}) };
    }
  }
  return null;
}

/** Which cgroup version sandboxes get here: 2, 1, or null for the rlimit fallback. */
export function cgroupSupport(): 1 | 2 | null {
  detected ??= detect();
  return detected?.version ?? null;
}

/** Whether a sandbox's cgroup can cap its CPUs here (the cpu controller is delegated as well). */
export function cgroupCpuSupport(): boolean {
  detected ??= detect();
  return detected?.cpu !== undefined;
}

const CPU_PERIOD_US = 100_000;

function readCount(file: string, key: string): number {
  try {
    const match = new RegExp(`^${key} (\\d+)$`, 'm').exec(readFileSync(file, 'utf8'));
    return match === null ? 0 : Number(match[1]);
  } catch {
    return 0;
  }
}

/** Creates the cgroup of one sandbox, or returns undefined where none can be had. */
export function createSandboxCgroup(name: string, limits: CgroupLimits): SandboxCgroup | undefined {
  detected ??= detect();
  const backend = detected;
  if (backend === null) return undefined;
  if (limits.cpus !== undefined && backend.cpu === undefined) return undefined;
  const memoryDir = join(backend.memory, name);
  const pidsDir = join(backend.pids, name);
  // (v1: a cpu group only for a sandbox that has a CPU limit)
  const cpuDir = limits.cpus !== undefined && backend.version === 1 ? join(backend.cpu!, name) : undefined;
  const dirs = backend.version === 2 ? [memoryDir] : [memoryDir, pidsDir, ...(cpuDir === undefined ? [] : [cpuDir])];
  const quota = limits.cpus === undefined ? undefined : String(Math.max(1000, Math.round(limits.cpus * CPU_PERIOD_US)));
  try {
    for (const dir of dirs) mkdirSync(dir);
    if (backend.version === 2) {
      writeFileSync(join(memoryDir, 'memory.max'), String(limits.memoryBytes));
      // no swap: the limit is the limit
      try {
        writeFileSync(join(memoryDir, 'memory.swap.max'), '0');
      } catch {
        // no swap accounting
      }
      writeFileSync(join(memoryDir, 'pids.max'), String(limits.maxProcesses));
      if (quota !== undefined) writeFileSync(join(memoryDir, 'cpu.max'), `${quota} ${CPU_PERIOD_US}`);
    } else {
      writeFileSync(join(memoryDir, 'memory.limit_in_bytes'), String(limits.memoryBytes));
      writeFileSync(join(pidsDir, 'pids.max'), String(limits.maxProcesses));
      if (cpuDir !== undefined) {
        writeFileSync(join(cpuDir, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
        writeFileSync(join(cpuDir, 'cpu.cfs_quota_us'), quota!);
      }
    }
  } catch {
    for (const dir of dirs) {
      try {
        rmdirSync(dir);
      } catch {
        // not made
      }
    }
    return undefined;
  }
  const procsFiles = dirs.map((dir) => join(dir, 'cgroup.procs'));
  const mib = Math.round(limits.memoryBytes / (1024 * 1024));
  return {
    version: backend.version,
    procsFiles,
    join(pid: number) {
      for (const file of procsFiles) writeFileSync(file, String(pid));
    },
    pids() {
      let text: string;
      try {
        text = readFileSync(procsFiles[0]!, 'latin1');
      } catch {
        return undefined;
      }
      const pids: number[] = [];
      for (const line of text.split('\n')) if (line !== '') pids.push(Number(line));
      return pids;
    },
    exceeded() {
      const oomKills =
        backend.version === 2 ? readCount(join(memoryDir, 'memory.events'), 'oom_kill') : readCount(join(memoryDir, 'memory.oom_control'), 'oom_kill');
      if (oomKills > 0) return `memory limit exceeded: the sandbox as a whole may use ${mib} MiB, and the kernel ended a process that went past it`;
      return undefined;
    },
    remove() {
      let removed = true;
      for (const dir of dirs) {
        try {
          rmdirSync(dir);
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== 'ENOENT') removed = false;
        }
      }
      return removed;
    },
  };
}

/**
 * Removes the empty cgroups of sandboxes whose service died without removing them (older than
 * `minAgeMs`: a group is empty for a moment between its creation and its sandbox's start).
 */
export function removeStaleCgroups(options: { minAgeMs?: number; only?: (name: string) => boolean } = {}): string[] {
  detected ??= detect();
  if (detected === null) return [];
  const minAgeMs = options.minAgeMs ?? 60_000;
  const removed: string[] = [];
  for (const parent of new Set([detected.memory, detected.pids, ...(detected.cpu === undefined ? [] : [detected.cpu])])) {
    let names: string[];
    try {
      names = readdirSync(parent).filter((name) => /^rollserve-rs-[0-9a-f]{12}$/.test(name) && (options.only?.(name) ?? true));
    } catch {
      continue;
    }
    for (const name of names) {
      const dir = join(parent, name);
      try {
        if (Date.now() - lstatSync(dir).mtimeMs < minAgeMs) continue;
        rmdirSync(dir); // fails while a process is in it
        removed.push(dir);
      } catch {
        // in use, or gone
      }
    }
  }
  return removed;
}
