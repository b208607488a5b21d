import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { accessSync, constants, readFileSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Readable, Writable } from 'node:stream';
import { RolloutError } from '../../errors.ts';
import { BASE_ENV, MODULE_NAME, type SandboxPythonRun } from '../types.ts';

/*
 * The kernel fork server (packages/core/python/rollserve_forkserver.py): one Python process per
 * interpreter that has imported the kernel and IPython, and made and warmed an InteractiveShell,
 * once. A kernel is a fork of it that enters the sandbox as `nsenter` would (cgroup, the drop to
 * the sandbox uid, user namespace first, then the sandbox's others; pid through a second fork),
 * gives up the capabilities entering gave it, sets the sandbox's rlimits, and serves the kernel
 * protocol. Measured (`pnpm bench kernel`): a spawned kernel costs ≈ 400 ms of CPU, most of it
 * importing IPython; a forked one a few ms.
 *
 * The server runs on the host as the service and never runs a sandbox's code; it dies with the
 * service (PR_SET_PDEATHSIG, and stdin's end), reaps its kernels (a child subreaper) and reports
 * their ends. One that dies is replaced at the next request; its kernels live on in their
 * sandboxes (they end with them) and are ended by pid, checked to be theirs still.
 */

const KERNEL_SOURCE = fileURLToPath(new URL('../../../python/rollserve_kernel.py', import.meta.url));
const SERVER_SOURCE = fileURLToPath(new URL('../../../python/rollserve_forkserver.py', import.meta.url));

/**
 * The server's command line names no host path (a kernel's /proc/<pid>/cmdline is the server's):
 * the sources come on fd 3, the kernel's, a NUL, the server's, a NUL, the preload (JSON).
 */
const LOADER =
  "import os;f=os.fdopen(3,'rb');k,_,s=f.read().decode().partition('\\0');f.close();s,_,p=s.partition('\\0');" +
  "import sys;g={'__name__':'rollserve_forkserver'};exec(compile(s,'<rollserve-forkserver>','exec'),g);g['main'](k,'bare' in sys.argv,p)";

/** What a bare server prepares for its programs (`SandboxPythonRun.preload`). */
export type ForkServerPreload = NonNullable<SandboxPythonRun['preload']>;

/** What a kernel fork needs to know of its sandbox and of itself. */
export interface KernelForkRequest {
  /** Host pid of the sandbox's init, whose namespaces the kernel enters. */
  initPid: number;
  /** Inode of that init's pid namespace: a reused pid is refused. */
  pidNamespace: number;
  /** Namespaces besides user, mount and pid to enter. */
  namespaces: string[];
  cgroupProcs: string[];
  /** The sandbox uid a root service drops to. */
  user: { uid: number; gid: number } | undefined;
  rlimits: { as: number; fsize: number; cpu: number; nofile: number; nproc: number; core: number };
  cwd: string;
  env: Record<string, string>;
  /** The kernel's socket, a path inside the sandbox. */
  socket: string;
  plain: boolean;
  /**
   * Instead of a kernel: a program run as `python -I -c`, stdin from `stdin`, output to `stdout`, `stderr` (paths inside).
   * `channel`: its descriptor 3 is a pipe to the server's grader (a server whose preload module names `host`), which
   * grades it with `data`, sent once the program runs (`SandboxPythonRun.channel`).
   */
  run?: { code: string; stdin: string | undefined; stdout: string; stderr: string; channel?: { data: unknown } };
  /**
   * Instead of a kernel: `argv` exec'd on the terminal whose master is this process's descriptor
   * `tty.fd` (taken by the fork with pidfd_getfd: a root service only), as its controlling terminal.
   */
  exec?: { argv: string[]; tty: { fd: number; cols: number; rows: number; plain?: boolean } };
}

/** The grader's answer for one program's channel: `host(data)`'s return value, or why there is none. */
export type ChannelAnswer = { result: unknown } | { error: string };

/** A forked program's channel: the grader's answer, once, and `drop()` for one the service stops waiting for (its grading is killed). */
export interface ForkChannel {
  answer: Promise<ChannelAnswer>;
  drop(): void;
}

