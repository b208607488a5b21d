import type { Socket } from 'node:net';

/**
 * What a sandbox should look like. Modelled on NeMo Gym's `SandboxSpec` (CONTRACT.md §7.2); the
 * fields a provider does not understand are ignored.
 */
export interface SandboxSpec {
  /**
   * bwrap: an image reference (`oci:<dir>[:tag]`, `docker-archive:<file.tar>`,
   * `oci-archive:<file.tar>`, `sif:<file>`, `squashfs:<file>`; see `ImageReference`), unpacked
   * once into the image cache and run read-only under a writable layer of the sandbox's own, with
   * the image's Env, WorkingDir and User; or a plain root directory, bound read-only (host `/`
   * read-only when omitted). apptainer: a `.sif`, a directory, a `docker://` reference or a bare
   * name (becomes `docker://<name>`).
   * @example 'oci:/images/sweb.eval.x86_64.django__django-11099:latest'
   */
  image?: string;
  /** Whether the sandbox may reach the network. @default false */
  network?: boolean;
  /** Working directory inside the sandbox; the writable workspace is bound there. @default '/workspace' */
  workdir?: string;
  /** Environment variables of every command, merged under each call's `env`. */
  env?: Record<string, string>;
  /** Files written into the sandbox before `create` returns (path inside the sandbox → text). */
  files?: Record<string, string>;
  /** Resource limits; see `SandboxResources` for who keeps which. */
  resources?: SandboxResources;
  /** Extra host directories bound into the sandbox. */
  binds?: SandboxBind[];
}

/**
 * Limits of a sandbox. Each provider keeps the ones it declares (`SandboxProvider.limits`), each
 * enforced by the kernel (an rlimit, a tmpfs's size and inode count, a cgroup): a spec GIVING a
 * limit its provider cannot keep is refused by `create` with an error naming it. A default the
 * provider cannot keep is not applied (the `local` provider has no tmpfs mounts: it has no
 * workspace size). `resolveSandboxSpec` fills the defaults, once.
 */
export interface SandboxResources {
  /** Address-space limit per process (RLIMIT_AS), MiB. @default 4096 */
  memoryMib?: number;
  /**
   * Processes and threads of the sandbox (RLIMIT_NPROC inside the sandbox's user namespace, and
   * the cgroup's pids.max where one can be had). @default 512
   */
  maxProcesses?: number;
  /** Largest file a process may write (RLIMIT_FSIZE), MiB. @default 1024 */
  maxFileSizeMib?: number;
  /** CPU seconds per process (RLIMIT_CPU). @default 3600 */
  cpuSeconds?: number;
  /**
   * Open files per process (RLIMIT_NOFILE): past it `open` fails with EMFILE. The sandbox as a
   * whole can then hold at most `maxProcesses × maxOpenFiles` descriptors; their kernel memory is
   * charged to the sandbox's memory cgroup where it has one (`totalMemoryMib`). A default above
   * the service's own hard limit is lowered to it; a given one above it is refused. @default 1024
   */
  maxOpenFiles?: number;
  /** CPUs of the sandbox as a whole (a cgroup's CPU quota; apptainer `--cpus`). No default: unlimited. */
  cpus?: number;
  /**
   * Memory of the sandbox as a whole, MiB: its processes, page cache, tmpfs files and open files
   * together (a cgroup; see `cgroupSupport()`: where no cgroup can be had, the default is not
   * applied and a given value is refused). @default 4096
   */
  totalMemoryMib?: number;
  /** Size of the writable workspace (a tmpfs on bwrap; the writable layer of an image), MiB. @default 4096 */
  workspaceMib?: number;
  /** Size of `/tmp` (a tmpfs), MiB; `/dev/shm` gets a quarter of it. @default 1024 */
  tmpMib?: number;
  /**
   * Files and directories the sandbox may create in its workspace, `/tmp` and `/dev/shm`
   * together. The kernel keeps it: each of those tmpfs mounts gets its share as its inode count
   * (`nr_inodes`; see `inodeShares`: the workspace 75 %, `/tmp` 20 %, `/dev/shm` 5 %), and
   * creating a file past a mount's share fails with ENOSPC. At least 20. @default 200_000
   */
  maxInodes?: number;
  /**
   * Room for command output and the service's channel files (`/run/rollserve`, a tmpfs), MiB: a
   * command writing more gets ENOSPC. @default 256
   */
  outputMib?: number;
}

