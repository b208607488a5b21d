import { spawn as spawnChild, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fstatSync, openSync, statSync, writeFileSync } from 'node:fs';
import { connect as connectSocket, type Socket } from 'node:net';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { RolloutError } from '../errors.ts';
import { spawnTerminal } from './node-pty.ts';
import { childrenOf, exitCode, killDescendants, killTree, runProcess, shQuote, type KillTreeOptions } from './process.ts';
import {
  BASE_ENV,
  DEFAULT_EXEC_TIMEOUT_MS,
  type SandboxExecOptions,
  type SandboxPtyOptions,
  type Sandbox,
  type SandboxExecResult,
  type SandboxProcess,
  type SandboxPty,
  type SandboxSpec,
  type SandboxStatus,
  type SandboxSpawnOptions,
} from './types.ts';

const DEFAULT_MAX_OUTPUT = 10 * 1024 * 1024;
/** The variable that tags every process a sandbox starts, so that a time limit finds them all. */
/** The largest file `download` returns. */
export const MAX_DOWNLOAD_BYTES = 1024 * 1024 * 1024;

export const TAG_VAR = 'ROLLSERVE_SANDBOX';

/** open(2)'s O_PATH (Linux; the same on every architecture Node runs on there): a handle on an inode that opens nothing. */
const O_PATH = 0o10000000;

/** A host command line that runs `inner` inside the sandbox. */
export interface HostCommand {
  argv: string[];
  env: Record<string, string>;
  /** Host working directory of the outer process. */
  cwd?: string;
}

/**
 * What the three providers share: every operation is a host command line that enters the sandbox
 * (`wrap`), so exec, PTY, pipes, upload and download are written once.
 */
export abstract class CommandSandbox implements Sandbox {
  abstract readonly provider: string;
  readonly id: string;
  protected closed = false;
  protected closing: Promise<void> | undefined;
  /** Set when a limit ended the sandbox (see `checkLimits`). */
  protected limitReason: string | undefined;
  private readonly live = new Set<{ pid: number; kill(): void }>();
  private execCount = 0;

  constructor(
    readonly workdir: string,
    readonly socketDir: { host: string; sandbox: string },
    protected readonly spec: SandboxSpec,
    /** Host directories removed on close. */
    protected readonly tempDirs: string[],
    id?: string,
  ) {
    this.id = id ?? `rs-${randomBytes(6).toString('hex')}`;
  }

  /** Builds the host command line that runs `inner` inside the sandbox with `env`. */
  protected abstract wrap(inner: string[], env: Record<string, string>): HostCommand;
  /** Ends the sandbox itself (its init, its instance). */
  protected abstract stop(): Promise<void>;
  /** Frees what outlives the processes (a cgroup), once every process is gone. */
  protected async released(): Promise<void> {}
  abstract status(): Promise<SandboxStatus>;
  /** Options for finding a timed-out process tree. */
  protected killOptions(tag: string): KillTreeOptions {
    return { envTag: tag };
  }
  /** sh commands run inside the sandbox before a PTY or piped process starts (its limits). */
  protected limitScript(): string {
    return ':';
  }
  /**
   * Ends a process started by spawnPty or spawn (`leader` is its host pid) and its tree.
   * `running` says whether the leader is still our unreaped child (its pid cannot be reused yet).
   */
  protected killEntered(leader: number, tag: string, running: () => boolean): void {
    killTree(running() ? leader : undefined, this.killOptions(`${TAG_VAR}=${tag}`));
  }
  /** Whether a failed command's stderr says the sandbox itself failed (NeMo Gym's 125/'sandbox'). */
  protected isSandboxFailure(_stderr: string): boolean {
    return false;
  }

  protected env(extra: Record<string, string> | undefined, tag: string): Record<string, string> {
    return { ...BASE_ENV, ...this.spec.env, ...extra, [TAG_VAR]: tag };
  }

  protected track(pid: number | undefined, kill: () => void): () => void {
    if (pid === undefined) return () => {};
    const entry = { pid, kill };
    this.live.add(entry);
    return () => this.live.delete(entry);
  }

  /**
   * The tags' stem: random, not the id, which names the sandbox's host directory and cgroup and
   * would show inside (the tag is in every process's environment there).
   */
  private readonly tagStem = `t${randomBytes(6).toString('hex')}`;

  protected nextTag(): string {
    return `${this.tagStem}.${++this.execCount}`;
  }

  /** Providers that watch limits override this; see `Sandbox.checkLimits`. */
  checkLimits(): string | undefined {
    return this.limitReason;
  }

  /** The 125/'sandbox' answer of a sandbox that is closed or was ended by a limit. */
  protected closedMessage(): string {
    return this.limitReason === undefined ? 'sandbox is closed' : `sandbox ended: ${this.limitReason}`;
  }

