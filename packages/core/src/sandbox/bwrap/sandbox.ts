import { PassThrough } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fstatSync, openSync, readSync, rmdirSync, statfsSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { SandboxCgroup } from '../cgroup.ts';
import { CommandSandbox, type HostCommand } from '../command-sandbox.ts';
import { OWNER_FILE } from '../staging.ts';
import { inodeShares, shmMib, ulimitScript } from '../limits.ts';
import { openMaster } from '../node-pty.ts';
import { childrenOf, killDescendants, killTree, pidNamespaceOf, readStat, shQuote, type KillTreeOptions } from '../process.ts';
import { RolloutError } from '../../errors.ts';
import {
  DEFAULT_EXEC_TIMEOUT_MS,
  SOCKET_MOUNT,
  type ResolvedSandboxResources,
  type ResolvedSandboxSpec,
  type SandboxExecOptions,
  type SandboxExecResult,
  type SandboxKernelFork,
  BASE_ENV,
  type SandboxProcess,
  type SandboxPty,
  type SandboxPtyOptions,
  type SandboxPythonResult,
  type SandboxPythonRun,
  type SandboxStatus,
} from '../types.ts';
import { IMPORT_TIME_VARS, type ChannelAnswer, type ForkChannel, type KernelForkRequest, type KernelForkServers } from './fork-server.ts';
import type { InitProcess, Spawner } from './spawner.ts';
import { buildEnterArgs, EXEC_DIR, INPUT_MOUNT, ownNamespaces, type EnterableNamespace } from './args.ts';

/*
 * How exec works, and why.
 *
 * Each sandbox is ONE long-lived `bwrap` (user, mount, pid, ipc, uts, cgroup and, unless asked,
 * net namespaces) whose command is a ten-line POSIX sh agent (agentScript). `exec` writes the
 * command as a script into the input directory (a tmpfs bound READ-ONLY at INPUT_MOUNT: see
 * openInput) and sends its id on the agent's stdin; the agent double-forks `sh <script>` with stdout and
 * stderr going to files in the output tmpfs (SOCKET_MOUNT/.exec) and answers "<id> <exit code>" on
 * its stdout. Long-lived processes with their own terminal or pipes (the bash tool's PTY, the
 * Python kernel) instead ENTER the sandbox with `nsenter -t <init> -U -m -p` plus every other
 * namespace the sandbox does not share with the host (after joining its cgroup and `setpriv` to the
 * sandbox uid), and set their limits with `ulimit` once inside.
 *
 * Writable places are tmpfs mounts of set sizes (workspace, /tmp, /dev/shm, the output directory),
 * charged to the sandbox's cgroup where it has one; the service reaches them through
 * /proc/<init>/root. The sandbox writes nothing to a host disk.
 *
 * Host paths: none the service made shows inside. bwrap gets its options on a descriptor (its
 * fork, the sandbox's pid 1, would show them at /proc/1/cmdline), joins the sandbox's cgroup
 * before it makes the cgroup namespace (/proc/self/cgroup shows "/"), and binds tmpfs roots only
 * (mountinfo shows a bind's path within its file system); see README "Sandboxes".
 *
 * Measured (2 cores, Node 20): spawning any child from Node costs ≈ 2 ms (fork of a large
 * process), an nsenter chain ≈ 5 ms, the agent round trip ≈ 0.5-1 ms; bwrap start ≈ 5 ms. A bwrap
 * per exec would cost the same 5 ms per command and could not share /tmp or background processes;
 * a Python agent costs ≥ 15 ms of interpreter start. `pnpm bench isolation` compares with a
 * baseline checkout.
 *
 * `--dev` is NOT used: it makes bwrap add a second, nested user namespace (to mount devpts as uid
 * 0), and the pid namespace, owned by the outer one, can then not be entered. /dev is a tmpfs with
 * the few device nodes bound in instead; PTYs come from the host's devpts through node-pty.
 *
 * Processes: RLIMIT_NPROC is counted per (user namespace, uid) since Linux 5.14, so a limit set
 * INSIDE the sandbox's user namespace (the agent's `ulimit`, and the same `ulimit`s in the wrapper
 * of every entering process) caps that sandbox alone. Root is exempt from RLIMIT_NPROC, so a
 * service running as root drops the sandbox to a dedicated uid (65534 unless configured): the
 * tmpfs prefix (or Node's spawn `uid`/`gid`, or the image overlay's setup) for bwrap itself,
 * `setpriv` (with no_new_privs) for the processes that enter.
 *
 * Lifetime: killing pid 1 of the pid namespace makes the kernel kill every process of the
 * sandbox. When the service dies, its spawner (spawner.ts) dies with it, the guard (mounts.ts: the
 * tmpfs prefix, bwrap's parent, the spawner's child) with the spawner, and bwrap's monitor, pid 1
 * of the guard's pid namespace, with the guard: the kernel
 * then kills everything under it, a sandbox still starting included (`--die-with-parent` alone
 * does not: see tmpfsPrefix). As root the spawner makes that pid namespace as it forks, and the
 * monitor, its child, dies with it directly (no guard process).
 * A timed-out command is found by the ROLLSERVE_SANDBOX=<exec id> variable it and its children
 * carry, within the sandbox's pid namespace.
 *
 * Trust: anything inside may write to the output directory and to the agent's stdout (same uid:
 * pidfd_getfd). The host reads output files with O_NOFOLLOW, only regular files with one link on
 * the output tmpfs itself; it parses the agent's lines in bounded time and memory and ends the
 * sandbox on anything malformed.
 */


