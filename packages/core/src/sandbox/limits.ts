import { readFileSync } from 'node:fs';
import { RolloutError } from '../errors.ts';
import {
  DEFAULT_RESOURCES,
  type ResolvedSandboxResources,
  type ResolvedSandboxSpec,
  type SandboxLimit,
  type SandboxLimitSupport,
  type SandboxSpec,
} from './types.ts';

/** Every limit, with the name a task gives it (`limits.sandbox`) for messages. */
export const SANDBOX_LIMITS: Readonly<Record<SandboxLimit, string>> = {
  memoryMib: 'memory_mib',
  maxProcesses: 'max_processes',
  maxFileSizeMib: 'max_file_size_mib',
  cpuSeconds: 'cpu_seconds',
  maxOpenFiles: 'max_open_files',
  cpus: 'cpus',
  totalMemoryMib: 'total_memory_mib',
  workspaceMib: 'workspace_mib',
  tmpMib: 'tmp_mib',
  maxInodes: 'max_inodes',
  outputMib: 'output_mib',
};

const limitName = (limit: SandboxLimit): string =>
  limit === SANDBOX_LIMITS[limit] ? limit : `${limit} (${SANDBOX_LIMITS[limit]})`;

/** A spec a provider cannot keep: an INIT failure of the rollout, filtered (the operator's setup, not the policy). */
function refuse(message: string, limit: SandboxLimit): RolloutError {
  return new RolloutError({ code: 'SANDBOX', message, details: { limit } });
}

/**
 * The one place sandbox limits get their defaults. Checks every given value (a positive integer;
 * `cpus` may be fractional) and, with `provider`, refuses a limit the provider cannot keep,
 * naming it. Providers call this first thing in `create` and use only what it returns. A default
 * the provider cannot keep is left as is and not applied (see `SandboxResources`).
 */
export function resolveSandboxSpec(spec: SandboxSpec = {}, provider?: { name: string; limits: SandboxLimitSupport }): ResolvedSandboxSpec {
  const given = new Set<SandboxLimit>();
  const resources: ResolvedSandboxResources = { ...DEFAULT_RESOURCES };
  for (const [key, value] of Object.entries(spec.resources ?? {}) as Array<[string, unknown]>) {
    if (value === undefined) continue;
    if (!Object.hasOwn(SANDBOX_LIMITS, key)) {
      throw new RolloutError({ code: 'SANDBOX', message: `unknown sandbox limit "${key}" (known: ${Object.keys(SANDBOX_LIMITS).join(', ')})` });
    }
    const limit = key as SandboxLimit;
    const valid = typeof value === 'number' && (limit === 'cpus' ? Number.isFinite(value) && value > 0 : Number.isSafeInteger(value) && value > 0);
    if (!valid) throw refuse(`sandbox limit ${limitName(limit)} must be a positive ${limit === 'cpus' ? 'number' : 'integer'}, not ${JSON.stringify(value)}`, limit);
    if (limit === 'maxInodes' && (value as number) < MIN_INODES) {
      throw refuse(`sandbox limit ${limitName(limit)} must be at least ${MIN_INODES} (it is shared by the workspace, /tmp and /dev/shm), not ${value}`, limit);
    }
    given.add(limit);
    (resources as Record<SandboxLimit, number>)[limit] = value;
  }
  if (provider !== undefined) {
    for (const limit of given) {
      if (provider.limits[limit] === undefined) {
        const kept = Object.keys(provider.limits).map((name) => limitName(name as SandboxLimit));
        throw refuse(
          `the ${provider.name} sandbox provider cannot keep the limit ${limitName(limit)} here; it keeps ${kept.length === 0 ? 'none' : kept.join(', ')}. ` +
            'Remove the limit from the spec, or run the environment on a provider that keeps it.',
          limit,
        );
      }
    }
  }
  const { resources: _, ...rest } = spec;
  return { ...rest, resources, given };
}

/** The smallest `maxInodes`: enough for every share to be at least one file. */
const MIN_INODES = 20;

/**
 * How `maxInodes` is split between the tmpfs mounts that share it, as the count of files and
 * directories each may hold (its `nr_inodes` is one more: the mount's own root). Fixed shares,
 * so a task knows what each place holds: the workspace 75 %, `/tmp` 20 %, `/dev/shm` 5 %.
 */
export function inodeShares(maxInodes: number): { workspace: number; tmp: number; shm: number } {
  const shm = Math.max(1, Math.floor(maxInodes * 0.05));
  const tmp = Math.max(1, Math.floor(maxInodes * 0.2));
  return { workspace: Math.max(1, maxInodes - tmp - shm), tmp, shm };
}

/** `/dev/shm`'s size: a quarter of `/tmp`'s. */
export function shmMib(resources: Pick<ResolvedSandboxResources, 'tmpMib'>): number {
  return Math.max(1, Math.floor(resources.tmpMib / 4));
}