  async exec(command: string, options: SandboxExecOptions = {}): Promise<SandboxExecResult> {
    const raw = await this.execRaw(command, options);
    return {
      stdout: raw.stdout.toString('utf8'),
      stderr: raw.stderr.toString('utf8'),
      returnCode: raw.returnCode,
      ...(raw.errorType === undefined ? {} : { errorType: raw.errorType }),
    };
  }

  protected async execRaw(
    command: string,
    options: SandboxExecOptions = {},
  ): Promise<{ stdout: Buffer; stderr: Buffer; returnCode: number; errorType?: 'timeout' | 'sandbox' }> {
    if (this.closed) {
      return { stdout: Buffer.alloc(0), stderr: Buffer.from(this.closedMessage()), returnCode: 125, errorType: 'sandbox' };
    }
    const tag = this.nextTag();
    const cwd = options.cwd ?? this.workdir;
    const host = this.wrap(['/bin/sh', '-c', `cd ${shQuote(cwd)} || exit 1\n${command}`], this.env(options.env, tag));
    let untrack = (): void => {};
    const timeoutMs = options.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS;
    const killOptions = this.killOptions(`${TAG_VAR}=${tag}`);
    const result = await runProcess(host.argv, {
      env: host.env,
      ...(host.cwd === undefined ? {} : { cwd: host.cwd }),
      ...(options.stdin === undefined ? {} : { stdin: options.stdin }),
      timeoutMs,
      maxOutputBytes: options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT,
      kill: killOptions,
      onSpawn: (child) => {
        untrack = this.track(child.pid, () => child.pid !== undefined && killTree(child.pid, killOptions));
      },
    });
    untrack();
    if (result.spawnError !== undefined || this.closed) {
      return {
        stdout: result.stdout,
        stderr: Buffer.from(result.spawnError?.message ?? 'sandbox closed while the command ran'),
        returnCode: 125,
        errorType: 'sandbox',
      };
    }
    if (result.timedOut) {
      const notice = Buffer.from(`\ncommand timed out after ${timeoutMs} ms\n`);
      return { stdout: result.stdout, stderr: Buffer.concat([result.stderr, notice]), returnCode: 125, errorType: 'timeout' };
    }
    if (result.code !== 0 && this.isSandboxFailure(result.stderr.toString('utf8'))) {
      return { stdout: result.stdout, stderr: result.stderr, returnCode: 125, errorType: 'sandbox' };
    }
    return { stdout: result.stdout, stderr: result.stderr, returnCode: result.code };
  }

  private ensureOpen(): void {
    if (this.closed) throw new RolloutError({ code: 'SANDBOX', message: `sandbox ${this.id}: ${this.closedMessage()}` });
  }

  spawnPty(argv: string[], options: SandboxPtyOptions = {}): SandboxPty {
    this.ensureOpen();
    const cwd = options.cwd ?? this.workdir;
    const tag = this.nextTag();
    const host = this.wrap(['/bin/sh', '-c', `${this.limitScript()}; cd "$0" || exit 1; exec "$@"`, cwd, ...argv], this.env(options.env, tag));
    const term = spawnTerminal(host, { cols: options.cols ?? 200, rows: options.rows ?? 50 });
    const leader = term.pid;
    let running = true;
    const untrack = this.track(leader, () => this.killEntered(leader, tag, () => running));
    term.onExit(() => {
      running = false;
      untrack();
    });
    return {
      pid: leader,
      write: term.write,
      onData: term.onData,
      onExit: term.onExit,
      killChildren: () => {
        // the leader may be an entering process outside the sandbox (nsenter): its child is the
        // program, whose children are the jobs
        const programs = this.entersSandbox() ? childrenOf(leader) : [leader];
        for (const program of programs) for (const child of childrenOf(program)) killTree(child);
      },
      terminate: () => {
        // the program's tree first; the leader (which may sit outside the sandbox) then reaps it
        // and exits by itself
        killDescendants(leader);
        setTimeout(() => {
          if (!running) return; // gone, and its pid may have been reused
          term.kill();
        }, 1000).unref();
      },
    };
  }

  /** Whether `wrap` puts an entering process (nsenter, apptainer exec) between the host and the program. */
  protected entersSandbox(): boolean {
    return true;
  }