interface Pending {
  /** Registered as the answer is read: its exit may be the very next line. */
  onExit(code: number): void;
  resolve(started: { pid: number; mode: string; channel?: ForkChannel }): void;
  reject(error: Error): void;
  abandoned: boolean;
  /** The channel's data, sent to the grader once the program runs (never before: see the server's header). */
  channel?: { data: unknown };
}

export class KernelForkServer {
  private readonly child: ChildProcess;
  private readonly ready: Promise<string>;
  private readonly pending = new Map<number, Pending>();
  private readonly exits = new Map<number, (code: number) => void>();
  private seq = 0;
  private line = '';
  private dead = false;
  /** The grader's pipes (a server whose preload module names `host`), and the channels it owes an answer. */
  private readonly grader: { input: Writable; output: Readable } | undefined;
  private readonly answers = new Map<number, (answer: ChannelAnswer) => void>();
  private graderLine = '';
  /** Why no answer will come any more (the grader's pipe ended). */
  private graderEnded: string | undefined;
  /** Resolves once the server process has ended. */
  readonly ended: Promise<void>;

  /**
   * `bare`: without IPython or the kernel, for programs (`forkPython`) and shells: what a
   * program finds in the interpreter is close to a new one's, plus `preload` (imported and made
   * once, before any fork). A kernel server takes `preload.modules` alone, imported before its
   * shell is made (`PythonKernelOptions.preload`).
   */
  constructor(
    readonly python: string,
    readonly bare = false,
    preload?: ForkServerPreload,
  ) {
    const graded = bare && preload?.module?.host !== undefined;
    this.child = spawn(python, ['-s', '-c', LOADER, ...(bare ? ['bare'] : [])], {
      env: { ...BASE_ENV, PYTHONUNBUFFERED: '1', PYTHONDONTWRITEBYTECODE: '1' },
      cwd: '/',
      stdio: ['pipe', 'pipe', 'pipe', 'pipe', ...(graded ? (['pipe', 'pipe'] as const) : [])],
    });
    const stdio = this.child.stdio as unknown as Array<Writable | Readable | null>;
    if (graded) {
      this.grader = { input: stdio[4] as Writable, output: stdio[5] as Readable };
      this.grader.input.on('error', () => {});
      this.grader.output.on('data', (chunk: Buffer) => this.onGraderData(chunk));
      // its end (the grader died; the server ends as well): no answer will come
      this.grader.output.on('close', () => this.failChannels('the grader ended'));
    }
    // an idle server keeps no service alive (one that forgot its provider exits as before)
    this.child.unref();
    for (const stream of [this.child.stdin, this.child.stdout, this.child.stderr, this.grader?.input, this.grader?.output]) {
      (stream as unknown as { unref?(): void } | null | undefined)?.unref?.();
    }
    const sources = stdio[3] as Writable;
    sources.on('error', () => {});
    sources.end(
      Buffer.concat([readFileSync(KERNEL_SOURCE), Buffer.from([0]), readFileSync(SERVER_SOURCE), Buffer.from([0]), Buffer.from(JSON.stringify(preload ?? {}))]),
    );
    this.child.stdin!.on('error', () => {});
    let stderr = '';
    this.child.stderr!.on('data', (chunk: Buffer) => {
      if (stderr.length < 4096) stderr += chunk.toString('utf8');
    });
    this.ended = new Promise<void>((resolve) => {
      this.child.once('exit', () => resolve());
      this.child.once('error', () => resolve());
    }).then(() => {
      this.dead = true;
      const error = new RolloutError({ code: 'SANDBOX', message: `the kernel fork server ended: ${stderr.trim()}`, retryable: true });
      for (const entry of this.pending.values()) entry.reject(error);
      this.pending.clear();
      this.failChannels('the kernel fork server ended');
    });
    this.ready = new Promise<string>((resolve, reject) => {
      this.child.stdout!.on('data', (chunk: Buffer) => {
        this.line += chunk.toString('utf8');
        for (let newline = this.line.indexOf('\n'); newline >= 0; newline = this.line.indexOf('\n')) {
          const text = this.line.slice(0, newline);
          this.line = this.line.slice(newline + 1);
          const ready = /^READY (\w+)$/.exec(text);
          if (ready !== null) resolve(ready[1]!);
          else this.onMessage(text);
        }
      });
      void this.ended.then(() => reject(new RolloutError({ code: 'SANDBOX', message: `the kernel fork server did not start: ${stderr.trim()}`, retryable: true })));
    });
    this.ready.catch(() => undefined);
  }

