import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import type { Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { RolloutError } from '../errors.ts';
import { MODULE_NAME, type Sandbox, type SandboxProcess } from '../sandbox/types.ts';
import { endSandboxForChannel } from './channel-limit.ts';

/** The kernel server that ships in core (packages/core/python). */
export const KERNEL_SOURCE_PATH = fileURLToPath(new URL('../../python/rollserve_kernel.py', import.meta.url));

export interface PythonKernelOptions {
  /** The interpreter inside the sandbox. @default 'python3' */
  python?: string;
  /** Time limit of a cell when the call gives none. @default 120_000 */
  defaultTimeoutMs?: number;
  /** Output kept per stream (head and tail). @default 30_000 */
  maxOutputChars?: number;
  /**
   * The longest message the service reads from the kernel's socket, bytes (the kernel halves a
   * reply's texts until it fits); the socket may carry at most twice this between two cells. More
   * (cell code writing to the socket itself) ends the sandbox with RESOURCE_LIMIT.
   * @default 64 × maxOutputChars, within 1 MiB and 32 MiB (2 MiB for the default 30,000 characters)
   */
  maxMessageBytes?: number;
  /** How long to wait for the kernel to listen. @default 20_000 */
  startTimeoutMs?: number;
  /** Extra environment variables of the kernel. */
  env?: Record<string, string>;
  /**
   * 'auto': IPython's InteractiveShell when the sandbox's Python can import it, plain exec
   * otherwise; 'plain': plain exec always.
   * @default 'auto'
   */
  shell?: 'auto' | 'plain';
  /**
   * Modules the kernel finds imported before its first cell (a prelude's `import numpy` is then a
   * lookup). Where kernels are forked (bwrap on the host's root) they come from a fork server that
   * imported them once, one server per distinct list: a kernel pays nothing for them
   * (math_with_code's kernel, numpy and scipy in its prelude: ≈ 200 ms of CPU to start, ≈ 30
   * preloaded; `pnpm bench kernel`). A spawned kernel imports them as it starts. A module the
   * interpreter lacks is left out. For modules whose import reads nothing of the sandbox and writes
   * nothing: a forked kernel's were imported on the host, in the server's environment (BASE_ENV);
   * a kernel whose environment sets what numerical libraries read as they load (IMPORT_TIME_VARS:
   * OPENBLAS_NUM_THREADS, ...) imports them itself. numpy's global generator is reseeded in every fork.
   * @example ['numpy', 'scipy']
   */
  preload?: readonly string[];
}

export interface PythonError {
  ename: string;
  evalue: string;
  traceback: string;
}

export interface PythonResult {
  status: 'ok' | 'error' | 'timeout';
  stdout: string;
  stderr: string;
  /** repr() of the cell's final expression, when it has one and it is not None. */
  result: string | null;
  error: PythonError | null;
  /** Set when the kernel had to be restarted (its state is lost). */
  notice?: string;
}

/** Lines the socket may carry between two cells: the reply, a late one of an interrupted cell, slack. */
const MAX_LINES_PER_CELL = 16;
/** What the kernel's own stdout and stderr pipes may carry from one cell to the next (warnings), bytes: a cell's output goes to files. */
const MAX_PIPE_BYTES = 8 * 1024 * 1024;

interface Reply {
  id: number;
  status: 'ok' | 'error';
  stdout: string;
  stderr: string;
  result: string | null;
  error: PythonError | null;
}

/**
 * One persistent Python process per session inside the sandbox, speaking newline-delimited JSON
 * on a Unix socket in the sandbox's socket directory. A time limit sends an interrupt
 * (KeyboardInterrupt in the cell; the namespace survives); a kernel that does not answer is
 * restarted and says so.
 */
export class PythonKernel {
  private process: SandboxProcess | undefined;
  private socket: Socket | undefined;
  private seq = 0;
  /** The socket's current line, unfinished, and what the socket and pipes carried since the last cell began. */
  private line: Buffer[] = [];
  private lineBytes = 0;
  private received = 0;
  private lines = 0;
  private piped = 0;
  /** Set when the kernel flooded a channel: the sandbox is ended and every later call fails. */
  private limit: string | undefined;
  private readonly maxMessageBytes: number;
  private readonly waiting = new Map<number, (reply: Reply | undefined) => void>();
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  /** 'ipython' or 'plain', as the kernel reported. */
  mode = '';

  private constructor(
    private readonly sandbox: Sandbox,
    private readonly options: PythonKernelOptions,
  ) {
    const fit = Math.min(32 * 1024 * 1024, Math.max(1024 * 1024, 64 * (options.maxOutputChars ?? 30_000)));
    this.maxMessageBytes = Math.max(64 * 1024, options.maxMessageBytes ?? fit);
    const bad = options.preload?.find((name) => !MODULE_NAME.test(name));
    if (bad !== undefined) throw new RolloutError({ code: 'BAD_REQUEST', message: `not a module name to preload: ${JSON.stringify(bad)}` });
  }

  /** Why the kernel's sandbox was ended for flooding a channel, if it was. */
  limitExceeded(): string | undefined {
    return this.limit;
  }

  static async start(sandbox: Sandbox, options: PythonKernelOptions = {}): Promise<PythonKernel> {
    const kernel = new PythonKernel(sandbox, options);
    await kernel.spawn();
    return kernel;
  }

  private async spawn(): Promise<void> {
    const name = `py-${randomBytes(6).toString('hex')}`;
    const dir = this.sandbox.socketDir;
    const env = {
      PYTHONUNBUFFERED: '1',
      PYTHONDONTWRITEBYTECODE: '1',
      ...(this.options.shell === 'plain' ? { ROLLSERVE_PYTHON_SHELL: 'plain' } : {}),
      ...this.options.env,
    };
    const python = this.options.python ?? 'python3';
    const startTimeoutMs = this.options.startTimeoutMs ?? 20_000;
    // A fork of an interpreter that imported the kernel and IPython already, where the sandbox
    // has one (bwrap: a few ms instead of ≈ 400 ms of CPU); a new interpreter otherwise, or when
    // the fork fails (its server ended, say), which the spawned kernel reports if it fails too.
    const preload = this.options.preload ?? [];
    const forking = this.sandbox.forkKernel?.({
      python,
      socketName: `${name}.sock`,
      env,
      plain: env.ROLLSERVE_PYTHON_SHELL === 'plain',
      ...(preload.length === 0 ? {} : { preload }),
      timeoutMs: startTimeoutMs,
    });
    const forked = forking === undefined ? undefined : await forking.catch(() => undefined);
    if (forked !== undefined) return this.attach(forked.process, forked.mode, name);
    const source = this.sandbox.stageFile(`${name}.py`, readFileSync(KERNEL_SOURCE_PATH));
    // (the kernel takes the variable out of its environment before the first cell)
    const proc = this.sandbox.spawn([python, '-s', source, `${dir.sandbox}/${name}.sock`], {
      env: preload.length === 0 ? env : { ...env, ROLLSERVE_PYTHON_PRELOAD: preload.join(',') },
    });
    this.process = proc;
    // The pipes are channels too (the kernel's own stdout and stderr, which cell code can reach):
    // what they carry is kept bounded, and past MAX_PIPE_BYTES the sandbox is ended.
    let stderr = '';
    proc.stderr.on('data', (chunk: Buffer) => {
      if (stderr.length < 4096) stderr += chunk.toString('utf8', 0, 4096);
      this.countPiped(proc, chunk.length);
    });
    let onStdout: ((chunk: Buffer) => void) | undefined;
    const ready = await new Promise<string>((resolve, reject) => {
      let out = '';
      const timer = setTimeout(() => reject(new Error('timed out')), this.options.startTimeoutMs ?? 20_000);
      onStdout = (chunk: Buffer) => {
        out = (out + chunk.toString('latin1')).slice(-4096);
        const match = /READY (\w+)\n/.exec(out);
        if (match !== null) {
          clearTimeout(timer);
          resolve(match[1]!);
        }
      };
      proc.stdout.on('data', onStdout);
      void proc.exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`exited with ${code}`));
      });
    }).catch((error: Error) => {
      proc.kill();
      throw new RolloutError({ code: 'SANDBOX', message: `python kernel did not start (${error.message}): ${stderr.trim()}` });
    });
    proc.stdout.off('data', onStdout!);
    await this.attach(proc, ready, name);
  }

  /** Connects to the socket of a kernel that listens (`mode` as it reported). */
  private async attach(proc: SandboxProcess, mode: string, name: string): Promise<void> {
    this.process = proc;
    this.mode = mode;
    proc.stdout.on('data', (chunk: Buffer) => this.countPiped(proc, chunk.length));
    const socket = await this.sandbox.connect(`${name}.sock`).catch((error: Error) => {
      proc.kill();
      throw new RolloutError({ code: 'SANDBOX', message: `python kernel socket: ${error.message}` });
    });
    socket.setNoDelay?.(true);
    this.socket = socket;
    this.line = [];
    this.lineBytes = 0;
    this.received = 0;
    this.lines = 0;
    socket.on('data', (chunk: Buffer) => {
      if (this.socket === socket) this.receive(chunk);
    });
    const dead = (): void => {
      if (this.socket !== socket) return;
      this.socket = undefined;
      for (const resolve of this.waiting.values()) resolve(undefined);
      this.waiting.clear();
    };
    socket.on('close', dead);
    socket.on('error', dead);
    void proc.exited.then(() => socket.destroy());
  }

  /** Runs one cell; calls are queued so a kernel runs one cell at a time. */
  run(code: string, options: { timeoutMs?: number } = {}): Promise<PythonResult> {
    const result = this.queue.then(() => this.runNow(code, options.timeoutMs ?? this.options.defaultTimeoutMs ?? 120_000));
    this.queue = result.catch(() => undefined);
    return result;
  }

  private send(message: object): void {
    this.socket?.write(`${JSON.stringify(message)}\n`);
  }

  /**
   * Reads the socket as the exec agent's channel is read: in bounded time and memory. A line is at
   * most maxMessageBytes (an unfinished one counts as it grows), and between two cells the socket
   * carries at most two of them and MAX_LINES_PER_CELL lines; anything more was written by cell
   * code, not the kernel, and ends the sandbox (RESOURCE_LIMIT) before more is read.
   */
  private receive(chunk: Buffer): void {
    this.received += chunk.length;
    if (this.received > 2 * this.maxMessageBytes + 4096) {
      return this.flooded(`more than ${2 * this.maxMessageBytes} bytes in one cell`);
    }
    let from = 0;
    for (let newline = chunk.indexOf(10); newline >= 0; newline = chunk.indexOf(10, from)) {
      if (this.lineBytes + newline - from > this.maxMessageBytes) return this.flooded(`a message longer than ${this.maxMessageBytes} bytes`);
      if (++this.lines > MAX_LINES_PER_CELL) return this.flooded(`more than ${MAX_LINES_PER_CELL} messages in one cell`);
      const part = chunk.subarray(from, newline);
      const line = this.lineBytes === 0 ? part : Buffer.concat([...this.line, part]);
      this.line = [];
      this.lineBytes = 0;
      from = newline + 1;
      this.onLine(line);
      if (this.limit !== undefined) return;
    }
    if (from < chunk.length) {
      if (this.lineBytes + chunk.length - from > this.maxMessageBytes) return this.flooded(`a message longer than ${this.maxMessageBytes} bytes`);
      this.line.push(chunk.subarray(from));
      this.lineBytes += chunk.length - from;
    }
  }

  private onLine(line: Buffer): void {
    if (line.length === 0 || line[0] !== 0x7b) return; // not a reply
    let reply: Reply;
    try {
      reply = JSON.parse(line.toString('utf8')) as Reply;
    } catch {
      return; // not ours
    }
    if (!isReply(reply)) return;
    this.waiting.get(reply.id)?.(reply);
    this.waiting.delete(reply.id);
  }

  private countPiped(proc: SandboxProcess, bytes: number): void {
    if (this.process !== proc) return;
    this.piped += bytes;
    if (this.piped > MAX_PIPE_BYTES) this.flooded(`more than ${MAX_PIPE_BYTES} bytes on the kernel's own stdout and stderr`);
  }

  /** A channel carried more than its bound: the kernel is killed and its sandbox ended. */
  private flooded(detail: string): void {
    if (this.limit !== undefined) return;
    this.limit = `the Python kernel's channel to the service was flooded (${detail})`;
    this.stop();
    endSandboxForChannel(this.sandbox, this.limit);
  }

  private limitError(): RolloutError {
    return new RolloutError({ code: 'RESOURCE_LIMIT', message: `the sandbox was ended: ${this.limit}` });
  }

  private limitResult(): PythonResult {
    return {
      status: 'error',
      stdout: '',
      stderr: '',
      result: null,
      error: { ename: 'ResourceLimit', evalue: this.limit!, traceback: `ResourceLimit: ${this.limit}` },
      notice: 'The cell wrote more to the kernel\'s channel than it may; the sandbox was ended.',
    };
  }

  private async runNow(code: string, timeoutMs: number): Promise<PythonResult> {
    if (this.limit !== undefined) throw this.limitError();
    if (this.closed) throw new RolloutError({ code: 'SANDBOX', message: 'python kernel is closed' });
    let notice: string | undefined;
    if (this.socket === undefined) {
      await this.restart();
      notice = 'The Python kernel had died and was restarted; earlier variables are gone.';
    }
    const id = ++this.seq;
    const reply = new Promise<Reply | undefined>((resolve) => this.waiting.set(id, resolve));
    this.received = 0;
    this.lines = 0;
    this.piped = 0;
    this.send({ id, code, max_output: this.options.maxOutputChars ?? 30_000, max_message: this.maxMessageBytes });
    let timer: NodeJS.Timeout | undefined;
    const first = await Promise.race([
      reply,
      new Promise<'timeout'>((resolve) => {
        timer = setTimeout(() => resolve('timeout'), timeoutMs);
      }),
    ]);
    clearTimeout(timer);
    if (first !== 'timeout') {
      if (first === undefined) {
        if (this.limit !== undefined) return this.limitResult();
        await this.restart().catch(() => undefined);
        return {
          status: 'error',
          stdout: '',
          stderr: '',
          result: null,
          error: { ename: 'KernelDied', evalue: 'the Python process ended', traceback: '' },
          notice: 'The Python kernel died while running this cell and was restarted; earlier variables are gone.',
        };
      }
      // the cell may have forged its own reply and flooded on: the flood is what counts
      if (this.limit !== undefined) return this.limitResult();
      return toResult(first, notice);
    }
    const timeoutNotice = `Cell timed out after ${timeoutMs / 1000} seconds and was interrupted (KeyboardInterrupt); variables are kept.`;
    for (let attempt = 0; attempt < 3; attempt++) {
      this.send({ id: 0, interrupt: true });
      const late = await Promise.race([reply, new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), 500))]);
      if (late !== 'timeout' && late !== undefined) {
        return { ...toResult(late, notice), status: 'timeout', notice: timeoutNotice };
      }
      if (late === undefined) break;
    }
    this.waiting.delete(id);
    if (this.limit !== undefined) return this.limitResult();
    await this.restart().catch(() => undefined);
    return {
      status: 'timeout',
      stdout: '',
      stderr: '',
      result: null,
      error: null,
      notice: `Cell timed out after ${timeoutMs / 1000} seconds and did not stop on KeyboardInterrupt; the kernel was restarted and earlier variables are gone.`,
    };
  }

  private async restart(): Promise<void> {
    this.stop();
    await this.spawn();
  }

  private stop(): void {
    const socket = this.socket;
    this.socket = undefined;
    socket?.destroy();
    this.process?.kill();
    this.process = undefined;
    for (const resolve of this.waiting.values()) resolve(undefined);
    this.waiting.clear();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const proc = this.process;
    this.stop();
    if (proc !== undefined) await Promise.race([proc.exited, new Promise((resolve) => setTimeout(resolve, 1000))]);
  }
}

const isText = (value: unknown): value is string => typeof value === 'string';

/** A reply as the kernel writes it (cell code can write lines of its own to the socket). */
function isReply(value: unknown): value is Reply {
  const reply = value as Partial<Reply> | null;
  if (typeof reply !== 'object' || reply === null || typeof reply.id !== 'number') return false;
  if ((reply.status !== 'ok' && reply.status !== 'error') || !isText(reply.stdout) || !isText(reply.stderr)) return false;
  if (reply.result !== null && !isText(reply.result)) return false;
  const error = reply.error as Partial<PythonError> | null | undefined;
  return error === null || (typeof error === 'object' && isText(error.ename) && isText(error.evalue) && isText(error.traceback));
}

function toResult(reply: Reply, notice: string | undefined): PythonResult {
  return {
    status: reply.status,
    stdout: reply.stdout,
    stderr: reply.stderr,
    result: reply.result,
    error: reply.error,
    ...(notice === undefined ? {} : { notice }),
  };
}