const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Reads an output file the sandbox wrote, through /proc/<init>/root. Whatever was planted on the
 * way (a symlinked directory) is refused: the file must be a regular file with one link on the
 * sandbox's own output tmpfs (`dev`).
 */
function readCapped(path: string, cap: number, dev: number): Buffer {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch {
    return Buffer.alloc(0);
  }
  try {
    const stat = fstatSync(fd);
    if (!stat.isFile() || stat.nlink !== 1 || stat.dev !== dev) return Buffer.from('[output file was replaced; not read]\n');
    const readAt = (position: number, length: number): Buffer => {
      const buffer = Buffer.alloc(length);
      const n = readSync(fd, buffer, 0, length, position);
      return buffer.subarray(0, n);
    };
    if (stat.size <= cap) return readAt(0, stat.size);
    const half = Math.floor(cap / 2);
    const notice = Buffer.from(`\n[... ${stat.size - 2 * half} bytes of output truncated ...]\n`);
    return Buffer.concat([readAt(0, half), notice, readAt(stat.size - half, half)]);
  } finally {
    closeSync(fd);
  }
}

function unlinkQuiet(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // not created
  }
}

/** The longest line the exec agent writes ("<id> <exit code>"); anything longer was forged. */
const MAX_AGENT_LINE = 64;
const AGENT_LINE = /^x[0-9a-z]+ \d{1,3}$/;
/**
 * How often a sandbox looks at its cgroup and tmpfs usage by itself (tool calls also look). The
 * kernel enforces every cap; looking only finds out that one was reached, to end the sandbox
 * with the reason.
 */
const LIMIT_CHECK_MS = 1000;
/** How long after a shell's or kernel's end its tag sweep waits for the sandbox's own end (see `sweep`). */
const SWEEP_DELAY_MS = 50;
/**
 * How long a forked program's channel answer is awaited once the program has ended within its own
 * time limit, at least (or the program's own limit, if longer): the grader's CPU budget for one
 * channel (20 s, an rlimit of the channel's process) and a margin. A submission's grading takes
 * milliseconds; only a grading made slow on purpose, or a channel whose write end outlives the
 * program (a leftover process of the sandbox holds it), waits this long, and fails that run alone.
 */
const CHANNEL_GRACE_MS = 30_000;

export class BwrapSandbox extends CommandSandbox {
  readonly provider = 'bwrap';
  private exited = false;
  private readonly exitedPromise: Promise<void>;
  private enter: string[] = [];
  private namespaces: EnterableNamespace[] = [];
  private pidNamespace: string | undefined;
  /** The provider's kernel fork servers, where this sandbox's root is the host's (no image, no binds). */
  forkServers: KernelForkServers | undefined;
  /** The provider's spawner that started this sandbox's bwrap, if one did (tests and benches look at it). */
  spawner: Spawner | undefined;
  /** The provider's spawner of bash tool shells (a root service), started at the first. */
  shellSpawner: (() => Spawner | undefined) | undefined;
  private readonly pending = new Map<string, (code: number) => void>();
  private agentLine = '';
  private seq = 0;
  private execDir = '';
  /** Where the service writes the sandbox's input files (see openInput). */
  private inputDir: string;
  private inputFd = -1;
  private outputDev = -1;
  private monitor: NodeJS.Timeout | undefined;
  private readonly limits: ResolvedSandboxResources;
  initPid = 0;

  constructor(
    id: string,
    workdir: string,
    spec: ResolvedSandboxSpec,
    private readonly init: InitProcess,
    private readonly user: { uid: number; gid: number } | undefined,
    private cgroup: SandboxCgroup | undefined,
    /** The input directory's host path; `mounted`: the prefix mounted a tmpfs on it (see `started`). */
    private readonly input: { host: string; mounted: boolean },
    tempDirs: string[],
    /** Ends the sandbox's use of its image (the cache may evict it then). */
    private readonly releaseImage?: () => void,
  ) {
    // the host path of the channel directory is known once the sandbox runs (started)
    super(workdir, { host: '', sandbox: SOCKET_MOUNT }, spec, tempDirs, id);
    this.limits = spec.resources;
    this.inputDir = input.host;
    this.exitedPromise = new Promise<void>((resolve) => {
      if (init.exitCode !== null || init.signalCode !== null) resolve();
      init.once('exit', () => resolve());
    }).then(() => {
      this.exited = true;
    });
    init.stdin!.on('error', () => {});
  }

