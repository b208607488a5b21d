import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chownSync, existsSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { markSandboxDir } from '../staging.ts';

/*
 * The sandbox's writable places are tmpfs mounts whose size AND inode count the kernel keeps:
 * past either, creating or growing a file fails with ENOSPC. bubblewrap 0.8 (Debian 12) has
 * `--size` but no way to set `nr_inodes`, so the service mounts them itself, before bwrap, the
 * way image/overlay.ts mounts an image's writable layer: a perl (perl-base is Essential in
 * Debian) that enters a new user and mount namespace (the caller's uid mapped to itself), mounts
 * each tmpfs on an empty directory of the sandbox's own, and execs bwrap, which binds them in.
 * The last such prefix before bwrap also guards it (`guard`: it forks bwrap as pid 1 of a pid
 * namespace and stays as its parent), so that nothing of a sandbox outlives its maker. The bwrap
 * provider's spawner (spawner.ts) runs this program in a fork of its own rather than in a new
 * perl, and is the maker the guard checks. As root the spawner forks it as pid 1 of a pid
 * namespace of its own (`guard.aliveFd`): the spawner is then the guard, and the program forks
 * nothing (an unprivileged spawner may make no pid namespace: the guard forks as before).
 *
 * - The mounts exist only in that namespace (the host sees empty directories) and are owned by
 *   it: the sandbox, in bwrap's nested user namespace, can neither remount them larger nor
 *   unmount them (they are locked into its mount namespace).
 * - The uid is mapped to itself, not to root: mount(2) needs only the capabilities a new user
 *   namespace gives its creator until it execs, and bwrap, exec'd as the same non-root uid,
 *   keeps none. bwrap then runs exactly as it would without the prefix.
 * - On an image the prefix comes after the overlay's (whose namespace maps the caller to root),
 *   and `remount` also puts the inode count on the overlay's writable layer.
 * - A root service mounts them as root instead (`asRoot`), in a mount namespace of its own and no
 *   user namespace, owned by the sandbox uid, then drops to that uid and execs bwrap: the input
 *   directory must be such a mount (the service writes there as root, and a tmpfs of a user
 *   namespace creates no file for a uid it does not map: EOVERFLOW), and one namespace is cheaper
 *   than two. On an image the input tmpfs alone is mounted so, before the overlay's setup.
 *
 * Measured here (Linux 6.18, bwrap 0.8, 2 cores): works for a root service (the sandbox uid 65534)
 * and an unprivileged one alike; the prefix costs ≈ 3 ms of a sandbox's start (spawning it with
 * four mounts and /bin/true: 5.4 ms, /bin/true alone: 2.4 ms). The guard adds a fork, a pid
 * namespace and a /proc mount (≈ 0.5-1.5 ms, measured under load) and a perl that waits (≈ 0.6 MB
 * of private memory, charged to the sandbox's cgroup). Without the guard's process and fork (as
 * root, in the spawner's pid namespace) and with the mount points in a scratch tmpfs (`scratch`),
 * the prefix's perl costs 1.7-2.0 ms of CPU a sandbox against 4.2-4.7 (perf, README "Sandboxes").
 */

export interface TmpfsMount {
  /** An empty host directory of the sandbox's own; the tmpfs is mounted on it in the namespace only. */
  dir: string;
  sizeBytes: number;
  /** The mount's `nr_inodes`: files and directories, its own root included. */
  inodes: number;
  /** Octal mode of the mount's root. */
  mode: string;
  /** Owner of the mount's root. @default whoever mounts it */
  owner?: { uid: number; gid: number };
}

function mountOptions(mount: TmpfsMount): string {
  return `size=${mount.sizeBytes},nr_inodes=${mount.inodes},mode=${mount.mode}${mount.owner === undefined ? '' : `,uid=${mount.owner.uid},gid=${mount.owner.gid}`}`;
}

