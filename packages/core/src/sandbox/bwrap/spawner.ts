import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { closeSync, constants, existsSync, openSync } from 'node:fs';
import { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import type { Readable, Writable } from 'node:stream';
import { RolloutError } from '../../errors.ts';
import { signalName } from '../process.ts';
import { BASE_ENV } from '../types.ts';
import { SYSCALLS, tmpfsSetupSource, type Syscalls } from './mounts.ts';

/*
 * The spawner: one small perl per provider that starts each sandbox's bwrap (and the tmpfs
 * prefix before it) in place of the service. A child of the service is a fork of the service, a
 * large process: copying its page tables and tearing the copy down at exec cost ≈ 8-10 ms of the
 * service's CPU per sandbox (perf, README "Sandboxes"), and the prefix's perl then started and
 * compiled its program (≈ 4 ms) to mount a few tmpfs. The spawner forks itself (a few MB) and the
 * fork runs the prefix's program, compiled once (mounts.ts's `tmpfsSetupSource`), which execs
 * bwrap as before: namespaces, mounts, guard and drop are the prefix's, unchanged.
 *
 * Channels: the spawner makes the pipes a sandbox's first process has (stdin, stdout, stderr,
 * bwrap's --info-fd 3 and --args 5; 4 closed) and the service opens its own ends through
 * /proc/<spawner>/fd (a pipe opened there is that pipe), after which the spawner closes them. Its
 * children start with nothing else of it open.
 *
 * Lifetime: it dies with the service (PR_SET_PDEATHSIG, checked against the parent it was given),
 * and its children with it (each arms the same before exec; the prefix's guard checks the spawner
 * is its parent, or, for a child forked as pid 1 of a pid namespace of its own, whose parent
 * getppid() cannot name, that the spawner's pipe at SPAWNER_ALIVE_FD has not ended). It is a child subreaper and reaps every process that ends under it, its own
 * children and whatever they left (bwrap's monitor when a failed start killed the guard: such an
 * orphan went to the host's init, and stayed a zombie where that init reaps nothing). SIGCHLD is
 * read from a signalfd, so no end is missed. A closed spawner exits once its last child is reaped.
 *
 * Protocol on its stdin: frames "<length>\n<fields, NUL-separated>":
 *   S id cwd uid|- gid|- pidns ncgroup procs... nenv env... nsetup setup... argv...
 *                 fork (pidns 1: as pid 1 of a new pid namespace), write the child's pid to each
 *                 cgroup.procs file; with nsetup > 0 the fork runs the prefix program on setup + argv
 *   C id          close the spawner's ends of id's pipes (the service has opened its own)
 *   K pid signal  signal a child not yet reaped
 *   G pid signal  signal a child not yet reaped and its process group
 *   E id init pidns nns ns... ncgroup procs... uid|- gid|- nrlimit (resource value)... cwd
 *     nenv env... ttyfd cols rows plain argv...
 *                 (a root spawner) fork into the running sandbox whose init is `init` and exec
 *                 argv on the service's terminal (see `enter`)
 * and on its stdout, lines: "S id pid in out err info args joined" (its fds; "ok" or why the
 * cgroup was not joined), "P id pid" (entered), "F id reason" (no fork),
 * "X pid c code" or "X pid s signal" (a child reaped).
 *
 * A program entering a sandbox on a terminal (the bash tool's shell, for a root service) is a
 * spawner's fork (the provider keeps a spawner of its own for shells: provider.ts): it does what the kernel fork server's fork did (rollserve_forkserver.py
 * `_enter`, `_open_tty`, `_become_program`) for a few MB of perl in place of a fork of a Python
 * interpreter (perf, README "Sandboxes"). The fork is made in the sandbox's pid namespace (its
 * namespace for children set for the fork, then set back, as for a sandbox's own pid namespace);
 * it takes the terminal's master from the service (pidfd_getfd: root), opens its other side
 * from it (TIOCGPTPEER), sizes it and, for `plain`, clears echo, canonical input and CR
 * translation; makes it 0-2 and closes every other descriptor before anything else; joins the
 * sandbox's cgroup, drops to the sandbox uid (a root service), sets no_new_privs, enters the
 * sandbox's user namespace first and its others after; makes its own session with the terminal
 * as its controlling one, gives up every capability (bounding set, ambient, the sets), sets the
 * sandbox's rlimits inside its user namespace, and execs argv in `cwd` with `env` alone. It is
 * reaped and reported as any child of the spawner, and dies with it (PR_SET_PDEATHSIG, armed
 * last), as the spawner dies with the service.
 */

const spawnerSource = (nr: Syscalls, setup: string): string =>
  [
    // no POSIX module: it makes the perl's private memory 2.5 MiB where 0.5 do, and every fork
    // copies what either side then writes to, page by page (perf, README "Sandboxes")
    `sub rs_exit { syscall(${nr.exit_group}, $_[0] + 0) }`,
    `sub rs_mask { syscall(${nr.rt_sigprocmask}, $_[0] + 0, my $s = pack("Q", $_[1]), 0, 8) == 0 }`,
    `sub rs_dup2 { $_[0] == $_[1] || syscall(${nr.dup3}, $_[0] + 0, $_[1] + 0, 0) >= 0 }`,
    `sub rs_close { syscall(${nr.close}, $_[0] + 0) }`,
    'my $maker = shift @ARGV;',
    `syscall(${nr.prctl}, 1, 9, 0, 0, 0) == 0 or die "rs-spawner: prctl: $!\\n";`,
    'getppid() == $maker or exit 1;',
    'my $me = $$;',
    // PR_SET_CHILD_SUBREAPER: orphans of its children are reaped here
    `syscall(${nr.prctl}, 36, 1, 0, 0, 0) == 0 or die "rs-spawner: prctl: $!\\n";`,
    // fds 3-9 held, so that every pipe is above what a child's dup2s write
    'my @low; while (1) { open(my $h, "<", "/dev/null") or die "rs-spawner: /dev/null: $!\\n"; if (fileno($h) >= 10) { close($h); last } push @low, $h }',
    // the read end of a pipe only the spawner writes to: EOF once it is gone (see SPAWNER_ALIVE_FD)
    'pipe(my $alive, my $alive_w) or die "rs-spawner: pipe: $!\\n";',
    'open(my $ownpid, "<", "/proc/self/ns/pid") or die "rs-spawner: /proc/self/ns/pid: $!\\n";',
    // (root) a pidfd of the service, whose terminal masters an entering program takes (pidfd_getfd)
    'my $svc = $> == 0 ? syscall(434, $maker + 0, 0) : -1;',
    'my $caplast = 63; if (open(my $c, "<", "/proc/sys/kernel/cap_last_cap")) { $caplast = 0 + <$c>; close($c) }',
    // SIGCHLD (17) blocked: read from the signalfd
    'my $chld = 17;',
    'rs_mask(0, 1 << ($chld - 1)) or die "rs-spawner: sigprocmask: $!\\n";',
    // signalfd4(-1, {SIGCHLD}, 8, SFD_NONBLOCK | SFD_CLOEXEC)
    `my $sfd = syscall(${nr.signalfd4}, -1, my $mask = pack("Q", 1 << ($chld - 1)), 8, 0x80800);`,
    '$sfd >= 0 or die "rs-spawner: signalfd: $!\\n";',
    `my $setup = sub {\n${setup}\n};`,
    'my (%held, %kids, $buf, $open);',
    '$open = 1; $buf = "";',
    'sub reply { my $m = shift() . "\\n"; while (length $m) { my $n = syswrite(STDOUT, $m); defined $n or exit 0; substr($m, 0, $n) = "" } }',
    'sub reap {',
    '  while ((my $pid = waitpid(-1, 1)) > 0) {',
    '    next unless delete $kids{$pid};',
    '    reply($? & 127 ? "X $pid s " . ($? & 127) : "X $pid c " . ($? >> 8));',
    '  }',
    '}',
    'sub child {',
    '  my ($fds, $cwd, $uid, $gid, $env, $pre, $argv, $pidns) = @_;',
    '  rs_mask(2, 0);',
    '  my @to = (0, 1, 2, 3, 5);',
    '  for my $i (0 .. 4) { rs_dup2($fds->[$i], $to[$i]) or rs_exit(1) }',
    `  if ($pidns) { rs_dup2(fileno($alive), ${SPAWNER_ALIVE_FD}) or rs_exit(1) }`,
    '  opendir(my $dir, "/proc/self/fd") or rs_exit(1);',
    `  my @open = grep { /^\\d+$/ && ($_ == 4 || $_ > 5) && !($pidns && $_ == ${SPAWNER_ALIVE_FD}) } readdir($dir);`,
    '  closedir($dir);',
    '  rs_close($_) for @open;',
    '  chdir($cwd) or do { print STDERR "rs-spawner: cannot enter $cwd: $!\\n"; rs_exit(1) };',
    '  %ENV = map { split /=/, $_, 2 } @$env;',
    '  if ($uid ne "-") {',
    `    syscall(${nr.setgroups}, 0, 0) == 0 or rs_exit(1);`,
    '    $) = $gid; $( = $gid; ($<, $>) = ($uid, $uid);',
    '    $< == $uid && $> == $uid && $( == $gid or do { print STDERR "rs-spawner: cannot drop to $uid:$gid\\n"; rs_exit(1) };',
    '  }',
    // dies with the spawner: armed after the last change of ids (which clears it), then checked
    `  syscall(${nr.prctl}, 1, 9, 0, 0, 0) == 0 or rs_exit(1);`,
    // (pid 1 of its own pid namespace has no parent getppid() names: the pipe says the spawner lives)
    `  if ($pidns) { my $r = ""; vec($r, ${SPAWNER_ALIVE_FD}, 1) = 1; select($r, undef, undef, 0) == 0 or rs_exit(1) }`,
    '  else { getppid() == $me or rs_exit(1) }',
    '  if (@$pre) { @ARGV = (@$pre, @$argv); eval { $setup->() }; print STDERR $@; rs_exit(255) }',
    '  exec { $argv->[0] } @$argv;',
    '  print STDERR "rs-spawner: cannot run $argv->[0]: $!\\n";',
    '  rs_exit(127);',
    '}',
    'sub start {',
    '  my ($id, $cwd, $uid, $gid, $pidns, $ncg, @rest) = @_;',
    '  my @cgroup = splice(@rest, 0, $ncg);',
    '  my $nenv = shift @rest;',
    '  my @env = splice(@rest, 0, $nenv);',
    '  my $npre = shift @rest;',
    '  my @pre = splice(@rest, 0, $npre);',
    '  my (@child, @ours);',
    '  for my $in (1, 0, 0, 0, 1) {',
    '    pipe(my $r, my $w) or do { reply("F $id pipe: $!"); return };',
    '    if ($in) { push @child, $r; push @ours, $w } else { push @child, $w; push @ours, $r }',
    '  }',
    // CLONE_NEWPID: the fork is pid 1 of a pid namespace of its own; then back to ours for the next
    `  if ($pidns && syscall(${nr.unshare}, 0x20000000) != 0) { reply("F $id unshare: $!"); return }`,
    '  my $pid = fork();',
    // (a failed fork too: the next child would go to that namespace, or unshare fail)
    `  if ($pidns && ($pid // 1)) { syscall(${nr.setns}, fileno($ownpid), 0x20000000) == 0 or die "rs-spawner: setns: $!\\n" }`,
    '  if (!defined $pid) { reply("F $id fork: $!"); return }',
    '  child([map { fileno($_) } @child], $cwd, $uid, $gid, \\@env, \\@pre, \\@rest, $pidns) if $pid == 0;',
    '  close($_) for @child;',
    '  $held{$id} = \\@ours;',
    '  $kids{$pid} = 1;',
    // the child into the sandbox's cgroup before bwrap makes the namespaces (the prefix waits for
    // the options, written once this is told): here, not in the service, whose event loop a
    // cgroup v1 migration would hold for milliseconds
    '  my $joined = "ok";',
    '  for my $procs (@cgroup) {',
    '    my $f; if (!open($f, ">", $procs) || !defined syswrite($f, $pid) || !close($f)) { ($joined = "$procs: $!") =~ s/\\s/ /g; last }',
    '  }',
    '  reply(join(" ", "S", $id, $pid, (map { fileno($_) } @ours), $joined));',
    '}',
    'sub enter_child {',
    '  my ($init, $ns, $cg, $uid, $gid, $rl, $cwd, $env, $tty, $argv) = @_;',
    '  rs_mask(2, 0);',
    '  my $fail = sub { print STDERR "rs-enter: $_[0]\\n"; rs_exit(125) };',
    // the terminal first: the service's master, its other side opened from it (no path on the way)
    `  my $m = syscall(438, $svc, $tty->[0] + 0, 0);`,
    '  $m >= 0 or $fail->("pidfd_getfd: $!");',
    '  my @ms = stat("/proc/self/fd/$m"); my @px = stat("/dev/ptmx");',
    // (TCGETS: a terminal)
    `  my $t = "\\0" x 64; syscall(${nr.ioctl}, $m, 0x5401, $t) == 0 && @ms && @px && $ms[6] == $px[6] or $fail->("the terminal descriptor is not a pseudo-terminal master");`,
    `  syscall(${nr.ioctl}, $m, 0x40045431, my $unlock = pack("i", 0)) == 0 or $fail->("unlock the terminal: $!");`,
    // TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC
    `  my $s = syscall(${nr.ioctl}, $m, 0x5441, 0x80102);`,
    '  $s >= 0 or $fail->("open the terminal: $!");',
    `  syscall(${nr.ioctl}, $s, 0x5414, my $ws = pack("S4", $tty->[2] + 0, $tty->[1] + 0, 0, 0)) == 0 or $fail->("size the terminal: $!");`,
    '  if ($tty->[3]) {',
    // stty -echo -icanon -onlcr (ONLCR: 4)
    // TCGETS, then c_oflag without ONLCR (4) and c_lflag without ECHO (8) and ICANON (2), TCSETS
    `    syscall(${nr.ioctl}, $s, 0x5401, $t) == 0 or $fail->("tcgetattr: $!");`,
    '    my @f = unpack("L4", $t); $f[1] &= ~4; $f[3] &= ~(8 | 2); substr($t, 0, 16) = pack("L4", @f);',
    `    syscall(${nr.ioctl}, $s, 0x5402, $t) == 0 or $fail->("tcsetattr: $!");`,
    '  }',
    '  rs_close($m);',
    '  for my $fd (0, 1, 2) { rs_dup2($s, $fd) or rs_exit(125) }',
    '  rs_close($s) if $s > 2;',
    // nothing of the spawner's from here on (its pipes, the pidfd, other sandboxes' descriptors)
    '  if (syscall(436, 3, 0xffffffff, 0) != 0) {',
    // (close_range is Linux 5.9's)
    '    opendir(my $d, "/proc/self/fd") or $fail->("/proc/self/fd: $!");',
    '    my @o = grep { /^\\d+$/ && $_ > 2 } readdir($d); closedir($d); rs_close($_) for @o;',
    '  }',
    '  my @fds;',
    '  for my $name ("user", "cgroup", "ipc", "uts", "net", "mnt") {',
    '    next unless $name eq "user" || $name eq "mnt" || grep { $_ eq $name } @$ns;',
    '    open(my $h, "<", "/proc/$init/ns/$name") or $fail->("cannot enter the sandbox: $name: $!");',
    '    push @fds, [$name, $h];',
    '  }',
    '  for my $procs (@$cg) { my $f; open($f, ">", $procs) && defined(syswrite($f, "0")) && close($f) or $fail->("cannot join the cgroup: $!") }',
    '  if ($uid ne "-") {',
    `    syscall(${nr.setgroups}, 0, 0) == 0 or $fail->("setgroups: $!");`,
    '    $) = $gid; $( = $gid; ($<, $>) = ($uid, $uid);',
    '    $< == $uid && $> == $uid && $( == $gid && $) == $gid or $fail->("cannot drop to $uid:$gid");',
    // as exec after setpriv would: /proc/<pid> of the program stays its own
    `    syscall(${nr.prctl}, 4, 1, 0, 0, 0) == 0 or $fail->("prctl: $!");`,
    '  }',
    `  syscall(${nr.prctl}, 38, 1, 0, 0, 0) == 0 or $fail->("no_new_privs: $!");`,
    `  for my $e (@fds) { syscall(${nr.setns}, fileno($e->[1]), 0) == 0 or $fail->("cannot enter the sandbox: setns $e->[0]: $!"); close($e->[1]) }`,
    `  syscall(${nr.setsid}) >= 0 or $fail->("setsid: $!");`,
    `  syscall(${nr.ioctl}, 0, 0x540e, 0) == 0 or $fail->("the terminal as controlling terminal: $!");`,
    `  for my $cap (0 .. $caplast) { syscall(${nr.prctl}, 24, $cap, 0, 0, 0) == 0 or $fail->("drop capability $cap: $!") }`,
    `  syscall(${nr.prctl}, 47, 4, 0, 0, 0) == 0 or $fail->("clear the ambient capabilities: $!");`,
    `  syscall(${nr.capset}, my $hdr = pack("Li", 0x20080522, 0), my $caps = pack("L6", 0, 0, 0, 0, 0, 0)) == 0 or $fail->("capset: $!");`,
    // dies with its spawner (armed after the last change of credentials, which clears it)
    `  syscall(${nr.prctl}, 1, 9, 0, 0, 0) == 0 or $fail->("prctl: $!");`,
    // inside the sandbox's user namespace: RLIMIT_NPROC counts this sandbox's processes
    `  for (my $i = 0; $i < @$rl; $i += 2) { syscall(${nr.prlimit64}, 0, $rl->[$i] + 0, my $l = pack("QQ", $rl->[$i + 1], $rl->[$i + 1]), 0) == 0 or $fail->("setrlimit $rl->[$i]: $!") }`,
    '  chdir($cwd) or $fail->("cannot enter $cwd: $!");',
    '  %ENV = map { split /=/, $_, 2 } @$env; $ENV{PWD} = $cwd;',
    '  $SIG{$_} = "DEFAULT" for qw(PIPE XFSZ INT);',
    '  exec { $argv->[0] } @$argv;',
    '  print STDERR "$argv->[0]: $!\\n";',
    '  rs_exit(127);',
    '}',
    'sub enter {',
    '  my ($id, $init, $pidns, @rest) = @_;',
    '  my @ns = splice(@rest, 0, shift @rest);',
    '  my @cg = splice(@rest, 0, shift @rest);',
    '  my ($uid, $gid) = splice(@rest, 0, 2);',
    '  my @rl = splice(@rest, 0, 2 * shift @rest);',
    '  my $cwd = shift @rest;',
    '  my @env = splice(@rest, 0, shift @rest);',
    '  my @tty = splice(@rest, 0, 4);',
    '  if ($svc < 0) { reply("F $id no pidfd of the service"); return }',
    // the init's pid may have been reused since the service looked: its pid namespace says
    '  my $p; my @st;',
    '  unless (open($p, "<", "/proc/$init/ns/pid") && (@st = stat($p)) && $st[1] == $pidns) { reply("F $id the sandbox\\x27s init is gone"); return }',
    `  if (syscall(${nr.setns}, fileno($p), 0x20000000) != 0) { (my $why = "$!") =~ s/\\s/ /g; reply("F $id setns: $why"); return }`,
    '  close($p);',
    '  my $pid = fork();',
    `  syscall(${nr.setns}, fileno($ownpid), 0x20000000) == 0 or die "rs-spawner: setns: $!\\n" if $pid // 1;`,
    '  if (!defined $pid) { reply("F $id fork: $!"); return }',
    '  enter_child($init, \\@ns, \\@cg, $uid, $gid, \\@rl, $cwd, \\@env, \\@tty, \\@rest) if $pid == 0;',
    '  $kids{$pid} = 1;',
    '  reply("P $id $pid");',
    '}',
    'sub request {',
    '  my @f = split /\\0/, shift, -1;',
    '  my $op = shift @f;',
    '  if ($op eq "S") { start(@f) }',
    '  elsif ($op eq "C") { my $fhs = delete $held{$f[0]}; close($_) for @{$fhs // []} }',
    '  elsif ($op eq "K") { kill($f[1], $f[0]) if $kids{$f[0]} }',
    '  elsif ($op eq "G") { if ($kids{$f[0]}) { kill(-$f[1], $f[0]); kill($f[1], $f[0]) } }',
    '  elsif ($op eq "E") { enter(@f) }',
    '}',
    'while ($open || %kids) {',
    '  my $rin = ""; vec($rin, $sfd, 1) = 1; vec($rin, 0, 1) = 1 if $open;',
    '  my $n = select(my $rout = $rin, undef, undef, undef);',
    '  if ($n < 0) { next if $!{EINTR}; die "rs-spawner: select: $!\\n" }',
    `  if (vec($rout, $sfd, 1)) { 1 while syscall(${nr.read}, $sfd, my $info = "\\0" x 1024, 1024) > 0; reap() }`,
    '  next unless $open && vec($rout, 0, 1);',
    '  my $got = sysread(STDIN, $buf, 65536, length $buf);',
    '  if (!$got) { next if !defined $got && $!{EINTR}; $open = 0; %held = (); next }',
    '  while ($buf =~ /^(\\d+)\\n/) {',
    '    my $at = length($1) + 1;',
    '    last if length($buf) < $at + $1;',
    '    my $frame = substr($buf, $at, $1);',
    '    substr($buf, 0, $at + $1) = "";',
    '    request($frame);',
    '  }',
    '}',
  ].join('\n');

/**
 * Where a child forked into a pid namespace of its own (`SpawnRequest.newPidNamespace`) has the
 * read end of a pipe only the spawner writes to (reading EOF once the spawner is gone), until the
 * tmpfs prefix closes it before bwrap (mounts.ts `guard.aliveFd`).
 */
export const SPAWNER_ALIVE_FD = 6;

/** What a sandbox's first process is to the sandbox that holds it: a child process, or a spawner's child. */
export interface InitProcess extends EventEmitter {
  readonly pid?: number | undefined;
  readonly stdin: Writable | null;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  /** 0-2, bwrap's --info-fd at 3, its --args at 5. */
  readonly stdio: ReadonlyArray<Readable | Writable | null | undefined>;
  readonly exitCode: number | null;
  readonly signalCode: NodeJS.Signals | null;
  kill(signal?: NodeJS.Signals): boolean;
}

class SpawnedProcess extends EventEmitter implements InitProcess {
  /** Why it is not in the cgroup it was to join (`SpawnRequest.cgroupProcs`), if it is not. */
  cgroupError: string | undefined;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  readonly stdin: Socket;
  readonly stdout: Socket;
  readonly stderr: Socket;
  readonly stdio: ReadonlyArray<Socket | null>;

  constructor(
    readonly pid: number,
    fds: number[],
    private readonly spawner: Spawner,
  ) {
    super();
    const [input, output, error, info, args] = fds.map((fd, i) => new Socket({ fd, readable: i !== 0 && i !== 4, writable: i === 0 || i === 4 }));
    this.stdin = input!;
    this.stdout = output!;
    this.stderr = error!;
    this.stdio = [input!, output!, error!, info!, null, args!];
  }

  kill(signal: NodeJS.Signals = 'SIGTERM'): boolean {
    if (this.exitCode !== null || this.signalCode !== null) return false;
    this.spawner.kill(this.pid, signal);
    return true;
  }

  /** Reaped by the spawner (or the spawner is gone: its children die with it). */
  ended(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.exitCode !== null || this.signalCode !== null) return;
    this.exitCode = code;
    this.signalCode = signal;
    // as a child process's stdin is at its exit; what it wrote is still read to its end
    this.stdin.destroy();
    (this.stdio[5] as Socket).destroy();
    this.emit('exit', code, signal);
  }
}