/** The name of one limit. */
export type SandboxLimit = keyof SandboxResources;

/**
 * The limits a provider keeps here, each with how it keeps them (for messages and the docs). A
 * limit missing from it is one the provider cannot keep.
 */
export type SandboxLimitSupport = Partial<Record<SandboxLimit, string>>;

/** Every limit with its value: what `resolveSandboxSpec` hands a provider. */
export type ResolvedSandboxResources = Required<Omit<SandboxResources, 'cpus'>> & Pick<SandboxResources, 'cpus'>;

/** A spec with every default filled in once (`resolveSandboxSpec`). */
export interface ResolvedSandboxSpec extends Omit<SandboxSpec, 'resources'> {
  resources: ResolvedSandboxResources;
  /** The limits the spec gave (as opposed to defaults): only these are refused when a provider cannot keep them. */
  given: ReadonlySet<SandboxLimit>;
}

export interface SandboxBind {
  host: string;
  sandbox: string;
  readOnly?: boolean;
}

export interface SandboxExecOptions {
  /** Working directory inside the sandbox. @default the spec's workdir */
  cwd?: string;
  /** Extra environment variables for this call. */
  env?: Record<string, string>;
  /** Time limit; when it passes the whole process tree is killed and the result is 125/'timeout'. @default 180_000 */
  timeoutMs?: number;
  /** Bytes written to the command's stdin (then closed). */
  stdin?: string | Buffer;
  /** Cap per stream; the rest is dropped with a notice. @default 10 MiB */
  maxOutputBytes?: number;
}

/**
 * NeMo Gym's `SandboxExecResult`: a failure of the sandbox itself (rather than the command) is
 * `returnCode: 125` with `errorType` set.
 */
export interface SandboxExecResult {
  stdout: string;
  stderr: string;
  returnCode: number;
  errorType?: 'timeout' | 'sandbox' | 'pty';
}

export type SandboxStatus = 'starting' | 'running' | 'stopped' | 'error' | 'unknown';

export interface SandboxPtyOptions {
  cwd?: string;
  env?: Record<string, string>;
  cols?: number;
  rows?: number;
  /**
   * A terminal without echo, line editing (canonical input) or CR before each newline (`stty
   * -echo -icanon -onlcr`), set before the program runs where the provider can
   * (`SandboxPty.plain` says whether it did): one process less than running `stty`.
   */
  plain?: boolean;
}

export interface SandboxSpawnOptions {
  cwd?: string;
  env?: Record<string, string>;
}

/** What a listener registration returns: `dispose()` stops the calls. */
export interface SandboxListener {
  dispose(): void;
}

/**
 * A pseudo-terminal process inside a sandbox: what a terminal tool needs of it (the bash tool
 * writes keystrokes, reads what is printed, learns of the exit) and the process control to go with
 * it, so that no tool walks host `/proc` itself. Each provider adapts its own terminal to it (the
 * command sandboxes node-pty's, in sandbox/node-pty.ts); no tool sees that terminal.
 */
export interface SandboxPty {
  /** Host pid of the outermost process the provider started. */
  readonly pid: number;
  /** The terminal was started plain (`SandboxPtyOptions.plain`); otherwise it has its usual modes. */
  readonly plain?: boolean;
  /** Types `data` into the terminal; writes wait their turn past a full terminal, and one after the exit is dropped. */
  write(data: string): void;
  /** Calls `listener` with what the terminal prints, as it comes (UTF-8 text). */
  onData(listener: (data: string) => void): SandboxListener;
  /** Calls `listener` once the process has exited: its exit code, and the signal that ended it if one did. */
  onExit(listener: (exit: { exitCode: number; signal?: number }) => void): SandboxListener;
  /**
   * SIGKILLs what the process started (a shell's foreground and background jobs) but not the
   * process itself: the escalation after Ctrl-C was ignored.
   */
  killChildren(): void;
  /** Ends the process and everything it started, inside the sandbox. */
  terminate(): void;
}

/** A long-lived process inside a sandbox with pipes (for example the Python kernel). */
export interface SandboxProcess {
  /** Host pid of the outermost process the provider started. */
  readonly pid: number;
  readonly stdout: NodeJS.ReadableStream;
  readonly stderr: NodeJS.ReadableStream;
  readonly stdin: NodeJS.WritableStream;
  /** Resolves with the exit code (or 128 + signal) when the process has ended. */
  readonly exited: Promise<number>;
  /** Kills the process and everything it started. */
  kill(signal?: NodeJS.Signals): void;
}