  /** The server's pid (tests end it to see it replaced). */
  get pid(): number | undefined {
    return this.child.pid;
  }

  alive(): boolean {
    return !this.dead;
  }

  /** Resolves once the server has imported what it forks ('ipython' or 'plain'). */
  started(): Promise<string> {
    return this.ready;
  }

  private onMessage(text: string): void {
    let message: { id?: number; pid?: number; mode?: string; error?: string; exit?: number; code?: number };
    try {
      message = JSON.parse(text) as typeof message;
    } catch {
      return;
    }
    if (typeof message.exit === 'number') {
      this.exits.get(message.exit)?.(message.code ?? 125);
      this.exits.delete(message.exit);
      return;
    }
    const entry = message.id === undefined ? undefined : this.pending.get(message.id);
    if (entry === undefined) return;
    this.pending.delete(message.id!);
    if (message.error !== undefined || typeof message.pid !== 'number') {
      entry.reject(new RolloutError({ code: 'SANDBOX', message: `kernel fork: ${message.error ?? 'no pid'}`, retryable: true }));
    } else if (entry.abandoned) {
      this.kill(message.pid);
      if (entry.channel !== undefined) this.sendGrader({ drop: message.id });
    } else {
      this.exits.set(message.pid, entry.onExit);
      let channel: ForkChannel | undefined;
      if (entry.channel !== undefined) {
        const id = message.id!;
        const answer = new Promise<ChannelAnswer>((resolve) => {
          if (this.graderEnded === undefined) this.answers.set(id, resolve);
          else resolve({ error: this.graderEnded });
        });
        const drop = (): void => {
          if (this.answers.delete(id)) this.sendGrader({ drop: id });
        };
        channel = { answer, drop };
        // the program runs by now: what the grader is given is in no process it was forked from
        this.sendGrader({ id, data: entry.channel.data });
      }
      entry.resolve({ pid: message.pid, mode: message.mode ?? 'plain', ...(channel === undefined ? {} : { channel }) });
    }
  }

  private onGraderData(chunk: Buffer): void {
    this.graderLine += chunk.toString('utf8');
    for (let newline = this.graderLine.indexOf('\n'); newline >= 0; newline = this.graderLine.indexOf('\n')) {
      const text = this.graderLine.slice(0, newline);
      this.graderLine = this.graderLine.slice(newline + 1);
      let message: { id?: unknown; result?: unknown; error?: unknown };
      try {
        message = JSON.parse(text) as typeof message;
      } catch {
        continue;
      }
      if (typeof message.id !== 'number') continue;
      const resolve = this.answers.get(message.id);
      if (resolve === undefined) continue;
      this.answers.delete(message.id);
      resolve('result' in message ? { result: message.result } : { error: String(message.error ?? 'no answer') });
    }
  }

  private failChannels(error: string): void {
    this.graderEnded ??= error;
    for (const resolve of this.answers.values()) resolve({ error });
    this.answers.clear();
  }

  private sendGrader(message: object): void {
    if (this.dead || this.grader === undefined) return;
    this.grader.input.write(`${JSON.stringify(message)}\n`);
  }