interface Pending {
  resolve(process: SpawnedProcess): void;
  reject(error: Error): void;
}

export interface SpawnRequest {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  /** Ids to drop to before exec (as Node's spawn `uid`/`gid`, supplementary groups cleared). */
  user?: { uid: number; gid: number } | undefined;
  /** `cgroup.procs` files the child is written to before the spawner answers (see `cgroupError`). */
  cgroupProcs?: string[];
  /**
   * Fork the child as pid 1 of a new pid namespace (a root service: the spawner may make one),
   * with the spawner's pipe at SPAWNER_ALIVE_FD: the tmpfs prefix's guard without a process of
   * its own (mounts.ts).
   */
  newPidNamespace?: boolean;
}

/** A program the spawner starts in a running sandbox, on the service's terminal (a root spawner: `Spawner.enter`). */
export interface EnterRequest {
  /** Host pid of the sandbox's init, whose namespaces the program enters. */
  initPid: number;
  /** Inode of that init's pid namespace: a reused pid is refused. */
  pidNamespace: number;
  /** Namespaces besides user, mount and pid to enter. */
  namespaces: string[];
  cgroupProcs: string[];
  /** The sandbox uid a root service drops to. */
  user: { uid: number; gid: number } | undefined;
  /** Resource numbers (RLIMIT_*) and the value of each, set as soft and hard limit. */
  rlimits: Array<[number, number]>;
  cwd: string;
  env: Record<string, string>;
  argv: string[];
  /** The terminal whose master is this process's descriptor `fd` (close-on-exec). */
  tty: { fd: number; cols: number; rows: number; plain: boolean };
}