/**
 * The syscalls the perl programs make by number, by architecture (asm-generic for arm64 and
 * riscv64; pidfd_open 434, close_range 436 and pidfd_getfd 438 are the same everywhere).
 */
export type Syscalls = {
  unshare: number;
  mount: number;
  prctl: number;
  setgroups: number;
  signalfd4: number;
  setns: number;
  ioctl: number;
  capset: number;
  prlimit64: number;
  read: number;
  close: number;
  dup3: number;
  rt_sigprocmask: number;
  setsid: number;
  exit_group: number;
};
export const SYSCALLS: Partial<Record<NodeJS.Architecture, Syscalls>> = {
  x64: { unshare: 272, mount: 165, prctl: 157, setgroups: 116, signalfd4: 289, setns: 308, ioctl: 16, capset: 126, prlimit64: 302, read: 0, close: 3, dup3: 292, rt_sigprocmask: 14, setsid: 112, exit_group: 231 },
  arm64: { unshare: 97, mount: 40, prctl: 167, setgroups: 159, signalfd4: 74, setns: 268, ioctl: 29, capset: 91, prlimit64: 261, read: 63, close: 57, dup3: 24, rt_sigprocmask: 135, setsid: 157, exit_group: 94 },
  riscv64: { unshare: 97, mount: 40, prctl: 167, setgroups: 159, signalfd4: 74, setns: 268, ioctl: 29, capset: 91, prlimit64: 261, read: 63, close: 57, dup3: 24, rt_sigprocmask: 135, setsid: 157, exit_group: 94 },
};

const works = new Map<string, boolean>();

/**
 * Whether the sized tmpfs mounts can be made here: perl and the syscall numbers are there, and a
 * user namespace of `user` (the sandbox uid of a root service; the service's own otherwise) may
 * mount (not so where unprivileged user namespaces are restricted, e.g. by AppArmor, and bwrap is
 * setuid), and, given `user`, root may mount in a mount namespace of its own and drop to it.
 * Tried once per uid, by mounting tiny tmpfs mounts. Where it fails only bwrap's `--size` holds,
 * `maxInodes` is not kept, and the input directory is a bound host directory.
 */
export function tmpfsMountsAvailable(user?: { uid: number; gid: number }): boolean {
  const key = `${user?.uid ?? process.getuid?.()}:${user?.gid ?? process.getgid?.()}`;
  let known = works.get(key);
  if (known === undefined) {
    known = false;
    if (SYSCALLS[process.arch] !== undefined && existsSync('/usr/bin/perl')) {
      let dir: string | undefined;
      try {
        // named as a sandbox's directory: a service killed mid-probe leaves one the start-up sweep removes
        dir = join(tmpdir(), `rollserve-rs-${randomBytes(6).toString('hex')}`);
        mkdirSync(dir, { mode: 0o700 });
        markSandboxDir(dir);
        if (user !== undefined) chownSync(dir, user.uid, user.gid);
        const tiny = { dir, sizeBytes: 4096, inodes: 2, mode: '0700' };
        // as root: the root step (on which the user's step then mounts again), run as root
        const prefix = tmpfsPrefix([tiny], { unshare: true, guard: { maker: process.pid }, ...(user === undefined ? {} : { asRoot: { mounts: [{ ...tiny, owner: user }], dropTo: user } }) });
        const probe = spawnSync(prefix[0]!, [...prefix.slice(1), '/bin/true'], { stdio: 'ignore', timeout: 10_000 });
        known = probe.status === 0;
      } catch {
        known = false;
      } finally {
        if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
      }
    }
    works.set(key, known);
  }
  return known;
}

const MS_REMOUNT = 32;

