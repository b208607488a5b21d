import { lstatSync, readdirSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { RolloutError } from '../../errors.ts';
import { shmMib } from '../limits.ts';
import { BASE_ENV, SOCKET_MOUNT, type ResolvedSandboxResources, type SandboxBind } from '../types.ts';

export const DEFAULT_HOST_ROOT_DIRS = ['usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'etc', 'opt'];
export const EXEC_DIR = '.exec';
/**
 * Where the service's files for the sandbox (command scripts, stdin, the kernel's source) appear:
 * a tmpfs the service writes from outside (see provider.ts), bound read-only, so nothing inside
 * can change a file or swap a path the service writes through.
 */
export const INPUT_MOUNT = '/run/rollserve-in';


export const DEVICES = ['null', 'zero', 'full', 'random', 'urandom', 'tty'];
/** Size of the sandbox's /dev tmpfs: device nodes and links only. */
const DEV_BYTES = 64 * 1024;
const IMAGE_SKIP = new Set(['proc', 'dev', 'tmp', 'sys', 'run']);

/** A top-level entry of the sandbox's root. */
export interface RootEntry {
  name: string;
  kind: 'dir' | 'file' | 'symlink';
  /** Link target, for symlinks. */
  target?: string;
}

/** Lists the top-level entries of `dir` that become the sandbox's read-only root. */
export function scanRoot(dir: string, include?: string[]): RootEntry[] {
  const names = include ?? readdirSync(dir).filter((name) => !IMAGE_SKIP.has(name));
  const entries: RootEntry[] = [];
  for (const name of names) {
    const path = join(dir, name);
    let stat;
    try {
      stat = lstatSync(path);
    } catch {
      continue;
    }
    if (stat.isSymbolicLink()) entries.push({ name, kind: 'symlink', target: readlinkSync(path) });
    else if (stat.isDirectory()) entries.push({ name, kind: 'dir' });
    else if (stat.isFile()) entries.push({ name, kind: 'file' });
  }
  return entries;
}

export interface BwrapArgsInput {
  /** Host directory holding the root entries (`/` or the image). */
  root: string;
  entries: RootEntry[];
  workdir: string;
  /**
   * Host directory of the service's files for the sandbox, bound read-only at INPUT_MOUNT: the
   * prefix mounts a tmpfs on it where it can (so that the sandbox's mount table shows no host
   * path), the host directory itself is bound otherwise.
   */
  inputHost: string;
  network: boolean;
  /**
   * The sandbox's writable places: host directories on which the prefix (mounts.ts) mounted
   * tmpfs mounts of set size and inode count, bound in (`workspace` absent with a writableRoot);
   * or, where no such prefix can run, the sizes for bwrap's own `--size --tmpfs` (no inode count).
   */
  writable: { mounted: { workspace?: string; tmp: string; shm: string; output: string } } | { sizes: Pick<ResolvedSandboxResources, 'workspaceMib' | 'tmpMib' | 'outputMib'> };
  binds?: SandboxBind[];
  /** Device names under /dev to bind in. @default null zero full random urandom tty */
  devices?: string[];
  /** The environment of the agent, so of every exec. @default BASE_ENV */
  env?: Record<string, string>;
  /** The command bwrap runs (the init). */
  command: string[];
  /**
   * A writable root (an image under the sandbox's own overlay layer) bound as `/` instead of the
   * read-only `entries`; the workdir is then a directory of it rather than a tmpfs.
   */
  writableRoot?: string;
  /** uid and gid inside the sandbox (an image's `User`). @default the caller's */
  ids?: { uid: number; gid: number };
}

/** The bwrap argv (without the binary) for a sandbox. Pure: unit-tested as is. */
export function buildBwrapArgs(input: BwrapArgsInput): string[] {
  const args = [
    '--unshare-user',
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-cgroup-try',
    ...(input.network ? [] : ['--unshare-net']),
    '--die-with-parent',
    '--new-session',
    '--hostname',
    'sandbox',
  ];
  if (input.ids !== undefined) args.push('--uid', String(input.ids.uid), '--gid', String(input.ids.gid));
  // bwrap starts as root of the overlay's namespace there: it would hand the sandbox its capabilities
  if (input.writableRoot !== undefined) args.push('--cap-drop', 'ALL', '--bind', input.writableRoot, '/');
  for (const entry of input.entries) {
    const dest = `/${entry.name}`;
    if (entry.kind === 'symlink') args.push('--symlink', entry.target!, dest);
    else args.push('--ro-bind', join(input.root, entry.name), dest);
  }
  args.push('--proc', '/proc');
  // /dev holds only the device nodes and links above: read-only (below), and small should that fail
  args.push('--size', String(DEV_BYTES), '--tmpfs', '/dev');
  for (const device of input.devices ?? DEVICES) args.push('--dev-bind', `/dev/${device}`, `/dev/${device}`);
  args.push(
    '--symlink', '/proc/self/fd', '/dev/fd',
    '--symlink', '/proc/self/fd/0', '/dev/stdin',
    '--symlink', '/proc/self/fd/1', '/dev/stdout',
    '--symlink', '/proc/self/fd/2', '/dev/stderr',
  );
  // Every writable place is a tmpfs of its own size and inode count, charged to the sandbox's
  // memory cgroup: a sandbox can fill none of the host's disks, and the service reaches these
  // through /proc/<init>/root.
  if ('mounted' in input.writable) {
    const m = input.writable.mounted;
    args.push('--bind', m.shm, '/dev/shm', '--bind', m.tmp, '/tmp');
    if (input.writableRoot === undefined) args.push('--bind', m.workspace!, input.workdir);
    else args.push('--dir', input.workdir);
    args.push('--bind', m.output, SOCKET_MOUNT);
  } else {
    const r = input.writable.sizes;
    const mib = 1024 * 1024;
    args.push(
      '--perms', '1777', '--size', String(shmMib(r) * mib), '--tmpfs', '/dev/shm',
      '--perms', '1777', '--size', String(r.tmpMib * mib), '--tmpfs', '/tmp',
      ...(input.writableRoot === undefined ? ['--size', String(r.workspaceMib * mib), '--tmpfs', input.workdir] : ['--dir', input.workdir]),
      '--size', String(r.outputMib * mib), '--tmpfs', SOCKET_MOUNT,
    );
  }
  // the exec agent's output directory, made by bwrap as the sandbox uid (a mkdir of the agent's
  // own was a fork and an exec per sandbox)
  args.push('--perms', '0700', '--dir', `${SOCKET_MOUNT}/${EXEC_DIR}`);
  args.push('--ro-bind', input.inputHost, INPUT_MOUNT);
  for (const bind of input.binds ?? []) args.push(bind.readOnly ? '--ro-bind' : '--bind', bind.host, bind.sandbox);
  args.push('--remount-ro', '/dev');
  if (input.writableRoot === undefined) args.push('--remount-ro', '/');
  args.push('--chdir', input.workdir, '--clearenv');
  for (const [key, value] of Object.entries(input.env ?? BASE_ENV)) args.push('--setenv', key, value);
  args.push('--info-fd', '3', '--', ...input.command);
  return args;
}

/**
 * The descriptor bwrap reads its options from (`--args`). Not 4: the overlay's sh setup
 * (image/overlay.ts) opens the image root there.
 */
export const ARGS_FD = 5;

/**
 * Splits buildBwrapArgs' output into bwrap's command line, which keeps only the command (bwrap
 * takes it from there alone), and the NUL-separated options it reads from ARGS_FD. The sandbox's
 * pid 1 is a fork of bwrap: its command line, readable inside at /proc/1/cmdline, would otherwise
 * name every host directory bound in. An option holding a NUL would become two options there, so
 * it is refused.
 */
export function bwrapArgsOnFd(args: string[], command: string[]): { argv: string[]; options: Buffer } {
  const end = args.length - command.length - 1;
  if (end < 0 || args[end] !== '--') throw new Error('bwrap arguments do not end with -- and the command');
  const options = args.slice(0, end);
  const bad = options.find((arg) => arg.includes('\0'));
  if (bad !== undefined) {
    throw new RolloutError({ code: 'SANDBOX', message: `a sandbox path or option holds a NUL character: ${JSON.stringify(bad)}` });
  }
  return { argv: ['--args', String(ARGS_FD), '--', ...command], options: Buffer.from(options.map((arg) => `${arg}\0`).join(''), 'utf8') };
}

/** prlimit arguments for the limits (prefix of every process that enters the sandbox). */

export interface BwrapEnterInput {
  initPid: number;
  /** Namespaces to join besides user, mount and pid. @default net ipc uts cgroup */
  namespaces?: EnterableNamespace[];
  /** `cgroup.procs` files the process joins first (as the service, before it drops privileges). */
  cgroupProcs?: string[];
  /** Set when the service runs as root: the uid and gid to drop to. */
  user?: { uid: number; gid: number };
}

/**
 * The host command prefix that runs a command inside a running bwrap sandbox. Pure. The limits
 * are applied after entering, by the in-sandbox wrapper (ulimitScript).
 */
export function buildEnterArgs(input: BwrapEnterInput): string[] {
  const namespaces = input.namespaces ?? ['net', 'ipc', 'uts', 'cgroup'];
  return [
    ...(input.cgroupProcs === undefined || input.cgroupProcs.length === 0 ? [] : joinCgroupArgs(input.cgroupProcs)),
    ...(input.user === undefined ? [] : dropPrivileges(input.user)),
    'nsenter',
    '-t',
    String(input.initPid),
    '-U',
    '-m',
    '-p',
    ...namespaces.map((ns) => NSENTER_FLAGS[ns]),
    '--preserve-credentials',
    '--',
  ];
}

const NSENTER_FLAGS: Record<EnterableNamespace, string> = { net: '-n', ipc: '-i', uts: '-u', cgroup: '-C' };

/** Namespaces besides user, mount and pid that a process entering a sandbox joins. */
export type EnterableNamespace = 'net' | 'ipc' | 'uts' | 'cgroup';

/**
 * The namespaces of `pid` (besides user, mount and pid) that differ from the service's own: all
 * of them but `net` for a sandbox with network, and `cgroup` where the kernel has none.
 */
export function ownNamespaces(pid: number): EnterableNamespace[] {
  const own: EnterableNamespace[] = [];
  for (const ns of ['net', 'ipc', 'uts', 'cgroup'] as const) {
    let theirs: string | undefined;
    try {
      theirs = readlinkSync(`/proc/${pid}/ns/${ns}`);
    } catch {
      continue;
    }
    if (theirs !== serviceNamespace(ns)) own.push(ns);
  }
  return own;
}

/** This process's namespaces, read once (it never changes them). */
const serviceNamespaces = new Map<string, string | undefined>();

function serviceNamespace(ns: string): string | undefined {
  if (!serviceNamespaces.has(ns)) {
    let ours: string | undefined;
    try {
      ours = readlinkSync(`/proc/self/ns/${ns}`);
    } catch {
      ours = undefined;
    }
    serviceNamespaces.set(ns, ours);
  }
  return serviceNamespaces.get(ns);
}

/** A host prefix that puts the process in the sandbox's cgroup before it enters the sandbox. */
function joinCgroupArgs(procsFiles: string[]): string[] {
  return [
    '/bin/sh',
    '-c',
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || { echo "rs-cgroup: cannot join $1" >&2; exit 125; }; shift; n=$((n-1)); done; exec "$@"',
    'rs-cgroup',
    String(procsFiles.length),
    ...procsFiles,
  ];
}

function dropPrivileges(user: { uid: number; gid: number }): string[] {
  return ['setpriv', `--reuid=${user.uid}`, `--regid=${user.gid}`, '--clear-groups', '--no-new-privs', '--'];
}