let available: boolean | undefined;

/**
 * Whether a spawner can run here: the syscall numbers of this architecture, and a perl that
 * compiles its program (perl's core alone, as in perl-base). Checked once (`perl -c`).
 */
export function spawnerAvailable(): boolean {
  if (available === undefined) {
    const nr = SYSCALLS[process.arch];
    const setup = tmpfsSetupSource();
    available =
      process.platform === 'linux' &&
      nr !== undefined &&
      setup !== undefined &&
      existsSync('/usr/bin/perl') &&
      spawnSync('/usr/bin/perl', ['-c', '-e', spawnerSource(nr, setup)], { stdio: 'ignore', env: { ...BASE_ENV }, timeout: 10_000 }).status === 0;
  }
  return available;
}

export class Spawner {
  private readonly child: ChildProcess;
  private readonly pending = new Map<number, Pending>();
  private readonly children = new Map<number, SpawnedProcess>();
  /** Programs asked to enter a sandbox (`enter`), by request id, and those started, by pid. */
  private readonly entering = new Map<number, { resolve(pid: number): void; reject(error: Error): void; onExit(code: number): void }>();
  private readonly entered = new Map<number, (code: number) => void>();
  private seq = 0;
  private line = '';
  private dead = false;
  private closing = false;
  /** Resolves once the spawner process has ended. */
  readonly ended: Promise<void>;