  /**
   * Puts bwrap (`pid`, still waiting for its options) in the sandbox's cgroup: the sandbox's
   * processes, all its descendants, start there, and its cgroup namespace is rooted there.
   */
  joinCgroup(pid: number | undefined): void {
    if (this.cgroup !== undefined && pid !== undefined) {
      try {
        this.cgroup.join(pid);
      } catch (error) {
        this.cgroupUnjoinable(error as Error);
      }
    }
  }

  /** bwrap could not be put in the sandbox's cgroup (`error`: why; see joinCgroup). */
  cgroupUnjoinable(error: Error): void {
    if (this.cgroup === undefined) return;
    // a cgroup we may create but not move processes into (a v2 hierarchy without delegation of
    // the common ancestor): the rlimit fallback holds, as where there is no cgroup at all, unless
    // the spec gave the limit only a cgroup keeps
    const empty = this.cgroup;
    this.cgroup = undefined;
    void removeCgroup(empty);
    const needsCgroup = (['totalMemoryMib', 'cpus'] as const).find((limit) => (this.spec as ResolvedSandboxSpec).given.has(limit));
    if (needsCgroup !== undefined) {
      throw new RolloutError({
        code: 'SANDBOX',
        message: `the bwrap sandbox provider cannot keep the limit ${needsCgroup}: the sandbox could not join its cgroup (${error.message})`,
        details: { limit: needsCgroup },
      });
    }
  }

  /** Called once the agent answered: from now on its stdout carries "<id> <code>" lines. */
  started(initPid: number): void {
    this.initPid = initPid;
    this.pidNamespace = pidNamespaceOf(initPid);
    if (this.input.mounted) this.openInput();
    (this.socketDir as { host: string }).host = `/proc/${initPid}/root${SOCKET_MOUNT}`;
    this.execDir = join(this.socketDir.host, EXEC_DIR);
    this.outputDev = statSync(this.socketDir.host).dev;
    this.namespaces = ownNamespaces(initPid);
    this.enter = buildEnterArgs({
      initPid,
      namespaces: this.namespaces,
      ...(this.cgroup === undefined ? {} : { cgroupProcs: this.cgroup.procsFiles }),
      ...(this.user === undefined ? {} : { user: this.user }),
    });
    // The agent's stdout can be written from inside the sandbox (same uid: pidfd_getfd). It is
    // parsed in bounded time and memory: lines are short and well-formed, or the sandbox ends.
    this.init.stdout!.on('data', (chunk: Buffer) => {
      let from = 0;
      for (let newline = chunk.indexOf(10); newline >= 0; newline = chunk.indexOf(10, from)) {
        if (this.agentLine.length + newline - from > MAX_AGENT_LINE) return this.corrupt();
        const line = this.agentLine + chunk.toString('latin1', from, newline);
        this.agentLine = '';
        from = newline + 1;
        if (!AGENT_LINE.test(line)) return this.corrupt();
        const space = line.indexOf(' ');
        const id = line.slice(0, space);
        this.pending.get(id)?.(Number(line.slice(space + 1)));
        this.pending.delete(id);
      }
      if (this.agentLine.length + chunk.length - from > MAX_AGENT_LINE) return this.corrupt();
      this.agentLine += chunk.toString('latin1', from);
    });
    this.init.stderr!.resume();
    this.monitor = setInterval(() => this.checkLimits(), LIMIT_CHECK_MS);
    this.monitor.unref();
  }

  /** The sandbox's own output tmpfs (reached through /proc/<init>/root: every directory on the way is the sandbox's). */
  protected override socketDevice(): number {
    return this.outputDev;
  }

  protected override stagingDir(): { host: string; sandbox: string } {
    return { host: this.inputDir, sandbox: INPUT_MOUNT };
  }

  /**
   * The input tmpfs exists only in the mount namespace of bwrap's own process (the prefix's,
   * mounts.ts), the one place it is writable: the sandbox sees it through a read-only bind. The
   * service holds its root open from there, checked to be the very file system bound at
   * INPUT_MOUNT, and writes through /proc/self/fd/<fd>: no path the sandbox or anyone else could
   * change lies on the way. (Our child, the guard or bwrap, stays unreaped while the sandbox runs.)
   */
  private openInput(): void {
    const fd = openSync(`/proc/${this.init.pid}/root${this.input.host}`, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      const held = fstatSync(fd);
      const bound = statSync(`/proc/${this.initPid}/root${INPUT_MOUNT}`);
      if (held.dev !== bound.dev || held.ino !== bound.ino) throw new Error('the input directory is not the file system the sandbox has at its input mount');
    } catch (error) {
      closeSync(fd);
      throw new RolloutError({ code: 'SANDBOX', message: `cannot open the sandbox's input directory: ${(error as Error).message}`, retryable: true });
    }
    this.inputFd = fd;
    this.inputDir = `/proc/self/fd/${fd}`;
  }