/** A Python kernel forked into a sandbox (`Sandbox.forkKernel`). */
export interface SandboxKernelFork {
  /** The interpreter, as the sandbox's PATH would find it. @example 'python3' */
  python: string;
  /** The kernel's socket, a name in `socketDir`. */
  socketName: string;
  /** Environment variables of the kernel over the sandbox's. */
  env?: Record<string, string>;
  /** Plain exec rather than IPython's InteractiveShell. */
  plain: boolean;
  /** Modules the kernel finds imported (`PythonKernelOptions.preload`): its server imported them once. */
  preload?: readonly string[];
  /** How long to wait for the kernel to listen. */
  timeoutMs: number;
}

/** A Python program forked into a sandbox (`Sandbox.forkPython`): `python -I -c code` as exec would run it. */
export interface SandboxPythonRun {
  /** The interpreter, as the sandbox's PATH would find it. @example 'python3' */
  python: string;
  code: string;
  stdin?: string | Buffer;
  env?: Record<string, string>;
  /** @default DEFAULT_EXEC_TIMEOUT_MS */
  timeoutMs?: number;
  /** Output kept per stream (head and tail). @default 10 MiB */
  maxOutputBytes?: number;
  /**
   * What the provider's interpreter prepares once for every program given the same preload, so
   * no program pays for it: standard modules imported, and `module`, the caller's own source (a
   * harness; never a sandbox's: it runs where the provider prepares, as the service), made a
   * module of that name. Programs find them in `sys.modules`, as a program finds what it
   * imported itself. Ignored where programs are not forked. A provider may keep what it made of
   * one preload object: a caller passes the same object for the same preload, a new one otherwise.
   * @example { modules: ['json', 'typing'], module: { name: 'my_harness', source: 'def main(): ...' } }
   */
  preload?: {
    modules?: string[];
    module?: {
      name: string;
      source: string;
      /** Its file name in tracebacks. @default `<name>.py` */
      file?: string;
      /**
       * A function of the module called once, with no arguments, after it is made (a warm-up: what
       * it makes and specialises no program's fork makes or copies again); its errors are ignored.
       */
      prepare?: string;
      /**
       * A generator function of the module that reads programs' channels on the host side (see
       * `channel`): called with a channel's `data`, sent each chunk of what the program writes to
       * its descriptor 3 (b'' at its end), its return value is the run's `channel.result`.
       */
      host?: string;
    };
  };
  /**
   * A channel from the program to `preload.module.host`, run outside every sandbox in a process
   * no program is forked from: the program's descriptor 3 is a pipe's write end (neither a file
   * nor under its file-size limit) and `data` goes to `host` only once the program runs, so no
   * program's memory ever held it. The run ends once `host` has answered (the program is ended
   * then) or the program has exited and its channel closed. Where forked programs have no such
   * host, `forkPython` is undefined for a request with a channel.
   */
  channel?: { data: unknown };
}

/** `forkPython`'s answer: `exec`'s, and with a channel, `host`'s return value or why there is none. */
export type SandboxPythonResult = SandboxExecResult & { channel?: { result: unknown } | { error: string } };