  spawn(argv: string[], options: SandboxSpawnOptions = {}): SandboxProcess {
    this.ensureOpen();
    const cwd = options.cwd ?? this.workdir;
    const tag = this.nextTag();
    const host = this.wrap(['/bin/sh', '-c', `${this.limitScript()}; cd "$0" || exit 1; exec "$@"`, cwd, ...argv], this.env(options.env, tag));
    const child: ChildProcess = spawnChild(host.argv[0]!, host.argv.slice(1), {
      env: host.env,
      ...(host.cwd === undefined ? {} : { cwd: host.cwd }),
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const pid = child.pid ?? -1;
    const running = (): boolean => child.exitCode === null && child.signalCode === null;
    const untrack = this.track(child.pid, () => this.killEntered(pid, tag, running));
    const exited = new Promise<number>((resolve) => {
      child.on('error', () => resolve(125));
      child.on('exit', (code, signal) => resolve(exitCode(code, signal)));
    }).finally(untrack);
    child.stdin!.on('error', () => {});
    return {
      pid,
      stdout: child.stdout!,
      stderr: child.stderr!,
      stdin: child.stdin!,
      exited,
      kill: (signal?: NodeJS.Signals) => {
        if (signal === undefined || signal === 'SIGKILL') this.killEntered(pid, tag, running);
        else {
          try {
            process.kill(-pid, signal);
          } catch {
            // gone
          }
        }
      },
    };
  }

  async connect(name: string): Promise<Socket> {
    this.ensureOpen();
    if (!/^[\w.-]+$/.test(name)) throw new RolloutError({ code: 'SANDBOX', message: `bad socket name ${JSON.stringify(name)}` });
    // O_PATH | O_NOFOLLOW holds the inode the name points at now (a link is held as the link):
    // the checks and the connect below are about that inode, whatever is renamed meanwhile.
    let fd: number;
    try {
      fd = openSync(join(this.socketDir.host, name), O_PATH | constants.O_NOFOLLOW);
    } catch (error) {
      throw new RolloutError({ code: 'SANDBOX', message: `socket ${name}: ${(error as Error).message}` });
    }
    try {
      const stat = fstatSync(fd);
      if (!stat.isSocket() || stat.dev !== this.socketDevice()) {
        throw new RolloutError({ code: 'SANDBOX', message: `socket ${name} was replaced (not a socket of the sandbox's socket directory)` });
      }
      return await new Promise<Socket>((resolve, reject) => {
        const socket = connectSocket(`/proc/self/fd/${fd}`, () => {
          socket.off('error', reject);
          resolve(socket);
        });
        socket.once('error', reject);
      }).catch((error: Error) => {
        throw new RolloutError({ code: 'SANDBOX', message: `socket ${name}: ${error.message}` });
      });
    } finally {
      closeSync(fd);
    }
  }

  /** The device of the socket directory's file system: a socket `connect` reaches lies on it. */
  protected socketDevice(): number {
    return statSync(this.socketDir.host).dev;
  }

  stageFile(name: string, data: string | Buffer): string {
    this.ensureOpen();
    if (!/^[\w.-]+$/.test(name)) throw new RolloutError({ code: 'SANDBOX', message: `bad staged file name ${JSON.stringify(name)}` });
    // never follow or overwrite what is there
    writeFileSync(join(this.stagingDir().host, name), data, { flag: 'wx', mode: 0o644 });
    return `${this.stagingDir().sandbox}/${name}`;
  }

  /** Where `stageFile` writes: the socket directory unless the provider has a read-only one. */
  protected stagingDir(): { host: string; sandbox: string } {
    return this.socketDir;
  }

  async upload(remotePath: string, data: string | Buffer): Promise<void> {
    const q = shQuote(remotePath);
    const result = await this.exec(`mkdir -p -- "$(dirname -- ${q})" && cat > ${q}`, { cwd: this.workdir, stdin: data });
    if (result.returnCode !== 0) {
      throw new RolloutError({ code: 'SANDBOX', message: `upload to ${remotePath} failed: ${result.stderr.trim()}` });
    }
  }

  async download(remotePath: string): Promise<Buffer> {
    // Output above the cap would come back cut in the middle: a file is whole or an error.
    const result = await this.execRaw(`cat -- ${shQuote(remotePath)}`, { cwd: this.workdir, maxOutputBytes: MAX_DOWNLOAD_BYTES + 1 });
    if (result.returnCode !== 0) {
      throw new RolloutError({
        code: 'SANDBOX',
        message: `download of ${remotePath} failed: ${result.stderr.toString('utf8').trim()}`,
      });
    }
    if (result.stdout.length > MAX_DOWNLOAD_BYTES) {
      throw new RolloutError({ code: 'SANDBOX', message: `download of ${remotePath} failed: larger than ${MAX_DOWNLOAD_BYTES} bytes` });
    }
    return result.stdout;
  }

  close(): Promise<void> {
    this.closing ??= (async () => {
      this.closed = true;
      try {
        // the sandbox first: its processes die inside, and the processes that entered it from
        // outside reap them and exit by themselves; then whatever is left
        await this.stop();
      } finally {
        for (const entry of this.live) entry.kill();
        this.live.clear();
        await this.removeTempDirs();
        await this.released();
      }
    })();
    return this.closing;
  }

  /** Removes `tempDirs` (their processes are gone). */
  protected async removeTempDirs(): Promise<void> {
    await Promise.all(this.tempDirs.map((dir) => rm(dir, { recursive: true, force: true, maxRetries: 3 })));
  }

  /** Writes `spec.files`; a failure closes the sandbox. */
  /** @internal */
  async writeSpecFiles(): Promise<void> {
    const files = Object.entries(this.spec.files ?? {});
    try {
      for (const [path, text] of files) await this.upload(path, text);
    } catch (error) {
      await this.close();
      throw error;
    }
  }
}