  /**
   * Forks a kernel into the sandbox; resolves once it listens on its socket. `onExit` is called
   * with its exit code when the server reaps it.
   */
  async fork(
    request: KernelForkRequest,
    timeoutMs: number,
    onExit: (code: number) => void,
  ): Promise<{ pid: number; mode: string; channel?: ForkChannel }> {
    await this.ready;
    if (this.dead) throw new RolloutError({ code: 'SANDBOX', message: 'the kernel fork server ended', retryable: true });
    const channel = request.run?.channel;
    if (channel !== undefined && this.grader === undefined) {
      throw new RolloutError({ code: 'SANDBOX', message: 'a channel needs a fork server whose preload names a host function' });
    }
    const id = ++this.seq;
    const entry: Pending = { onExit, resolve: () => {}, reject: () => {}, abandoned: false, ...(channel === undefined ? {} : { channel }) };
    const started = new Promise<{ pid: number; mode: string; channel?: ForkChannel }>((resolve, reject) => {
      entry.resolve = resolve;
      entry.reject = reject;
    });
    this.pending.set(id, entry);
    this.send({
      id,
      init: request.initPid,
      pidns: request.pidNamespace,
      ns: request.namespaces,
      cgroup_procs: request.cgroupProcs,
      user: request.user === undefined ? null : [request.user.uid, request.user.gid],
      rlimits: request.rlimits,
      cwd: request.cwd,
      env: request.env,
      socket: request.socket,
      plain: request.plain,
      ...(request.run === undefined ? {} : { run: request.run.code, stdin: request.run.stdin ?? null, stdout: request.run.stdout, stderr: request.run.stderr }),
      ...(channel === undefined ? {} : { channel: true }),
      ...(request.exec === undefined ? {} : { exec: request.exec.argv, tty: request.exec.tty }),
    });
    let timer: NodeJS.Timeout | undefined;
    try {
      const result = await Promise.race([
        started,
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new RolloutError({ code: 'SANDBOX', message: `kernel fork not ready after ${timeoutMs} ms`, retryable: true })), timeoutMs);
        }),
      ]);
      return result;
    } catch (error) {
      // a late answer is killed (onMessage)
      entry.abandoned = true;
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  /** SIGKILLs a kernel's process group, if the server has not reaped it yet. */
  kill(pid: number): void {
    this.send({ kill: pid });
  }

  /** Whether the server still owes the end of this kernel (not reaped, not reported). */
  owns(pid: number): boolean {
    return this.exits.has(pid);
  }

  /** Hands over the kernels of a dead server: their ends will not be reported. */
  orphans(): Array<[number, (code: number) => void]> {
    const list = [...this.exits];
    this.exits.clear();
    return list;
  }

  private send(message: object): void {
    if (this.dead) return;
    this.child.stdin!.write(`${JSON.stringify(message)}\n`);
  }

  /** Ends the server (its kernels live on in their sandboxes, which end them). */
  async close(): Promise<void> {
    if (!this.dead) {
      // (held: unref'd, its exit alone would not keep the event loop going, and this would never settle)
      this.child.ref();
      this.child.kill('SIGKILL');
      await this.ended;
    }
  }
}

/** Variables that change what an interpreter is (its path, its libraries): a fork of another cannot honour them. */
const INTERPRETER_VARS = /^(PYTHON|LD_)/;
/**
 * Variables numerical libraries read as they are loaded (thread counts of BLAS and OpenMP, numpy's
 * own): a module a kernel's server preloaded read the server's. A kernel whose environment sets
 * one imports its preload itself (PythonKernelOptions.preload).
 */
export const IMPORT_TIME_VARS = /^(OPENBLAS_|GOTO_|OMP_|KMP_|MKL_|BLIS_|VECLIB_|NUMEXPR_|NPY_|NUMPY_)/;
/** The locale the fork server starts with (BASE_ENV's). */
const LOCALE_VARS = ['LANG', 'LC_ALL', 'LC_CTYPE'];
/** The kernel's own, which the fork server has as well. */
const KERNEL_VARS = new Set(['PYTHONUNBUFFERED', 'PYTHONDONTWRITEBYTECODE']);

/** The fork servers of one provider, one per interpreter, each started at its first kernel and replaced when it ends. */
export class KernelForkServers {
  private readonly servers = new Map<string, KernelForkServer>();
  /** The digest of each preload object seen (its modules checked): a preload is a caller's constant. */
  private readonly digests = new WeakMap<ForkServerPreload, string>();
  private closed = false;

  /** `rootNames`: the host's top-level entries a sandbox without image sees as they are. */
  constructor(private readonly rootNames: ReadonlySet<string>) {}