export interface Sandbox {
  readonly id: string;
  readonly provider: string;
  /** The working directory inside the sandbox. */
  readonly workdir: string;
  /**
   * A host directory bound read-write into the sandbox at `socketDir.sandbox`, for Unix sockets
   * between the service and in-sandbox servers (the Python kernel).
   */
  readonly socketDir: { host: string; sandbox: string };
  /**
   * Connects to the Unix socket `name` that a process inside listens on in `socketDir.sandbox`.
   * The socket is opened without following links and must be a socket on the sandbox's own
   * socket directory, so nothing inside can point the service at another socket (a host one) by
   * swapping the name or a directory on the way for a link.
   */
  connect(name: string): Promise<Socket>;
  exec(command: string, options?: SandboxExecOptions): Promise<SandboxExecResult>;
  /** Starts `argv` on a pseudo-terminal inside the sandbox. */
  spawnPty(argv: string[], options?: SandboxPtyOptions): SandboxPty;
  /** Starts `argv` inside the sandbox with pipes. */
  spawn(argv: string[], options?: SandboxSpawnOptions): SandboxProcess;
  /**
   * Starts core's Python kernel (python/rollserve_kernel.py) in the sandbox as a fork of an
   * interpreter that has imported it, and IPython, already (bwrap's kernel fork server), with
   * what `spawn` would give it: the sandbox's namespaces, cgroup, uid, limits and environment.
   * Undefined where the provider has no such interpreter for this sandbox (an image, binds, an
   * environment that changes the interpreter): `spawn` the kernel then.
   */
  forkKernel?(request: SandboxKernelFork): Promise<{ process: SandboxProcess; mode: string }> | undefined;
  /**
   * Runs `python -I -c <code>` in the sandbox as a fork of a prepared interpreter (bwrap: a fork
   * server without IPython, whose programs find an interpreter close to a new one), with `exec`'s
   * answer; undefined where there is none: `exec` it then.
   */
  forkPython?(request: SandboxPythonRun): Promise<SandboxPythonResult> | undefined;
  /**
   * Puts a file of the service's (a script, a kernel's source) where the sandbox can read it but
   * nothing inside can change it or swap the path; returns its path inside the sandbox.
   */
  stageFile(name: string, data: string | Buffer): string;
  /** Writes `data` to `remotePath` inside the sandbox (parents created). */
  upload(remotePath: string, data: string | Buffer): Promise<void>;
  /** Reads `remotePath` inside the sandbox. */
  download(remotePath: string): Promise<Buffer>;
  status(): Promise<SandboxStatus>;
  /**
   * Why the sandbox was ended for going past one of its limits (memory, workspace, `/tmp`,
   * inodes), or undefined while it is within them. Checks now; a provider also checks by itself
   * from time to time. Once set, the sandbox's processes are gone and every call fails with it.
   */
  checkLimits(): string | undefined;
  /** Ends every process of the sandbox and removes its temporary directories. Idempotent. */
  close(): Promise<void>;
}

export interface SandboxProvider {
  readonly name: string;
  /**
   * The limits this provider keeps on this host, and how. `create` refuses a spec that gives any
   * other (an error naming the limit). `createSandboxProvider` takes a provider that does not say
   * to keep none (a spec giving a limit is refused); one handed over directly is trusted.
   */
  limits?(): SandboxLimitSupport;
  /** Returns only when the sandbox can run commands. */
  create(spec?: SandboxSpec): Promise<Sandbox>;
  /**
   * Readies ahead what `create(spec)` will need and holds nothing after: the spec's image
   * unpacked into the cache (within the host's unpack slots, the cache's cap kept, no image in
   * use evicted), so that a rollout waiting for INIT starts on a cached image. Optional: a
   * provider without images has nothing to ready. A failure is the later `create`'s to report.
   */
  prefetch?(spec: SandboxSpec): Promise<void>;
  /** Ends what the provider itself holds (warm sandboxes). Sandboxes handed out are closed by their owners. */
  close?(): Promise<void>;
}

export const DEFAULT_WORKDIR = '/workspace';
export const SOCKET_MOUNT = '/run/rollserve';
export const DEFAULT_EXEC_TIMEOUT_MS = 180_000;
/** The defaults of the limits; read them, but fill them in only through `resolveSandboxSpec`. */
export const DEFAULT_RESOURCES: Readonly<Required<Omit<SandboxResources, 'cpus'>>> = {
  memoryMib: 4096,
  maxProcesses: 512,
  maxFileSizeMib: 1024,
  cpuSeconds: 3600,
  maxOpenFiles: 1024,
  totalMemoryMib: 4096,
  workspaceMib: 4096,
  tmpMib: 1024,
  maxInodes: 200_000,
  outputMib: 256,
};

/** The environment every command starts from; nothing of the service's own environment leaks in. */
/** A Python module's dotted name: what a preload (`SandboxPythonRun.preload`, `SandboxKernelFork.preload`) may name. */
export const MODULE_NAME = /^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$/;

export const BASE_ENV: Record<string, string> = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  LANG: 'C.UTF-8',
  LC_ALL: 'C.UTF-8',
  TERM: 'dumb',
  HOME: '/tmp',
  // Nothing waits for a key: no pager (git diff, man, systemctl), no editor, no prompt.
  PAGER: 'cat',
  GIT_PAGER: 'cat',
  MANPAGER: 'cat',
  SYSTEMD_PAGER: '',
  LESS: '-FRX',
  GIT_EDITOR: 'true',
  EDITOR: 'true',
  VISUAL: 'true',
  GIT_TERMINAL_PROMPT: '0',
  DEBIAN_FRONTEND: 'noninteractive',
  PIP_NO_INPUT: '1',
};
