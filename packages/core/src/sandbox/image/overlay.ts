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
 *
 * `userxattr`: overlayfs keeps what it knows of a merged directory (opaque, whiteouts cleared,
 * redirects) in `trusted.overlay.*` xattrs of the upper layer, which a user namespace may not set;
 * without the option, removing a directory of the image that held files (`rm -rf /testbed/.git`,
 * the agent's `rm -rf build/`) fails with EIO ("overlayfs: failed to set xattr on upper ... try
 * mounting with 'userxattr'" in the kernel log). With it the same xattrs are `user.overlay.*`,
 * which tmpfs holds since Linux 6.6; the kernel then forces redirect_dir=nofollow and metacopy=off
 * (a directory of the image is renamed by copying, as across file systems), so no xattr an image
 * carries is followed out of its single lower layer. test/swe/image-e2e.test.ts removes
 * /testbed/.git of an image with history, as root and as uid 65534.
 */
const SH_SETUP = [
  'set -e',
  // the image root is reached through a descriptor and the layer by relative paths, so that the
  // overlay's options in the sandbox's mount table name no host path
  'exec 4<"$1"',
  'mount -t tmpfs -o "size=$3,mode=0755" rs-layer "$2"',
  'cd "$2"',
  'mkdir upper work root',
  'mount -t overlay rs-image -o "lowerdir=/proc/self/fd/4,upperdir=upper,workdir=work,userxattr" root',
  'exec 4<&-',
  'cd /',
  'shift 3',
  'exec "$@"',
].join('\n');

/** unshare(2) and mount(2) by architecture (asm-generic for arm64 and riscv64). */
type Syscalls = { unshare: number; mount: number; prctl: number };
const SYSCALLS: Partial<Record<NodeJS.Architecture, Syscalls>> = {
  x64: { unshare: 272, mount: 165, prctl: 157 },
  arm64: { unshare: 97, mount: 40, prctl: 167 },
  riscv64: { unshare: 97, mount: 40, prctl: 167 },
};

// What `unshare --user --map-root-user --mount` does (CLONE_NEWUSER | CLONE_NEWNS, the caller
// mapped to root, mounts private), then the two mounts, then exec. The image root is opened before
// the layer is mounted (it may be the layer directory itself: see rootOverlayPrefix) and given to
// overlayfs as /proc/self/fd/N, the layer's directories relative to it: the overlay's options in
// the sandbox's /proc/self/mountinfo then name no host path.
const perlSetup = (nr: Syscalls): string =>
  [
    'my ($l, $b, $size) = splice(@ARGV, 0, 3);',
    'my ($uid, $gid) = ($<, (split " ", $()[0]);',
    `syscall(${nr.unshare}, 0x10000000 | 0x00020000) == 0 or die "rs-overlay: unshare: $!\\n";`,
    'sub put { open(my $f, ">", $_[0]) or die "rs-overlay: $_[0]: $!\\n"; print $f $_[1]; close($f) or die "rs-overlay: $_[0]: $!\\n" }',
    'put("/proc/self/setgroups", "deny"); put("/proc/self/uid_map", "0 $uid 1"); put("/proc/self/gid_map", "0 $gid 1");',
    // copies: syscall() wants writable scalars for its string arguments; 0 is NULL
    `sub mnt { my ($s, $t, $f, $flags, $o) = @_; syscall(${nr.mount}, $s, $t, $f, $flags, $o) == 0 or die "rs-overlay: cannot mount $f on $t: $!\\n" }`,
    'mnt("none", "/", 0, 16384 | 262144, 0);', // MS_REC | MS_PRIVATE
    'opendir(my $low, $l) or die "rs-overlay: cannot open the image root: $!\\n";',
    'mnt("rs-layer", $b, "tmpfs", 0, "size=$size,mode=0755");',
    'chdir($b) or die "rs-overlay: chdir: $!\\n";',
    'for my $d ("upper", "work", "root") { mkdir($d) or die "rs-overlay: mkdir $d: $!\\n" }',
    'mnt("rs-image", "root", "overlay", 0, "lowerdir=/proc/self/fd/" . fileno($low) . ",upperdir=upper,workdir=work,userxattr");',
    'closedir($low); chdir("/");',
    'exec { $ARGV[0] } @ARGV or die "rs-overlay: cannot run $ARGV[0]: $!\\n";',
  ].join('\n');

/*
 * Under a root service the cache belongs to root and sandboxes run as an unprivileged uid, which
 * must still own the image's files for its writes to copy them up. So the sandbox does not see
 * the cache itself but an idmapped clone of the image root (Linux >= 5.19 for overlayfs over it):
 * the service's uid and gid shown as the sandbox's, read-only, nosuid and nodev, mounted over the
 * layer directory in a mount namespace of its own. This setup runs as root (open_tree(2),
 * mount_setattr(2) and move_mount(2), whose numbers are the same on every architecture), then
 * drops to the sandbox uid with no groups and goes on, in the same process, as the unprivileged
 * setup above on that clone (dumpable again, so that it may write its own uid_map).
 */
const ROOT_SETUP = (nr: Syscalls): string =>
  [
    'my ($r, $b, $uid, $gid) = splice(@ARGV, 0, 4);',
    'sub rput { open(my $f, ">", $_[0]) or die "rs-overlay: $_[0]: $!\\n"; print $f $_[1]; close($f) or die "rs-overlay: $_[0]: $!\\n" }',
    // the idmapping is a user namespace: a child makes one and waits while its maps are written
    'pipe(my $ready, my $tell) or die; pipe(my $wait, my $go) or die;',
    'my $pid = fork() // die "rs-overlay: fork: $!\\n";',
    `if ($pid == 0) { close $ready; close $go; syscall(${nr.unshare}, 0x10000000) == 0 or exit 1; syswrite($tell, "x"); sysread($wait, my $x, 1); exit 0 }`,
    'close $tell; close $wait;',
    'sysread($ready, my $x, 1) == 1 or die "rs-overlay: cannot make the idmap user namespace\\n";',
    'rput("/proc/$pid/uid_map", "$< $uid 1\\n"); rput("/proc/$pid/setgroups", "deny"); rput("/proc/$pid/gid_map", (split " ", $()[0] . " $gid 1\\n");',
    'open(my $ns, "<", "/proc/$pid/ns/user") or die "rs-overlay: idmap namespace: $!\\n";',
    // open_tree(AT_FDCWD, root, OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC)
    'my $tree = syscall(428, -100, my $p = $r, 1 | 0x8000 | 0x80000); $tree >= 0 or die "rs-overlay: open_tree $r: $!\\n";',
    // mount_setattr(tree, "", AT_EMPTY_PATH, {MOUNT_ATTR_IDMAP | RDONLY | NOSUID | NODEV, userns fd})
    'my $attr = pack("QQQQ", 0x00100000 | 1 | 2 | 4, 0, 0, fileno($ns));',
    'syscall(442, $tree, my $e = "", 0x1000, $attr, 32) == 0 or die "rs-overlay: cannot idmap the image root (needs Linux 5.12+ and a filesystem that supports idmapped mounts): $!\\n";',
    'syswrite($go, "x"); close $go; waitpid($pid, 0); close $ns;',
    `syscall(${nr.unshare}, 0x00020000) == 0 or die "rs-overlay: unshare: $!\\n";`,
    `syscall(${nr.mount}, my $n = "none", my $s = "/", 0, 16384 | 262144, 0) == 0 or die "rs-overlay: private: $!\\n";`,
    // move_mount(tree, "", AT_FDCWD, layer dir, MOVE_MOUNT_F_EMPTY_PATH)
    'syscall(429, $tree, my $e2 = "", -100, my $t = $b, 4) == 0 or die "rs-overlay: move_mount: $!\\n";',
    '$) = "$gid $gid"; $( = $gid; ($<, $>) = ($uid, $uid);',
    '$< == $uid && $> == $uid && $( == $gid or die "rs-overlay: cannot drop to $uid:$gid\\n";',
    // PR_SET_DUMPABLE: a process that changed its ids may not write its /proc/self maps otherwise
    `syscall(${nr.prctl}, 4, 1, 0, 0, 0) == 0 or die "rs-overlay: prctl: $!\\n";`,
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
  checkOverlayPaths(lowerDir, layerDir);
  const args = [lowerDir, layerDir, String(sizeBytes)];
  if (mounter === 'perl') return ['/usr/bin/perl', '-e', perlSetup(SYSCALLS[process.arch]!), ...args];
  return ['unshare', '--user', '--map-root-user', '--mount', '--', '/bin/sh', '-c', SH_SETUP, 'rs-overlay', ...args];
}

/**
 * overlayPrefix for a service running as root: run as root, it idmaps the image root (owned by
 * the service) to `user`, drops to `user` and goes on as overlayPrefix does. Needs perl.
 */
export function rootOverlayPrefix(lowerDir: string, layerDir: string, sizeBytes: number, user: { uid: number; gid: number }): string[] {
  checkOverlayPaths(lowerDir, layerDir);
  const nr = SYSCALLS[process.arch];
  if (nr === undefined || !existsSync('/usr/bin/perl')) {
    throw new RolloutError({ code: 'SANDBOX', message: `images under a root service need /usr/bin/perl and a known architecture (x64, arm64, riscv64; this is ${process.arch}): its setup idmaps the image root` });
  }
  // the unprivileged setup's image root is the clone, mounted over the layer directory
  return ['/usr/bin/perl', '-e', `{\n${ROOT_SETUP(nr)}\n}\n${perlSetup(nr)}`, lowerDir, layerDir, String(user.uid), String(user.gid), layerDir, layerDir, String(sizeBytes)];
}

function checkOverlayPaths(lowerDir: string, layerDir: string): void {
  if (/[,:\\]/.test(lowerDir) || /[,:\\]/.test(layerDir)) {
    throw new RolloutError({
      code: 'SANDBOX',
      message: `the image cache and sandbox directories may not hold ",", ":" or "\\" (overlayfs options): ${lowerDir}, ${layerDir}`,
    });
  }
}
