import type { IPty } from 'node-pty';

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
  /** Resource limits (rlimits on bwrap and local, flags on apptainer). */
  resources?: SandboxResources;
  /** Extra host directories bound into the sandbox. */
  binds?: SandboxBind[];
}

export interface SandboxResources {
  /** Address-space limit per process, MiB. @default 4096 */
  memoryMib?: number;
  /** Processes and threads per sandbox (RLIMIT_NPROC inside the sandbox's user namespace). @default 512 */
  maxProcesses?: number;
  /** Largest file a process may write, MiB. @default 1024 */
  maxFileSizeMib?: number;
  /** CPU seconds per process. @default 3600 */
  cpuSeconds?: number;
  /** apptainer `--cpus`. */
  cpus?: number;
  /**
   * Memory of the sandbox as a whole, MiB: its processes, page cache and tmpfs files together
   * (a cgroup; see `cgroupSupport()`: where no cgroup can be had, only the per-process
   * `memoryMib` and the tmpfs sizes hold). @default 4096
   */
  totalMemoryMib?: number;
  /** Size of the writable workspace (a tmpfs on bwrap), MiB. @default 4096 */
  workspaceMib?: number;
  /** Size of `/tmp` (a tmpfs), MiB; `/dev/shm` gets a quarter of it. @default 1024 */
  tmpMib?: number;
  /** Files and directories the sandbox may create in its workspace and `/tmp` together. @default 200_000 */
  maxInodes?: number;
  /**
   * Room for command output and the service's channel files (`/run/rollserve`, a tmpfs), MiB: a
   * command writing more gets ENOSPC. @default 256
   */
  outputMib?: number;
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
}

export interface SandboxSpawnOptions {
  cwd?: string;
  env?: Record<string, string>;
}

/**
 * A pseudo-terminal process inside a sandbox (node-pty's `IPty`) with the process control a tool
 * needs, so that no tool walks host `/proc` itself.
 */
export interface SandboxPty extends IPty {
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
  exec(command: string, options?: SandboxExecOptions): Promise<SandboxExecResult>;
  /** Starts `argv` on a pseudo-terminal inside the sandbox. */
  spawnPty(argv: string[], options?: SandboxPtyOptions): SandboxPty;
  /** Starts `argv` inside the sandbox with pipes. */
  spawn(argv: string[], options?: SandboxSpawnOptions): SandboxProcess;
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
  /** Returns only when the sandbox can run commands. */
  create(spec?: SandboxSpec): Promise<Sandbox>;
  /** Ends what the provider itself holds (warm sandboxes). Sandboxes handed out are closed by their owners. */
  close?(): Promise<void>;
}

export const DEFAULT_WORKDIR = '/workspace';
export const SOCKET_MOUNT = '/run/rollserve';
export const DEFAULT_EXEC_TIMEOUT_MS = 180_000;
export const DEFAULT_RESOURCES: Required<Omit<SandboxResources, 'cpus'>> = {
  memoryMib: 4096,
  maxProcesses: 512,
  maxFileSizeMib: 1024,
  cpuSeconds: 3600,
  totalMemoryMib: 4096,
  workspaceMib: 4096,
  tmpMib: 1024,
  maxInodes: 200_000,
  outputMib: 256,
};

/** The environment every command starts from; nothing of the service's own environment leaks in. */
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