  /** Something inside wrote to the exec channel: nothing it says can be trusted any more. */
  private corrupt(): void {
    this.init.stdout!.removeAllListeners('data');
    this.init.stdout!.resume();
    this.endForLimit('a process in the sandbox wrote to the exec agent\'s control channel');
  }

  private endForLimit(reason: string): void {
    if (this.limitReason !== undefined || this.closed) return;
    this.limitReason = reason;
    void this.close();
  }

  override checkLimits(): string | undefined {
    if (this.limitReason !== undefined || this.closed || this.initPid === 0) return this.limitReason;
    const reason = this.cgroup?.exceeded() ?? this.storageExceeded();
    if (reason !== undefined) this.endForLimit(reason);
    return this.limitReason;
  }

  /**
   * The workspace, /tmp or /dev/shm full, or holding all the files it may (the kernel already
   * refused the next one: each is a tmpfs of that size and inode count, see mounts.ts).
   */
  private storageExceeded(): string | undefined {
    const root = `/proc/${this.initPid}/root`;
    const shares = inodeShares(this.limits.maxInodes);
    for (const [mount, label, sizeMib, files] of [
      [this.workdir, 'workspace', this.limits.workspaceMib, shares.workspace],
      ['/tmp', '/tmp', this.limits.tmpMib, shares.tmp],
      ['/dev/shm', '/dev/shm', shmMib(this.limits), shares.shm],
    ] as const) {
      let stats;
      try {
        stats = statfsSync(root + mount);
      } catch {
        return undefined; // ending already
      }
      if (stats.bavail === 0) return `${label} is full: the sandbox may write ${sizeMib} MiB there`;
      if (stats.ffree === 0) {
        return (
          `too many files: ${label} holds the ${files} files and directories it may (the sandbox may create ${this.limits.maxInodes} ` +
          `in its workspace, /tmp and /dev/shm together: ${shares.workspace}, ${shares.tmp} and ${shares.shm})`
        );
      }
    }
    return undefined;
  }

  protected override async execRaw(
    command: string,
    options: SandboxExecOptions = {},
  ): Promise<{ stdout: Buffer; stderr: Buffer; returnCode: number; errorType?: 'timeout' | 'sandbox' }> {
    const sandboxError = (message: string) => ({
      stdout: Buffer.alloc(0),
      stderr: Buffer.from(message),
      returnCode: 125,
      errorType: 'sandbox' as const,
    });
    if (this.closed) return sandboxError(this.closedMessage());
    if (this.exited) return sandboxError('sandbox agent exited');
    const id = `x${(++this.seq).toString(36)}${randomBytes(4).toString('hex')}`;
    const base = join(this.execDir, id);
    const input = join(this.inputDir, id);
    let script = '';
    for (const [key, value] of Object.entries({ ...this.spec.env, ...options.env })) {
      if (!ENV_NAME.test(key)) return sandboxError(`invalid environment variable name ${JSON.stringify(key)}`);
      if (key !== 'ROLLSERVE_SANDBOX') script += `export ${key}=${shQuote(value)}\n`;
    }
    script += `cd -- ${shQuote(options.cwd ?? this.workdir)} || exit 1\n${command}\n`;
    try {
      writeFileSync(`${input}.sh`, script, { flag: 'wx', mode: 0o644 });
      if (options.stdin !== undefined) writeFileSync(`${input}.in`, options.stdin, { flag: 'wx', mode: 0o644 });
    } catch (error) {
      return sandboxError(`cannot stage the command: ${(error as Error).message}`);
    }
    const timeoutMs = options.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS;
    let timer: NodeJS.Timeout | undefined;
    const done = new Promise<number>((resolve) => this.pending.set(id, resolve));
    const gone = this.exitedPromise.then(() => 'gone' as const);
    this.init.stdin!.write(`${id}\n`);
    const first = await Promise.race([
      done,
      gone,
      new Promise<'timeout'>((resolve) => {
        timer = setTimeout(() => resolve('timeout'), timeoutMs);
      }),
    ]);
    clearTimeout(timer);
    let outcome: number | 'timeout' | 'gone' = first;
    if (first === 'timeout') {
      killTree(undefined, this.killOptions(`ROLLSERVE_SANDBOX=${id}`));
      // let the files settle: the agent reports once the killed shell is reaped
      await Promise.race([done, gone, new Promise((resolve) => setTimeout(resolve, 200))]);
    }
    this.pending.delete(id);
    const cap = options.maxOutputBytes ?? 10 * 1024 * 1024;
    const stdout = readCapped(`${base}.out`, cap, this.outputDev);
    const stderr = readCapped(`${base}.err`, cap, this.outputDev);
    unlinkQuiet(`${input}.sh`);
    if (options.stdin !== undefined) unlinkQuiet(`${input}.in`);
    for (const suffix of ['.out', '.err']) unlinkQuiet(`${base}${suffix}`);
    if (outcome !== 'timeout' && outcome !== 'gone' && !this.closed) this.checkLimits();
    if (outcome === 'gone' || this.closed) {
      const why = this.limitReason === undefined ? 'sandbox ended while the command ran' : `sandbox ended: ${this.limitReason}`;
      return { stdout, stderr: Buffer.concat([stderr, Buffer.from(`${why}\n`)]), returnCode: 125, errorType: 'sandbox' };
    }
    if (outcome === 'timeout') {
      const notice = Buffer.from(`\ncommand timed out after ${timeoutMs} ms\n`);
      return { stdout, stderr: Buffer.concat([stderr, notice]), returnCode: 125, errorType: 'timeout' };
    }
    return { stdout, stderr, returnCode: outcome };
  }