  constructor() {
    const nr = SYSCALLS[process.arch];
    const setup = tmpfsSetupSource();
    if (nr === undefined || setup === undefined) throw new Error(`no syscall numbers for ${process.arch}`);
    this.child = spawn('/usr/bin/perl', ['-e', spawnerSource(nr, setup), String(process.pid)], {
      env: { ...BASE_ENV },
      cwd: '/',
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    // an idle spawner keeps no service alive; a start in flight or a child holds it (see `refresh`)
    this.child.unref();
    for (const stream of [this.child.stdin, this.child.stdout, this.child.stderr]) (stream as unknown as { unref?(): void } | null)?.unref?.();
    this.child.stdin!.on('error', () => {});
    let stderr = '';
    this.child.stderr!.on('data', (chunk: Buffer) => {
      if (stderr.length < 4096) stderr += chunk.toString('utf8');
    });
    this.child.stdout!.on('data', (chunk: Buffer) => {
      this.line += chunk.toString('latin1');
      for (let newline = this.line.indexOf('\n'); newline >= 0; newline = this.line.indexOf('\n')) {
        const text = this.line.slice(0, newline);
        this.line = this.line.slice(newline + 1);
        this.onLine(text);
      }
    });
    this.ended = new Promise<void>((resolve) => {
      this.child.once('exit', () => resolve());
      this.child.once('error', () => resolve());
    }).then(() => {
      this.dead = true;
      const error = new RolloutError({ code: 'SANDBOX', message: `the sandbox spawner ended: ${stderr.trim()}`, retryable: true });
      for (const entry of this.pending.values()) entry.reject(error);
      this.pending.clear();
      // its children die with it (PR_SET_PDEATHSIG)
      for (const spawned of this.children.values()) spawned.ended(null, 'SIGKILL');
      this.children.clear();
      for (const entry of this.entering.values()) entry.reject(error);
      this.entering.clear();
      // (they ran in sandboxes that end with it)
      for (const onExit of this.entered.values()) onExit(137);
      this.entered.clear();
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  alive(): boolean {
    return !this.dead && !this.closing;
  }

  private onLine(text: string): void {
    const [kind, first, ...rest] = text.split(' ');
    if (kind === 'X') {
      const pid = Number(first);
      const onExit = this.entered.get(pid);
      if (onExit !== undefined) {
        this.entered.delete(pid);
        onExit(rest[0] === 's' ? 128 + Number(rest[1]) : Number(rest[1]));
        return;
      }
      const spawned = this.children.get(pid);
      if (spawned === undefined) return;
      this.children.delete(pid);
      this.refresh();
      const value = Number(rest[1]);
      if (rest[0] === 's') spawned.ended(null, signalName(value) ?? 'SIGKILL');
      else spawned.ended(value, null);
      return;
    }
    const id = Number(first);
    const enter = this.entering.get(id);
    if (enter !== undefined) {
      this.entering.delete(id);
      this.refresh();
      if (kind === 'P') {
        this.entered.set(Number(rest[0]), enter.onExit);
        enter.resolve(Number(rest[0]));
      } else enter.reject(new RolloutError({ code: 'SANDBOX', message: `cannot enter the sandbox: ${rest.join(' ')}`, retryable: true }));
      return;
    }
    const entry = this.pending.get(id);
    if (entry === undefined) return;
    this.pending.delete(id);
    if (kind === 'F') {
      this.refresh();
      entry.reject(new RolloutError({ code: 'SANDBOX', message: `cannot start bwrap: ${rest.join(' ')}`, retryable: true }));
      return;
    }
    const pid = Number(rest[0]);
    const theirs = rest.slice(1, 6).map(Number);
    const joined = rest.slice(6).join(' ');
    const ours: number[] = [];
    try {
      // stdin and --args are written here; the rest read
      theirs.forEach((fd, i) => {
        const write = i === 0 || i === 4;
        ours.push(openSync(`/proc/${this.child.pid}/fd/${fd}`, (write ? constants.O_WRONLY : constants.O_RDONLY) | constants.O_NONBLOCK));
      });
    } catch (error) {
      for (const fd of ours) closeSync(fd);
      this.send(['C', String(id)]);
      this.kill(pid, 'SIGKILL');
      this.refresh();
      entry.reject(new RolloutError({ code: 'SANDBOX', message: `cannot open the spawner's pipes: ${(error as Error).message}`, retryable: true }));
      return;
    }
    this.send(['C', String(id)]);
    const spawned = new SpawnedProcess(pid, ours, this);
    if (joined !== 'ok') spawned.cgroupError = joined;
    this.children.set(pid, spawned);
    this.refresh();
    entry.resolve(spawned);
  }

  /** Holds the event loop while a start is in flight or a child runs, as a child process would (their news come on the spawner's stdout). */
  private refresh(): void {
    const stdout = this.child.stdout as unknown as { ref?(): void; unref?(): void };
    if (this.pending.size > 0 || this.entering.size > 0 || this.children.size > 0) stdout.ref?.();
    else stdout.unref?.();
  }

  /** Starts `argv` as the spawner's child; a tmpfs prefix (mounts.ts) runs in the fork, without a new perl. */
  spawn(request: SpawnRequest): Promise<InitProcess & { cgroupError: string | undefined }> {
    if (!this.alive()) return Promise.reject(new RolloutError({ code: 'SANDBOX', message: 'the sandbox spawner ended', retryable: true }));
    const id = ++this.seq;
    const setup = tmpfsSetupSource();
    const prefixed = request.argv[0] === '/usr/bin/perl' && request.argv[1] === '-e' && request.argv[2] === setup;
    const env = Object.entries(request.env).map(([name, value]) => `${name}=${value}`);
    const fields = [
      'S',
      String(id),
      request.cwd,
      request.user === undefined ? '-' : String(request.user.uid),
      request.user === undefined ? '-' : String(request.user.gid),
      request.newPidNamespace ? '1' : '0',
      String(request.cgroupProcs?.length ?? 0),
      ...(request.cgroupProcs ?? []),
      String(env.length),
      ...env,
      ...(prefixed ? [String(request.argv.length - 3), ...request.argv.slice(3)] : ['0', ...request.argv]),
    ];
    if (fields.some((field) => field.includes('\0'))) return Promise.reject(new RolloutError({ code: 'SANDBOX', message: 'a NUL in an argument' }));
    return new Promise<SpawnedProcess>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.refresh();
      this.send(fields);
    });
  }

  /**
   * Starts `request.argv` in a running sandbox on the service's terminal (see the protocol above;
   * a root spawner only); resolves with its host pid. `onExit` gets its exit code (128 + the
   * signal that ended it) once reaped.
   */
  enter(request: EnterRequest, onExit: (code: number) => void): Promise<number> {
    if (!this.alive()) return Promise.reject(new RolloutError({ code: 'SANDBOX', message: 'the sandbox spawner ended', retryable: true }));
    const id = ++this.seq;
    const env = Object.entries(request.env).map(([name, value]) => `${name}=${value}`);
    const fields = [
      'E',
      String(id),
      String(request.initPid),
      String(request.pidNamespace),
      String(request.namespaces.length),
      ...request.namespaces,
      String(request.cgroupProcs.length),
      ...request.cgroupProcs,
      request.user === undefined ? '-' : String(request.user.uid),
      request.user === undefined ? '-' : String(request.user.gid),
      String(request.rlimits.length),
      ...request.rlimits.flatMap(([resource, value]) => [String(resource), String(value)]),
      request.cwd,
      String(env.length),
      ...env,
      String(request.tty.fd),
      String(request.tty.cols),
      String(request.tty.rows),
      request.tty.plain ? '1' : '0',
      ...request.argv,
    ];
    if (request.argv.length === 0 || fields.some((field) => field.includes('\0'))) {
      return Promise.reject(new RolloutError({ code: 'SANDBOX', message: request.argv.length === 0 ? 'no program to run' : 'a NUL in an argument' }));
    }
    return new Promise<number>((resolve, reject) => {
      this.entering.set(id, { resolve, reject, onExit });
      this.refresh();
      this.send(fields);
    });
  }

  /** Whether `pid` is a program `enter` started that has not been reported reaped. */
  runs(pid: number): boolean {
    return this.entered.has(pid);
  }

  /** SIGKILLs a program `enter` started, and its process group, while it is the spawner's. */
  killEntered(pid: number): void {
    if (!this.entered.has(pid)) return;
    if (this.closing && !this.dead) {
      for (const target of [-pid, pid]) {
        try {
          process.kill(target, 'SIGKILL');
        } catch {
          // gone
        }
      }
      return;
    }
    this.send(['G', String(pid), String(osConstants.signals.SIGKILL)]);
  }

  kill(pid: number, signal: NodeJS.Signals): void {
    const number = osConstants.signals[signal];
    if (this.closing && !this.dead) {
      // its stdin is closed: by pid, while it is still the spawner's (not yet reported reaped)
      if (this.children.has(pid)) {
        try {
          process.kill(pid, number);
        } catch {
          // gone
        }
      }
      return;
    }
    this.send(['K', String(pid), String(number)]);
  }

  private send(fields: string[]): void {
    if (this.dead || this.closing) return;
    const payload = Buffer.from(fields.join('\0'), 'utf8');
    this.child.stdin!.write(Buffer.concat([Buffer.from(`${payload.length}\n`), payload]));
  }

  /**
   * Ends the spawner: at once when no process of its runs, else once its last child is reaped
   * (a sandbox its caller has not closed yet ends it then).
   */
  async close(): Promise<void> {
    if (this.dead || this.closing) return this.ended;
    this.closing = true;
    for (const entry of this.pending.values()) entry.reject(new RolloutError({ code: 'SANDBOX', message: 'the sandbox provider is closed', retryable: true }));
    this.pending.clear();
    for (const entry of this.entering.values()) entry.reject(new RolloutError({ code: 'SANDBOX', message: 'the sandbox provider is closed', retryable: true }));
    this.entering.clear();
    this.child.stdin!.end();
    if (this.children.size === 0 && this.entered.size === 0) {
      this.child.ref();
      await this.ended;
    }
  }
}
