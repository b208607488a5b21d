import { existsSync } from 'node:fs';
import { RolloutError } from '../../errors.ts';

/*
 * bubblewrap 0.8 has no --overlay (0.9 does), so the sandbox's writable layer is kernel overlayfs
 * mounted by the service's own user (Linux >= 5.11 allows it in a user namespace): `unshare`
 * makes a user and mount namespace, the setup mounts a tmpfs (the layer, of the workspace's size,
 * on the sandbox's own empty directory) and the overlay of the image's root and the layer, then
 * execs bwrap, which binds the overlay as `/`. The mounts exist only in that namespace: the cache
 * and every other sandbox see none of the writes, and they vanish with the sandbox.
 *
 * The setup is perl (perl-base is Essential in Debian) calling unshare(2) and mount(2) itself
 * where the syscall numbers are known: one process instead of unshare, sh, mount, mkdir and mount
 * again, each costing milliseconds of the start (`pnpm bench images`). Elsewhere it is util-linux's
 * unshare, sh and util-linux's mount.
 */
const SH_SETUP = [
  'set -e',
  'mount -t tmpfs -o "size=$3,mode=0755" rs-layer "$2"',
  'mkdir "$2/upper" "$2/work" "$2/root"',
  'mount -t overlay rs-image -o "lowerdir=$1,upperdir=$2/upper,workdir=$2/work" "$2/root"',
  'shift 3',
  'exec "$@"',
].join('\n');

/** unshare(2) and mount(2) by architecture (asm-generic for arm64 and riscv64). */
const SYSCALLS: Partial<Record<NodeJS.Architecture, { unshare: number; mount: number }>> = {
  x64: { unshare: 272, mount: 165 },
  arm64: { unshare: 97, mount: 40 },
  riscv64: { unshare: 97, mount: 40 },
};

// What `unshare --user --map-root-user --mount` does (CLONE_NEWUSER | CLONE_NEWNS, the caller
// mapped to root, mounts private), then the two mounts, then exec.
const perlSetup = (nr: { unshare: number; mount: number }): string =>
  [
    'my ($l, $b, $size) = splice(@ARGV, 0, 3);',
    'my ($uid, $gid) = ($<, (split " ", $()[0]);',
    `syscall(${nr.unshare}, 0x10000000 | 0x00020000) == 0 or die "rs-overlay: unshare: $!\\n";`,
    'sub put { open(my $f, ">", $_[0]) or die "rs-overlay: $_[0]: $!\\n"; print $f $_[1]; close($f) or die "rs-overlay: $_[0]: $!\\n" }',
    'put("/proc/self/setgroups", "deny"); put("/proc/self/uid_map", "0 $uid 1"); put("/proc/self/gid_map", "0 $gid 1");',
    // copies: syscall() wants writable scalars for its string arguments; 0 is NULL
    `sub mnt { my ($s, $t, $f, $flags, $o) = @_; syscall(${nr.mount}, $s, $t, $f, $flags, $o) == 0 or die "rs-overlay: cannot mount $f on $t: $!\\n" }`,
    'mnt("none", "/", 0, 16384 | 262144, 0);', // MS_REC | MS_PRIVATE
    'mnt("rs-layer", $b, "tmpfs", 0, "size=$size,mode=0755");',
    'for my $d ("upper", "work", "root") { mkdir("$b/$d") or die "rs-overlay: mkdir $b/$d: $!\\n" }',
    'mnt("rs-image", "$b/root", "overlay", 0, "lowerdir=$l,upperdir=$b/upper,workdir=$b/work");',
    'exec { $ARGV[0] } @ARGV or die "rs-overlay: cannot run $ARGV[0]: $!\\n";',
  ].join('\n');

export type OverlayMounter = 'perl' | 'mount';

/** The setup used here: perl where mount(2)'s number is known and perl is installed. */
export function defaultOverlayMounter(): OverlayMounter {
  return SYSCALLS[process.arch] !== undefined && existsSync('/usr/bin/perl') ? 'perl' : 'mount';
}

/** Where the overlay root appears, under the layer directory (in the setup's namespace only). */
export function overlayRoot(layerDir: string): string {
  return `${layerDir}/root`;
}

/**
 * The host command prefix that puts `lowerDir` (read-only) under a writable tmpfs layer of
 * `sizeBytes` at `overlayRoot(layerDir)` and then runs the command that follows (bwrap).
 * `layerDir` is an empty directory of the sandbox's own.
 */
export function overlayPrefix(lowerDir: string, layerDir: string, sizeBytes: number, mounter = defaultOverlayMounter()): string[] {
  if (/[,:\\]/.test(lowerDir) || /[,:\\]/.test(layerDir)) {
    throw new RolloutError({
      code: 'SANDBOX',
      message: `the image cache and sandbox directories may not hold ",", ":" or "\\" (overlayfs options): ${lowerDir}, ${layerDir}`,
    });
  }
  const args = [lowerDir, layerDir, String(sizeBytes)];
  if (mounter === 'perl') return ['/usr/bin/perl', '-e', perlSetup(SYSCALLS[process.arch]!), ...args];
  return ['unshare', '--user', '--map-root-user', '--mount', '--', '/bin/sh', '-c', SH_SETUP, 'rs-overlay', ...args];
}
