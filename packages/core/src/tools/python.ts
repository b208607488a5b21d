import { randomBytes } from 'node:crypto';
import { lstatSync, readFileSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { RolloutError } from '../errors.ts';
import type { Sandbox, SandboxProcess } from '../sandbox/types.ts';

/** The kernel server that ships in core (packages/core/python). */
export const KERNEL_SOURCE_PATH = fileURLToPath(new URL('../../python/rollserve_kernel.py', import.meta.url));

export interface PythonKernelOptions {
  /** The interpreter inside the sandbox. @default 'python3' */
  python?: string;
  /** Time limit of a cell when the call gives none. @default 120_000 */
  defaultTimeoutMs?: number;
  /** Output kept per stream (head and tail). @default 30_000 */
  maxOutputChars?: number;
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
  private input = '';
  private readonly waiting = new Map<number, (reply: Reply | undefined) => void>();
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  /** 'ipython' or 'plain', as the kernel reported. */
  mode = '';

  private constructor(
    private readonly sandbox: Sandbox,
    private readonly options: PythonKernelOptions,
  ) {}

  static async start(sandbox: Sandbox, options: PythonKernelOptions = {}): Promise<PythonKernel> {
    const kernel = new PythonKernel(sandbox, options);
    await kernel.spawn();
    return kernel;
  }

  private async spawn(): Promise<void> {
    const name = `py-${randomBytes(6).toString('hex')}`;
    const dir = this.sandbox.socketDir;
    const source = this.sandbox.stageFile(`${name}.py`, readFileSync(KERNEL_SOURCE_PATH));
    const socketHost = join(dir.host, `${name}.sock`);
    const proc = this.sandbox.spawn(
      [this.options.python ?? 'python3', source, `${dir.sandbox}/${name}.sock`],
      {
        env: {
          PYTHONUNBUFFERED: '1',
          PYTHONDONTWRITEBYTECODE: '1',
          ...(this.options.shell === 'plain' ? { ROLLSERVE_PYTHON_SHELL: 'plain' } : {}),
          ...this.options.env,
        },
      },
    );
    this.process = proc;
    let stderr = '';
    proc.stderr.on('data', (chunk: Buffer) => {
      if (stderr.length < 4096) stderr += chunk.toString('utf8');
    });
    const ready = await new Promise<string>((resolve, reject) => {
      let out = '';
      const timer = setTimeout(() => reject(new Error('timed out')), this.options.startTimeoutMs ?? 20_000);
      proc.stdout.on('data', (chunk: Buffer) => {
        out += chunk.toString('utf8');
        const match = /READY (\w+)\n/.exec(out);
        if (match !== null) {
          clearTimeout(timer);
          resolve(match[1]!);
        }
      });
      void proc.exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`exited with ${code}`));
      });
    }).catch((error: Error) => {
      proc.kill();
      throw new RolloutError({ code: 'SANDBOX', message: `python kernel did not start (${error.message}): ${stderr.trim()}` });
    });
    this.mode = ready;
    proc.stdout.resume();
    const stat = lstatSync(socketHost);
    if (!stat.isSocket()) {
      proc.kill();
      throw new RolloutError({ code: 'SANDBOX', message: 'python kernel socket was replaced' });
    }
    const socket = await new Promise<Socket>((resolve, reject) => {
      const s = connect(socketHost, () => resolve(s));
      s.once('error', reject);
    }).catch((error: Error) => {
      proc.kill();
      throw new RolloutError({ code: 'SANDBOX', message: `python kernel socket: ${error.message}` });
    });
    socket.setNoDelay?.(true);
    this.socket = socket;
    this.input = '';
    socket.on('data', (chunk: Buffer) => {
      if (this.socket !== socket) return;
      this.input += chunk.toString('utf8');
      let newline: number;
      while ((newline = this.input.indexOf('\n')) >= 0) {
        const line = this.input.slice(0, newline);
        this.input = this.input.slice(newline + 1);
        try {
          const reply = JSON.parse(line) as Reply;
          this.waiting.get(reply.id)?.(reply);
          this.waiting.delete(reply.id);
        } catch {
          // not ours
        }
      }
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

  private async runNow(code: string, timeoutMs: number): Promise<PythonResult> {
    if (this.closed) throw new RolloutError({ code: 'SANDBOX', message: 'python kernel is closed' });
    let notice: string | undefined;
    if (this.socket === undefined) {
      await this.restart();
      notice = 'The Python kernel had died and was restarted; earlier variables are gone.';
    }
    const id = ++this.seq;
    const reply = new Promise<Reply | undefined>((resolve) => this.waiting.set(id, resolve));
    this.send({ id, code, max_output: this.options.maxOutputChars ?? 30_000 });
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