// argv: <maker pid, 0: no guard> <descriptor to wait on|-> <maker's pipe|-> (see `guard`); <scratch
// dir|-> <its options|-> (see `scratch`); <root mounts> <uid|->
// <gid|-> then per root mount <dir> <options>; then <unshare 0|1> <working directory> <count>
// then per mount <dir> <options> <remount 0|1>; then the command
const perlSetup = (nr: Syscalls): string =>
  [
    'my ($maker, $wait, $made) = splice(@ARGV, 0, 3);',
    // the mount points, made in a small tmpfs of the namespace rather than on the host
    'my ($scratch, $sopts) = splice(@ARGV, 0, 2);',
    'my $point = sub {',
    '  return if $scratch eq "-";',
    `  if (defined $sopts) { syscall(${nr.mount}, my $s = "rs-tmpfs", my $t = $scratch, my $f = "tmpfs", 0, my $o = $sopts) == 0 or die "rs-tmpfs: cannot mount a tmpfs ($sopts) on $scratch: $!\\n"; undef $sopts }`,
    '  mkdir($_[0], 0700) or die "rs-tmpfs: cannot make $_[0]: $!\\n";',
    '};',
    'my ($rn, $ruid, $rgid) = splice(@ARGV, 0, 3);',
    // the guard's pid namespace is made where this process still may (CAP_SYS_ADMIN): as root,
    // before the drop (the guard forks there, so that its child mounts /proc as root), else with
    // the fresh user namespace, else (root of the overlay's namespace) before the mounts
    'my $early = $maker && $ruid ne "-";',
    'my ($pidns, $alive) = (0, undef);',
    // made: this process is pid 1 of a pid namespace its maker made as it forked it (the spawner,
    // as root), so it is the guard's child already: no guard process, no fork; the pipe $made
    // ends (reads EOF) with the maker, as the guard's would
    'if ($made ne "-") { open($alive, "<&=", $made) or die "rs-tmpfs: pipe $made: $!\\n"; $pidns = 1 }',
    'my $guard = sub {',
    `  if ($made ne "-") { syscall(${nr.mount}, my $s = "proc", my $t = "/proc", my $f = "proc", 14, 0) == 0 or die "rs-tmpfs: cannot mount /proc: $!\\n"; return }`,
    // PR_SET_PDEATHSIG, SIGKILL: armed after this process's last change of ids, then checked
    `  syscall(${nr.prctl}, 1, 9, 0, 0, 0) == 0 or die "rs-tmpfs: prctl: $!\\n";`,
    '  getppid() == $maker or exit 1;',
    // the maker writes bwrap's options once this process is in the sandbox's cgroup: the child joins it too
    '  if ($wait ne "-") { my $r = ""; vec($r, $wait, 1) = 1; select($r, undef, undef, undef) }',
    '  pipe($alive, my $keep) or die "rs-tmpfs: pipe: $!\\n";',
    '  my $pid = fork() // die "rs-tmpfs: fork: $!\\n";',
    '  if ($pid) {',
    '    close $alive; waitpid($pid, 0);',
    '    exit(($? & 127) ? 128 + ($? & 127) : $? >> 8);',
    '  }',
    '  close $keep;',
    // bwrap reads /proc/<its child>/ns with its child's pid in this namespace (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    `  syscall(${nr.mount}, my $s = "proc", my $t = "/proc", my $f = "proc", 14, 0) == 0 or die "rs-tmpfs: cannot mount /proc: $!\\n";`,
    '};',
    'if ($rn > 0 || $early) {',
    // CLONE_NEWNS (and CLONE_NEWPID for the guard): these mounts belong to the host's user namespace
    `  syscall(${nr.unshare}, 0x00020000 | ($early && !$pidns ? 0x20000000 : 0)) == 0 or die "rs-tmpfs: unshare: $!\\n";`,
    '  $pidns ||= $early;',
    `  syscall(${nr.mount}, my $s = "none", my $t = "/", 0, 16384 | 262144, 0) == 0 or die "rs-tmpfs: cannot make / private: $!\\n";`,
    '  for (1 .. $rn) {',
    '    my ($dir, $opts) = splice(@ARGV, 0, 2);',
    '    $point->($dir);',
    `    syscall(${nr.mount}, my $s = "rs-tmpfs", my $t = $dir, my $f = "tmpfs", 0, my $o = $opts) == 0 or die "rs-tmpfs: cannot mount a tmpfs ($opts) on $dir: $!\\n";`,
    '  }',
    '}',
    '$guard->() if $early;',
    'if ($ruid ne "-") {',
    // no supplementary groups (setgroups(0, NULL), as Node's spawn), then the gid, then the uid
    `  syscall(${nr.setgroups}, 0, 0) == 0 or die "rs-tmpfs: setgroups: $!\\n";`,
    '  $) = $rgid; $( = $rgid; ($<, $>) = ($ruid, $ruid);',
    '  $< == $ruid && $> == $ruid && $( == $rgid or die "rs-tmpfs: cannot drop to $ruid:$rgid\\n";',
    // PR_SET_DUMPABLE: a process that changed its ids may not write its /proc/self maps otherwise
    `  syscall(${nr.prctl}, 4, 1, 0, 0, 0) == 0 or die "rs-tmpfs: prctl: $!\\n";`,
    '}',
    'my ($fresh, $cwd, $n) = splice(@ARGV, 0, 3);',
    'if ($fresh) {',
    '  my ($uid, $gid) = ($<, (split " ", $()[0]);',
    '  my $pid = $maker && !$pidns;',
    `  syscall(${nr.unshare}, 0x10000000 | 0x00020000 | ($pid ? 0x20000000 : 0)) == 0 or die "rs-tmpfs: unshare: $!\\n";`,
    '  $pidns ||= $pid;',
    '  my $put = sub { open(my $f, ">", $_[0]) or die "rs-tmpfs: $_[0]: $!\\n"; print $f $_[1]; close($f) or die "rs-tmpfs: $_[0]: $!\\n" };',
    '  $put->("/proc/self/setgroups", "deny"); $put->("/proc/self/uid_map", "$uid $uid 1"); $put->("/proc/self/gid_map", "$gid $gid 1");',
    // MS_REC | MS_PRIVATE: nothing mounted here reaches the host
    `  syscall(${nr.mount}, my $s = "none", my $t = "/", 0, 16384 | 262144, 0) == 0 or die "rs-tmpfs: cannot make / private: $!\\n";`,
    '}',
    `if ($maker && !$pidns) { syscall(${nr.unshare}, 0x20000000) == 0 or die "rs-tmpfs: unshare: $!\\n"; $pidns = 1 }`,
    'for (1 .. $n) {',
    '  my ($dir, $opts, $re) = splice(@ARGV, 0, 3);',
    '  $point->($dir) unless $re;',
    // copies: syscall() wants writable scalars for its string arguments
    `  syscall(${nr.mount}, my $s = "rs-tmpfs", my $t = $dir, my $f = "tmpfs", $re ? ${MS_REMOUNT} : 0, my $o = $opts) == 0 or die "rs-tmpfs: cannot mount a tmpfs ($opts) on $dir: $!\\n";`,
    '}',
    '$guard->() if $maker && !$early;',
    'chdir($cwd) or die "rs-tmpfs: cannot enter $cwd: $!\\n";',
    'if ($maker) {',
    // the guard's death kills this process, bwrap by then: armed after the last change of ids, then
    // checked (the guard, outside this pid namespace, is no parent getppid() can name: the pipe's
    // other end closes with it)
    `  syscall(${nr.prctl}, 1, 9, 0, 0, 0) == 0 or die "rs-tmpfs: prctl: $!\\n";`,
    '  my $r = ""; vec($r, fileno($alive), 1) = 1; select($r, undef, undef, 0) == 0 or exit 1;',
    // (the maker's pipe, not close-on-exec: the sandbox gets none of the maker's descriptors)
    '  close($alive) if $made ne "-";',
    '}',
    'exec { $ARGV[0] } @ARGV or die "rs-tmpfs: cannot run $ARGV[0]: $!\\n";',
  ].join('\n');