  forkKernel(request: SandboxKernelFork): Promise<{ process: SandboxProcess; mode: string }> | undefined {
    if (this.closed || this.exited || this.forkServers === undefined || this.pidNamespace === undefined) return undefined;
    const tag = this.nextTag();
    const env = this.env({ PYTHONUNBUFFERED: '1', PYTHONDONTWRITEBYTECODE: '1', ...request.env }, tag);
    const python = this.forkServers.resolve(request.python, env);
    // a preload is imported by the kernel's server, unless the kernel's environment sets what
    // such modules read as they load (then the kernel imports it, forked from the server without)
    const preload = request.preload ?? [];
    const ownImports = preload.length > 0 && Object.keys(env).some((name) => IMPORT_TIME_VARS.test(name));
    if (ownImports) env.ROLLSERVE_PYTHON_PRELOAD = preload.join(',');
    const server = python === undefined ? undefined : this.forkServers.get(python, false, preload.length > 0 && !ownImports ? { modules: [...preload] } : undefined);
    if (server === undefined) return undefined;
    const killOptions = this.killOptions(`ROLLSERVE_SANDBOX=${tag}`);
    let resolveExit: (code: number) => void = () => {};
    const exited = new Promise<number>((resolve) => {
      resolveExit = resolve;
    });
    return (async () => {
      const { pid, mode } = await server.fork(
        {
          ...this.forkRequest(env),
          socket: `${this.socketDir.sandbox}/${request.socketName}`,
          plain: request.plain || env.ROLLSERVE_PYTHON_SHELL === 'plain',
        },
        request.timeoutMs,
        (code) => resolveExit(code),
      );
      // the kernel's start time: with it, a kernel whose server ended is told from a process that reused its pid
      const started = startTimeOf(pid);
      const kill = (): void => {
        if (!killForked(server, pid, started)) resolveExit(137);
        // what it started and what left its process group, by the tag its environment carries
        this.sweep(killOptions);
      };
      const untrack = this.track(pid, kill);
      void exited.then(untrack);
      const stdin = new PassThrough();
      stdin.resume();
      const proc: SandboxProcess = {
        pid,
        stdout: new PassThrough(),
        stderr: new PassThrough(),
        stdin,
        exited,
        kill: (signal?: NodeJS.Signals) => {
          if (signal === undefined || signal === 'SIGKILL') kill();
          else if (server.owns(pid)) {
            try {
              process.kill(-pid, signal);
            } catch {
              // gone
            }
          }
        },
      };
      return { process: proc, mode };
    })();
  }