/**
 * The service's own hard limit of a resource (a sandbox cannot be given more: raising a hard
 * limit needs CAP_SYS_RESOURCE in the host's user namespace), or undefined when unlimited or
 * unknown. `name` as in /proc/self/limits ("Max open files").
 */
export function serviceHardLimit(name: string): number | undefined {
  let text: string;
  try {
    text = readFileSync('/proc/self/limits', 'utf8');
  } catch {
    return undefined;
  }
  const line = text.split('\n').find((l) => l.startsWith(name));
  const hard = line?.slice(name.length).trim().split(/\s+/)[1];
  return hard === undefined || !/^\d+$/.test(hard) ? undefined : Number(hard);
}

/**
 * Open files for a sandbox: a given value above the service's hard limit is refused (the kernel
 * would not grant it), the default is lowered to it.
 */
export function openFilesWithin(spec: ResolvedSandboxSpec, provider: string): number {
  const hard = serviceHardLimit('Max open files');
  const wanted = spec.resources.maxOpenFiles;
  if (hard === undefined || wanted <= hard) return wanted;
  if (spec.given.has('maxOpenFiles')) {
    throw refuse(
      `the ${provider} sandbox provider cannot keep the limit ${limitName('maxOpenFiles')} of ${wanted}: the service's own hard limit is ${hard} ` +
        '(raise it: ulimit -Hn, systemd LimitNOFILE=)',
      'maxOpenFiles',
    );
  }
  return hard;
}

/*
 * The per-process limits of a sandbox, in the two forms the providers need: `ulimit` calls run
 * inside the sandbox (bwrap, apptainer) and a `prlimit` prefix run on the host (local). A limit
 * that cannot be set fails the command (and the sandbox's start), never passes in silence.
 */

type Rlimits = Pick<ResolvedSandboxResources, 'memoryMib' | 'maxFileSizeMib' | 'cpuSeconds' | 'maxOpenFiles' | 'maxProcesses'>;

function ulimits(r: Rlimits, withNproc: boolean, failure: string): string {
  const fail = (what: string) => `{ echo "rs-limits: cannot set ${what}" >&2; ${failure}; }`;
  return [
    'ulimit -c 0 2>/dev/null',
    `ulimit -v ${r.memoryMib * 1024} || ${fail(`the address space to ${r.memoryMib} MiB`)}`,
    // 512-byte blocks
    `ulimit -f ${r.maxFileSizeMib * 2048} || ${fail(`the file size to ${r.maxFileSizeMib} MiB`)}`,
    `ulimit -t ${r.cpuSeconds} || ${fail(`the CPU time to ${r.cpuSeconds} s`)}`,
    `ulimit -n ${r.maxOpenFiles} || ${fail(`the open files to ${r.maxOpenFiles}`)}`,
    ...(withNproc ? [`{ ulimit -u ${r.maxProcesses} 2>/dev/null || ulimit -p ${r.maxProcesses}; } || ${fail(`the processes to ${r.maxProcesses}`)}`] : []),
  ].join('; ');
}

/**
 * The limits as POSIX sh `ulimit` calls, run INSIDE the sandbox's user namespace: RLIMIT_NPROC
 * then counts this sandbox only. (Set outside, before entering, it would count every sandbox's
 * processes of the uid, and setuid/execve fail with EAGAIN once 200 sandboxes run.) bash takes
 * `-u` for processes, dash and busybox `-p`. A limit that cannot be set runs `failure` (the
 * agent exits, an entering process exits 125).
 */
export function ulimitScript(resources: Rlimits, failure = 'exit 125'): string {
  return ulimits(resources, true, failure);
}

/** The limits as a `prlimit` prefix (the local provider: no user namespace, so no RLIMIT_NPROC). */
export function buildPrlimitArgs(resources: Omit<Rlimits, 'maxProcesses'>): string[] {
  const mib = 1024 * 1024;
  return [
    'prlimit',
    `--as=${resources.memoryMib * mib}`,
    `--fsize=${resources.maxFileSizeMib * mib}`,
    `--cpu=${resources.cpuSeconds}`,
    `--nofile=${resources.maxOpenFiles}`,
    '--core=0',
    '--',
  ];
}

/**
 * rlimits inside an apptainer instance. RLIMIT_NPROC is left alone: without a user namespace of
 * its own it would count every process of the user on the node.
 */
export function limitWrapper(resources: Omit<Rlimits, 'maxProcesses'> = resolveSandboxSpec().resources): string[] {
  return ['/bin/sh', '-c', `${ulimits({ ...resources, maxProcesses: 0 }, false, 'exit 125')}; exec "$@"`, 'rollserve-limits'];
}