let setupSource: string | undefined;

/**
 * The perl program of `tmpfsPrefix` (its argv's third element): the spawner (spawner.ts) runs it
 * in a fork of its own rather than in a new perl. Undefined where the architecture's syscall
 * numbers are unknown.
 */
export function tmpfsSetupSource(): string | undefined {
  const nr = SYSCALLS[process.arch];
  return nr === undefined ? undefined : (setupSource ??= perlSetup(nr));
}

/**
 * The host command prefix that mounts `mounts` (and remounts `remount`, an existing tmpfs of the
 * namespace the prefix runs in, with a size and inode count) and then runs the command that
 * follows (the overlay's prefix, or bwrap) in `cwd` (default /). `unshare`: enter a new user and
 * mount namespace first (false when an earlier prefix made one and is root in it).
 *
 * `asRoot` (a service running as root, the prefix started as root): first, in a mount namespace
 * of its own but no user namespace, mount `asRoot.mounts`, then drop to `asRoot.dropTo` (when
 * given; as Node's spawn would have) and go on as above. Those are the tmpfs mounts root itself
 * writes to from outside (the input directory): a tmpfs mounted in a user namespace refuses to
 * create a file for a uid that namespace does not map (EOVERFLOW), and the sandbox's maps only
 * the sandbox uid.
 */