  forkPython(request: SandboxPythonRun): Promise<SandboxPythonResult> | undefined {
    if (this.closed || this.exited || this.forkServers === undefined || this.pidNamespace === undefined) return undefined;
    const tag = this.nextTag();
    const env = this.env(request.env, tag);
    const python = this.forkServers.resolve(request.python, env);
    const server = python === undefined ? undefined : this.forkServers.get(python, true, request.preload);
    if (server === undefined || (request.channel !== undefined && request.preload?.module?.host === undefined)) return undefined;
    const id = `f${(++this.seq).toString(36)}${randomBytes(4).toString('hex')}`;
    const input = join(this.inputDir, `${id}.in`);
    const out = join(this.execDir, id);
    const inside = `${this.socketDir.sandbox}/${EXEC_DIR}/${id}`;
    const killOptions = this.killOptions(`ROLLSERVE_SANDBOX=${tag}`);
    return (async () => {
      if (request.stdin !== undefined) writeFileSync(input, request.stdin, { flag: 'wx', mode: 0o644 });
      let resolveExit: (code: number) => void = () => {};
      const exited = new Promise<number>((resolve) => {
        resolveExit = resolve;
      });
      const timeoutMs = request.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS;
      let pid: number;
      let channel: ForkChannel | undefined;
      try {
        ({ pid, channel } = await server.fork(
          {
            ...this.forkRequest(env),
            socket: '',
            plain: true,
            run: {
              code: request.code,
              stdin: request.stdin === undefined ? undefined : `${INPUT_MOUNT}/${id}.in`,
              stdout: `${inside}.out`,
              stderr: `${inside}.err`,
              ...(request.channel === undefined ? {} : { channel: request.channel }),
            },
          },
          timeoutMs,
          (code) => resolveExit(code),
        ));
      } finally {
        // the program holds it open by now: nothing else inside reads it from here on
        if (request.stdin !== undefined) unlinkQuiet(input);
      }
      const kill = (): void => {
        server.kill(pid);
        killTree(undefined, killOptions);
      };
      const untrack = this.track(pid, kill);
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<'timeout'>((resolve) => {
        timer = setTimeout(() => resolve('timeout'), timeoutMs);
      });
      // with a channel: its answer ends the run (the program has nothing more to tell), and an
      // exit waits for it (its end comes with the last holder of the pipe's write end)
      let answer: ChannelAnswer | undefined;
      const answered = channel?.answer.then((value) => {
        answer = value;
        return 'answered' as const;
      });
      let outcome = await Promise.race(answered === undefined ? [exited, timeout] : [exited, timeout, answered]);
      if (outcome === 'answered') {
        server.kill(pid);
        outcome = await Promise.race([exited, timeout]);
      } else if (answered !== undefined && outcome !== 'timeout') {
        // The program has ended within its time: the grading of what it sent is not its time.
        // The grader answers within its CPU budget (an rlimit of the channel's own process);
        // this bound only ends the wait for a channel whose write end a leftover process of the
        // sandbox still holds, which is that run's failure alone.
        clearTimeout(timer);
        let graceTimer: NodeJS.Timeout | undefined;
        const grace = new Promise<'timeout'>((resolve) => {
          graceTimer = setTimeout(() => resolve('timeout'), Math.max(timeoutMs, CHANNEL_GRACE_MS));
        });
        if ((await Promise.race([answered, grace])) === 'timeout') channel!.drop();
        clearTimeout(graceTimer);
      }
      clearTimeout(timer);
      if (outcome === 'timeout') {
        channel?.drop();
        kill();
        await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 1000))]);
      }
      untrack();
      const cap = request.maxOutputBytes ?? 10 * 1024 * 1024;
      const stdout = readCapped(`${out}.out`, cap, this.outputDev).toString('utf8');
      const stderr = readCapped(`${out}.err`, cap, this.outputDev).toString('utf8');
      for (const suffix of ['.out', '.err']) unlinkQuiet(`${out}${suffix}`);
      const told = answer === undefined ? {} : { channel: answer };
      if (this.closed) return { stdout, stderr: `${stderr}${this.closedMessage()}\n`, returnCode: 125, errorType: 'sandbox' as const, ...told };
      if (outcome === 'timeout') return { stdout, stderr: `${stderr}\ncommand timed out after ${timeoutMs} ms\n`, returnCode: 125, errorType: 'timeout' as const, ...told };
      return { stdout, stderr, returnCode: outcome as number, ...told };
    })();
  }

  /**
   * A program on a terminal, for a root service: started by the provider's shell spawner in the
   * sandbox (a fork of a small perl: spawner.ts `enter`), else as a fork of the bare fork server (the fork takes the
   * terminal's master from the service: pidfd_getfd); for an unprivileged service as every
   * entering process (node-pty's fork of the service, then the cgroup's sh, setpriv, nsenter and
   * sh's ulimits before the program). Either fork enters, drops and limits as a kernel does.
   */
  override spawnPty(argv: string[], options: SandboxPtyOptions = {}): SandboxPty {
    return this.forkPty(argv, options) ?? super.spawnPty(argv, options);
  }

  private forkPty(argv: string[], options: SandboxPtyOptions): SandboxPty | undefined {
    if (process.getuid?.() !== 0 || this.closed || this.exited || this.forkServers === undefined || this.pidNamespace === undefined) return undefined;
    const spawner = this.shellSpawner?.();
    let server: ReturnType<KernelForkServers['get']>;
    if (spawner === undefined) {
      const python = this.forkServers.resolve('python3', BASE_ENV);
      server = python === undefined ? undefined : this.forkServers.get(python, true);
      if (server === undefined) return undefined;
    }
    const tag = this.nextTag();
    const env = this.env(options.env, tag);
    env.TERM ??= 'dumb';
    const killOptions = this.killOptions(`ROLLSERVE_SANDBOX=${tag}`);
    const master = openMaster();
    const dataListeners = new Set<(data: string) => void>();
    const exitListeners = new Set<(exit: { exitCode: number; signal?: number }) => void>();
    let pid = -1;
    let ended = false;
    let exit: { exitCode: number; signal?: number } | undefined;
    let untrack = (): void => {};
    master.onData((data) => {
      for (const listener of dataListeners) listener(data);
    });
    // the exit is told once the terminal has given all the program wrote (its other side closed
    // everywhere), or shortly after the exit where a job left behind holds it open
    const settle = (): void => {
      if (exit === undefined || ended) return;
      ended = true;
      untrack();
      master.close();
      for (const listener of exitListeners) listener(exit);
      exitListeners.clear();
    };
    const exited = (code: number): void => {
      if (exit !== undefined) return;
      exit = code > 128 ? { exitCode: 0, signal: code - 128 } : { exitCode: code };
      master.onClosed(settle);
      setTimeout(settle, 200).unref();
    };
    let startTime: string | undefined;
    const kill = (): void => {
      if (spawner !== undefined) {
        if (pid > 0) spawner.killEntered(pid);
      } else if (pid > 0 && !killForked(server!, pid, startTime)) {
        // with its server gone its end will not be told: it has ended now
        exited(137);
      }
      this.sweep(killOptions);
    };
    // a shell whose server died: its end is its terminal's (a spawner's death is told: its sandboxes end with it)
    master.onClosed(() => {
      if (exit === undefined && pid > 0 && server !== undefined && !server.alive()) exited(137);
    });
    let terminated = false;
    const cols = options.cols ?? 200;
    const rows = options.rows ?? 50;
    const request = this.forkRequest(env, options.cwd ?? this.workdir);
    const tty = { fd: master.fd, cols, rows, plain: options.plain === true };
    const { as, fsize, cpu, nofile, nproc, core } = request.rlimits;
    const forked =
      spawner !== undefined
        ? spawner.enter(
            {
              ...request,
              // RLIMIT_AS, _FSIZE, _CPU, _NOFILE, _NPROC, _CORE
              rlimits: [[9, as], [1, fsize], [0, cpu], [7, nofile], [6, nproc], [4, core]],
              argv,
              tty,
            },
            exited,
          )
        : server!.fork({ ...request, socket: '', plain: true, exec: { argv, tty } }, 15_000, exited).then((started) => started.pid);
    forked
      .then(
        (started) => {
          pid = started;
          // (a spawner's child is the spawner's until reported reaped: its pid cannot be another's)
          if (spawner === undefined) startTime = startTimeOf(pid);
          untrack = this.track(pid, kill);
          if (terminated || this.closed) kill();
        },
        (error: Error) => {
          for (const listener of dataListeners) listener(`${error.message}\r\n`);
          exited(125);
          settle();
        },
      );
    return {
      get pid() {
        return pid;
      },
      plain: options.plain === true,
      write: (data) => master.write(data),
      onData: (listener) => {
        dataListeners.add(listener);
        return { dispose: () => dataListeners.delete(listener) };
      },
      onExit: (listener) => {
        if (ended) {
          queueMicrotask(() => listener(exit!));
          return { dispose: () => {} };
        }
        exitListeners.add(listener);
        return { dispose: () => exitListeners.delete(listener) };
      },
      killChildren: () => {
        if (pid > 0 && exit === undefined) for (const child of childrenOf(pid)) killTree(child);
      },
      terminate: () => {
        terminated = true;
        if (exit === undefined) kill();
      },
    };
  }

  /**
   * Ends, by the tag their environment carries, the processes an ended shell or kernel started
   * that left its process group, shortly after, unless the sandbox ends first: its end kills every
   * process of its pid namespace, and the sweep reads every process of the host (a shell and a
   * kernel closed just before their sandbox, as a rollout closes them, cost 17 ms of the
   * service's CPU in `readlink`s on a host with a few hundred processes).
   */
  private sweep(killOptions: KillTreeOptions): void {
    if (this.closed) return;
    setTimeout(() => {
      if (!this.closed) killTree(undefined, killOptions);
    }, SWEEP_DELAY_MS).unref();
  }

  /** What every fork into this sandbox is given: its namespaces, cgroup, uid, limits, workdir and `env`. */
  private forkRequest(env: Record<string, string>, cwd = this.workdir): Omit<KernelForkRequest, 'socket' | 'plain'> {
    const mib = 1024 * 1024;
    const limits = this.limits;
    return {
      initPid: this.initPid,
      pidNamespace: Number(/\[(\d+)\]/.exec(this.pidNamespace!)?.[1] ?? 0),
      namespaces: this.namespaces,
      cgroupProcs: this.cgroup?.procsFiles ?? [],
      user: this.user,
      rlimits: { as: limits.memoryMib * mib, fsize: limits.maxFileSizeMib * mib, cpu: limits.cpuSeconds, nofile: limits.maxOpenFiles, nproc: limits.maxProcesses, core: 0 },
      cwd,
      env,
    };
  }

  protected wrap(inner: string[], env: Record<string, string>): HostCommand {
    return { argv: [...this.enter, ...inner], env, cwd: '/' };
  }

  protected override limitScript(): string {
    return ulimitScript(this.limits);
  }

  protected override killOptions(tag: string): KillTreeOptions {
    return {
      envTag: tag,
      ...(this.pidNamespace === undefined ? {} : { pidNamespace: this.pidNamespace }),
      // every process of the sandbox is in its cgroup (bwrap joins it before it forks, an
      // entering process before it enters), which nothing inside can leave: a sweep reads the
      // sandbox's processes rather than the host's
      candidates: () => this.cgroup?.pids(),
    };
  }

  protected override killEntered(leader: number, tag: string, running: () => boolean): void {
    // nsenter (outside the pid namespace) must reap its child itself: see killDescendants
    killDescendants(leader);
    killTree(undefined, this.killOptions(`ROLLSERVE_SANDBOX=${tag}`));
    setTimeout(() => {
      if (!running()) return; // exited, as it should (and its pid may belong to someone else now)
      try {
        process.kill(leader, 'SIGKILL');
      } catch {
        // raced with its exit
      }
    }, 1000).unref();
  }

  protected override isSandboxFailure(stderr: string): boolean {
    return /^(nsenter|setpriv|prlimit|rs-cgroup|rs-limits):/m.test(stderr);
  }

  async status(): Promise<SandboxStatus> {
    if (this.closed) return 'stopped';
    return this.exited ? 'error' : 'running';
  }

  protected async stop(): Promise<void> {
    clearInterval(this.monitor);
    if (!this.exited) {
      // pid 1 of the namespace: the kernel kills every process of the sandbox before it is reaped
      if (this.initPid > 0) {
        try {
          process.kill(this.initPid, 'SIGKILL');
        } catch {
          // already gone
        }
      } else {
        this.init.kill('SIGKILL');
      }
      const timer = setTimeout(() => this.init.kill('SIGKILL'), 2000);
      await this.exitedPromise;
      clearTimeout(timer);
    }
    for (const resolve of this.pending.values()) resolve(125);
    this.pending.clear();
    if (this.inputFd >= 0) {
      // (it holds the input tmpfs, and what is left in it, until closed)
      closeSync(this.inputFd);
      this.inputFd = -1;
    }
  }

  /**
   * The sandbox's directory holds its owner file and the empty mount point of its scratch tmpfs
   * (provider.ts): three removals on the spot, not a recursive walk through the thread pool; a
   * directory holding more (no scratch tmpfs, an image's layer) is walked as before.
   */
  protected override async removeTempDirs(): Promise<void> {
    const left: string[] = [];
    for (const dir of this.tempDirs) {
      try {
        rmdirSync(join(dir, 'mnt'));
        unlinkSync(join(dir, OWNER_FILE));
        rmdirSync(dir);
      } catch {
        left.push(dir);
      }
    }
    await Promise.all(left.map((dir) => rm(dir, { recursive: true, force: true, maxRetries: 3 })));
  }

  protected override async released(): Promise<void> {
    this.releaseImage?.();
    if (this.cgroup !== undefined) await removeCgroup(this.cgroup);
  }

  /** Whether the sandbox still runs (a warm one may have been killed while it waited). */
  alive(): boolean {
    return !this.exited && !this.closed;
  }

  /** Hands a warm sandbox its spec (env and files; the rest matched the pool's). */
  adopt(spec: ResolvedSandboxSpec): void {
    (this as unknown as { spec: ResolvedSandboxSpec }).spec = spec;
  }

  /** Fails `create` cleanly. */
  async abort(): Promise<void> {
    this.init.kill('SIGKILL');
    await this.close();
  }
}