  /**
   * The host path of the interpreter the sandbox would run for `python` with the environment
   * `env`, when the host's file is the sandbox's (found under the host root the sandbox shows)
   * and nothing in `env` changes the interpreter; undefined otherwise.
   */
  resolve(python: string, env: Record<string, string>): string | undefined {
    if (Object.keys(env).some((name) => INTERPRETER_VARS.test(name) && !KERNEL_VARS.has(name))) return undefined;
    // the encodings an interpreter takes from its locale at start
    if (LOCALE_VARS.some((name) => env[name] !== BASE_ENV[name])) return undefined;
    const candidates = python.includes('/') ? [python] : (env.PATH ?? '').split(':').map((dir) => `${dir}/${python}`);
    for (const candidate of candidates) {
      // (a directory the host root does not show, a workspace's bin, may hold another python)
      if (!candidate.startsWith('/') || candidate.includes('/../') || candidate.includes('/./')) return undefined;
      if (!this.rootNames.has(candidate.split('/')[1]!)) return undefined;
      try {
        // (a miss answered without an exception: ENOENT is the common case, once per directory
        // of PATH before the interpreter's, for every program)
        if (statSync(candidate, { throwIfNoEntry: false }) === undefined) continue;
        accessSync(candidate, constants.X_OK);
        return candidate;
      } catch {
        // not in this directory
      }
    }
    return undefined;
  }

  /**
   * The running server for the interpreter at `hostPath` (a new one if it has none or it ended);
   * `bare` and `preload`: see KernelForkServer (a bare server per distinct preload; a kernel
   * server per distinct list of modules, which is all of a preload a kernel's server takes).
   */
  get(hostPath: string, bare = false, preload?: ForkServerPreload): KernelForkServer | undefined {
    if (this.closed) return undefined;
    if (!bare) {
      const modules = preload?.modules ?? [];
      const bad = modules.find((name) => !MODULE_NAME.test(name));
      if (bad !== undefined) throw new RolloutError({ code: 'SANDBOX', message: `bad module name to preload: ${JSON.stringify(bad)}` });
      // (validated names hold no comma)
      return this.serverOf(`kernel:${hostPath}${modules.length === 0 ? '' : `:${modules.join(',')}`}`, () => new KernelForkServer(hostPath, false, modules.length === 0 ? undefined : { modules }));
    }
    const prepared = preload !== undefined && (preload.modules?.length || preload.module !== undefined) ? preload : undefined;
    let digest = prepared === undefined ? undefined : this.digests.get(prepared);
    if (prepared !== undefined && digest === undefined) {
      const names = [...(prepared.modules ?? []), ...(prepared.module === undefined ? [] : [prepared.module.name])];
      const bad = names.find((name) => !MODULE_NAME.test(name));
      if (bad !== undefined) throw new RolloutError({ code: 'SANDBOX', message: `bad module name to preload: ${JSON.stringify(bad)}` });
      for (const [what, name] of [['prepare', prepared.module?.prepare], ['host', prepared.module?.host]] as const) {
        if (name !== undefined && !/^[A-Za-z_]\w*$/.test(name)) {
          throw new RolloutError({ code: 'SANDBOX', message: `bad function name to ${what}: ${JSON.stringify(name)}` });
        }
      }
      digest = createHash('sha256').update(JSON.stringify(prepared)).digest('hex');
      // (a caller that passes the same object each time, as the code runner does, hashes its source once)
      this.digests.set(prepared, digest);
    }
    return this.serverOf(`bare:${hostPath}${digest === undefined ? '' : `:${digest}`}`, () => new KernelForkServer(hostPath, true, prepared));
  }

  /** The server of `key`, started (again, if it ended) by `start`. */
  private serverOf(key: string, start: () => KernelForkServer): KernelForkServer {
    let server = this.servers.get(key);
    if (server === undefined || !server.alive()) {
      server = start();
      this.servers.set(key, server);
    }
    return server;
  }

  /** The servers running now (tests and benches look at them). */
  running(): KernelForkServer[] {
    return [...this.servers.values()].filter((server) => server.alive());
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.servers.values()].map((server) => server.close()));
    this.servers.clear();
  }
}