export function tmpfsPrefix(
  mounts: TmpfsMount[],
  options: {
    unshare: boolean;
    remount?: Omit<TmpfsMount, 'mode'>;
    cwd?: string;
    asRoot?: { mounts: TmpfsMount[]; dropTo?: { uid: number; gid: number } };
    /**
     * `aliveFd` (the spawner, as root): the prefix runs as pid 1 of a pid namespace its maker
     * made, and the descriptor is the read end of a pipe only its maker writes to; the guard is
     * then that maker itself, with no process or fork of its own.
     */
    guard?: { maker: number; waitFd?: number; aliveFd?: number };
    /**
     * A host directory on which the prefix first mounts a small tmpfs (in its namespace only),
     * making every mount point in it: the mounts' directories, all under it, then need not exist
     * on the host (no mkdir, chown or removal of each by the service).
     */
    scratch?: { dir: string; inodes: number; mode: string; owner?: { uid: number; gid: number } };
  },
): string[] {
  const source = tmpfsSetupSource();
  if (source === undefined) throw new Error(`no mount(2) number for ${process.arch}`);
  const rootMounts = options.asRoot?.mounts ?? [];
  const drop = options.asRoot?.dropTo;
  const rootArgs = [String(rootMounts.length), drop === undefined ? '-' : String(drop.uid), drop === undefined ? '-' : String(drop.gid)];
  for (const mount of rootMounts) rootArgs.push(mount.dir, mountOptions(mount));
  const args: string[] = [];
  for (const mount of mounts) {
    args.push(mount.dir, mountOptions(mount), '0');
  }
  if (options.remount !== undefined) {
    args.push(options.remount.dir, `size=${options.remount.sizeBytes},nr_inodes=${options.remount.inodes}`, '1');
  }
  const guard = options.guard;
  const guardArgs = guard === undefined ? ['0', '-', '-'] : [String(guard.maker), guard.waitFd === undefined ? '-' : String(guard.waitFd), guard.aliveFd === undefined ? '-' : String(guard.aliveFd)];
  const scratch = options.scratch;
  const scratchArgs = scratch === undefined ? ['-', '-'] : [scratch.dir, mountOptions({ ...scratch, sizeBytes: 64 * 1024 })];
  return ['/usr/bin/perl', '-e', source, ...guardArgs, ...scratchArgs, ...rootArgs, options.unshare ? '1' : '0', options.cwd ?? '/', String(args.length / 3), ...args];
}