/** Removes a sandbox's cgroup once its last process is reaped (that takes a moment after a SIGKILL). */
export async function removeCgroup(cgroup: SandboxCgroup): Promise<void> {
  for (let attempt = 0; attempt < 50; attempt++) {
    if (cgroup.remove()) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  // an init that is slow to reap the last zombies: go on trying without holding close()
  const retry = (left: number): void => {
    if (cgroup.remove() || left === 0) return;
    setTimeout(() => retry(left - 1), 500).unref();
  };
  retry(60);
}

/**
 * Kills a process a fork server forked: through the server while it lives (true: the server tells
 * its end), else by pid and process group, only if the pid is still the process started then.
 */
function killForked(server: { alive(): boolean; kill(pid: number): void }, pid: number, started: string | undefined): boolean {
  if (server.alive()) {
    server.kill(pid);
    return true;
  }
  if (started !== undefined && startTimeOf(pid) === started) {
    for (const target of [-pid, pid]) {
      try {
        process.kill(target, 'SIGKILL');
      } catch {
        // gone
      }
    }
  }
  return false;
}

/** A process's start time (clock ticks after boot: /proc/<pid>/stat's 22nd field), or undefined when it is gone. */
function startTimeOf(pid: number): string | undefined {
  return readStat(pid)?.starttime;
}
