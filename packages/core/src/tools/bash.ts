import { randomBytes } from 'node:crypto';
import { RolloutError } from '../errors.ts';
import { signalName } from '../sandbox/process.ts';
import type { Sandbox, SandboxPty } from '../sandbox/types.ts';
import { endSandboxForChannel } from './channel-limit.ts';

export interface BashSessionOptions {
  /** Start directory. @default the sandbox's workdir */
  cwd?: string;
  /** Extra environment variables of the shell. */
  env?: Record<string, string>;
  /** Output kept per command (head and tail); the middle is replaced by a notice. @default 30_000 */
  maxOutputChars?: number;
  /** Time limit of a command when the call gives none. @default 120_000 */
  defaultTimeoutMs?: number;
  /** The shell. @default ['/bin/bash', '--noprofile', '--norc', '--noediting', '-i'] */
  shell?: string[];
  /** How long `start` waits for the shell to answer (a restart within a command waits 15 s). @default 15_000 */
  startTimeoutMs?: number;
  /**
   * What the terminal may carry from one command's start to the next's, characters (the output
   * kept is `maxOutputChars`; the rest is read and dropped). More ends the sandbox with
   * RESOURCE_LIMIT, as a full workspace does: a flood costs the service CPU for every byte.
   * @default 64 Mi: under a second of `yes` here, the event loop never held up for long
   */
  maxStreamChars?: number;
}

export interface BashResult {
  /** stdout and stderr as the terminal showed them, without ANSI codes. */
  output: string;
  /** The command's exit code; null when it timed out or the shell died. */
  exitCode: number | null;
  timedOut: boolean;
  truncated: boolean;
}

const ANSI = new RegExp(
  [
    '\\u001b\\[[0-?]*[ -/]*[@-~]', // CSI (colours, cursor, bracketed paste 200~/201~)
    '\\u001b\\][^\\u0007\\u001b]*(?:\\u0007|\\u001b\\\\)', // OSC (titles, hyperlinks)
    '\\u001b[PX^_][^\\u001b]*\\u001b\\\\', // DCS, SOS, PM, APC
    '\\u001b[@-Z\\\\-_]', // two-byte escapes
    '\\u001b[()][0-9A-Za-z]', // charset selection
  ].join('|'),
  'g',
);

/** Removes terminal control sequences and carriage returns before newlines. */
export function stripAnsi(text: string): string {
  return text.replace(ANSI, '').replace(/\r+\n/g, '\n');
}

/** Quotes `text` as a bash ANSI-C string: one line, no byte the terminal would act on. */
export function ansiCQuote(text: string): string {
  let out = "$'";
  for (const char of text) {
    const code = char.codePointAt(0)!;
    if (char === '\\') out += '\\\\';
    else if (char === "'") out += "\\'";
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, '0')}`;
    else out += char;
  }
  return `${out}'`;
}

const MARGIN = 256;
const DEFAULT_MAX_STREAM_CHARS = 64 * 1024 * 1024;

/** Collects a command's output up to the marker, keeping head and tail within the cap. */
class Collector {
  head = '';
  tail = '';
  dropped = 0;
  constructor(private readonly cap: number) {}

  push(data: string): void {
    this.tail += data;
  }

  /** The output up to `at` in the tail, within the cap, with a notice where the middle was cut. */
  output(at: number): string {
    let head = this.head;
    let rest = this.tail.slice(0, at);
    let dropped = this.dropped;
    if (dropped === 0 && head.length + rest.length <= this.cap) return head + rest;
    const half = Math.floor(this.cap / 2);
    if (head.length < half) {
      const take = half - head.length;
      head += rest.slice(0, take);
      rest = rest.slice(take);
    }
    const keep = this.cap - half;
    if (rest.length > keep) {
      dropped += rest.length - keep;
      rest = rest.slice(rest.length - keep);
    }
    this.dropped = dropped;
    return `${head}\n[... ${dropped} characters of output truncated ...]\n${rest}`;
  }

  /** Keeps memory bounded; call after searching for the marker. */
  compact(): void {
    if (this.tail.length <= this.cap + MARGIN) return;
    const half = Math.floor(this.cap / 2);
    if (this.head.length < half) {
      const take = half - this.head.length;
      this.head += this.tail.slice(0, take);
      this.tail = this.tail.slice(take);
    }
    const keep = this.cap - half + MARGIN;
    if (this.tail.length > keep) {
      this.dropped += this.tail.length - keep;
      this.tail = this.tail.slice(this.tail.length - keep);
    }
  }
}

/**
 * One persistent bash per session, on a PTY inside the sandbox. Each command is sent as one line,
 * `eval $'<command>'; printf '\n<marker><seq>__%d__\n' $?`, so its end and exit code are found in
 * the output stream itself (no screen polling) and a syntax error cannot desynchronise the shell.
 * The terminal runs with `-echo -icanon -onlcr`: no echo, no 4 KiB canonical line limit, no \r.
 */
export class BashSession {
  private pty: SandboxPty | undefined;
  private readonly nonce = randomBytes(6).toString('hex');
  private seq = 0;
  private buffer = '';
  private waiter: ((data: string) => void) | undefined;
  private queue: Promise<unknown> = Promise.resolve();
  private exited: { code: number; signal?: number } | undefined;
  private closed = false;
  private readonly maxOutputChars: number;
  private readonly defaultTimeoutMs: number;
  /** What the terminal carried since the current command began, and why the sandbox was ended if it carried too much. */
  private streamed = 0;
  private limit: string | undefined;

  private constructor(
    private readonly sandbox: Sandbox,
    private readonly options: BashSessionOptions,
  ) {
    this.maxOutputChars = options.maxOutputChars ?? 30_000;
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? 120_000;
  }

  static async start(sandbox: Sandbox, options: BashSessionOptions = {}): Promise<BashSession> {
    const session = new BashSession(sandbox, options);
    await session.spawn(options.startTimeoutMs);
    return session;
  }

  private marker(seq: number): string {
    return `__RS${this.nonce}_${seq}__`;
  }

  private markerCommand(seq: number): string {
    return `printf '\\n${this.marker(seq)}%d__\\n' $?`;
  }

  private async spawn(startTimeoutMs = 15_000): Promise<void> {
    this.exited = undefined;
    this.buffer = '';
    const pty = this.sandbox.spawnPty(this.options.shell ?? ['/bin/bash', '--noprofile', '--norc', '--noediting', '-i'], {
      ...(this.options.cwd === undefined ? {} : { cwd: this.options.cwd }),
      env: { PS1: '', PS2: '', PS0: '', PS4: '+ ', HISTFILE: '/dev/null', ...this.options.env },
      plain: true,
    });
    this.pty = pty;
    pty.onData((data) => {
      if (this.pty !== pty) return;
      this.streamed += data.length;
      if (this.streamed > (this.options.maxStreamChars ?? DEFAULT_MAX_STREAM_CHARS)) return this.flooded();
      if (this.waiter !== undefined) this.waiter(data);
      else {
        // Between commands only background jobs write; keep the tail, bounded, so a noisy one
        // cannot grow the service's memory (no command's marker can be in it: none is running).
        this.buffer += data;
        const keep = this.maxOutputChars + 8192;
        if (this.buffer.length > 2 * keep) this.buffer = this.buffer.slice(-keep);
      }
    });
    pty.onExit(({ exitCode, signal }) => {
      if (this.pty !== pty) return;
      this.exited = signal ? { code: exitCode, signal } : { code: exitCode };
      this.waiter?.('');
    });
    const seq = ++this.seq;
    // (a provider that started the terminal plain saves the shell a stty to run)
    pty.write(
      `${pty.plain === true ? '' : 'stty -echo -icanon -onlcr 2>/dev/null; '}PS1=''; PS2=''; PS0=''; unset PROMPT_COMMAND; set +o history 2>/dev/null; ${this.markerCommand(seq)}\n`,
    );
    const ready = await this.read(seq, startTimeoutMs, new Collector(4096));
    if (ready.kind !== 'marker') {
      this.kill();
      throw new RolloutError({ code: 'SANDBOX', message: `bash did not start in the sandbox: ${ready.output.slice(-500)}` });
    }
  }

  /**
   * Reads until the marker `seq` (or `alt`) appears, the deadline passes or the shell exits.
   * Output before the marker is collected; stale markers of earlier sequence numbers are dropped.
   */
  private read(
    seq: number,
    timeoutMs: number,
    collector: Collector,
    alt?: number,
  ): Promise<{ kind: 'marker' | 'timeout' | 'exit'; code: number; output: string; seq: number }> {
    const pattern = new RegExp(`\\n?__RS${this.nonce}_(\\d+)__(\\d+)__\\n`);
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const finish = (kind: 'marker' | 'timeout' | 'exit', code: number, at: number, rest: string, found: number): void => {
        clearTimeout(timer);
        this.waiter = undefined;
        this.buffer = rest;
        resolve({ kind, code, output: collector.output(at), seq: found });
      };
      const onData = (data: string): void => {
        collector.push(data);
        for (;;) {
          const match = pattern.exec(collector.tail);
          if (match === null) break;
          const found = Number(match[1]);
          if (found === seq || found === alt) {
            finish('marker', Number(match[2]), match.index, collector.tail.slice(match.index + match[0].length), found);
            return;
          }
          // a marker of an interrupted command: remove it from the output
          collector.tail = collector.tail.slice(0, match.index) + collector.tail.slice(match.index + match[0].length);
        }
        if (this.exited !== undefined) {
          finish('exit', this.exited.code, collector.tail.length, '', -1);
          return;
        }
        collector.compact();
      };
      this.waiter = onData;
      timer = setTimeout(() => finish('timeout', -1, collector.tail.length, '', -1), timeoutMs);
      const pending = this.buffer;
      this.buffer = '';
      onData(pending);
    });
  }

  /** Runs one command; calls are queued so a session runs one command at a time. */
  run(command: string, options: { timeoutMs?: number } = {}): Promise<BashResult> {
    const result = this.queue.then(() => this.runNow(command, options.timeoutMs ?? this.defaultTimeoutMs));
    this.queue = result.catch(() => undefined);
    return result;
  }

  /** Why the shell's sandbox was ended for flooding the terminal, if it was. */
  limitExceeded(): string | undefined {
    return this.limit;
  }

  /** The terminal carried more than its bound: the shell is killed and its sandbox ended. */
  private flooded(): void {
    if (this.limit !== undefined) return;
    this.limit = `the bash terminal carried more than ${this.options.maxStreamChars ?? DEFAULT_MAX_STREAM_CHARS} characters for one command`;
    this.kill();
    endSandboxForChannel(this.sandbox, this.limit);
    this.exited = { code: -1 };
    this.waiter?.('');
  }

  private async runNow(command: string, timeoutMs: number): Promise<BashResult> {
    if (this.limit !== undefined) throw new RolloutError({ code: 'RESOURCE_LIMIT', message: `the sandbox was ended: ${this.limit}` });
    if (this.closed) throw new RolloutError({ code: 'SANDBOX', message: 'bash session is closed' });
    let restarted = '';
    if (this.exited !== undefined || this.pty === undefined) {
      await this.spawn();
      restarted = '[The previous shell exited; this command ran in a new shell.]\n';
    }
    const pty = this.pty!;
    const seq = ++this.seq;
    const collector = new Collector(this.maxOutputChars);
    this.streamed = 0;
    pty.write(`eval ${ansiCQuote(command)}; ${this.markerCommand(seq)}\n`);
    const first = await this.read(seq, timeoutMs, collector);
    if (first.kind === 'marker') return this.result(restarted + first.output, first.code, false, collector);
    if (this.limit !== undefined) {
      return this.result(`${restarted}${first.output}\n[The command's output passed what the terminal may carry; the sandbox was ended (${this.limit}).]`, null, false, collector);
    }
    if (first.kind === 'exit') {
      const signal = this.exited?.signal;
      const how = signal ? `was killed by ${signalName(signal) ?? `signal ${signal}`}` : `exited with code ${first.code}`;
      const notice = `\n[The shell ${how}; the next command starts a new shell.]`;
      return this.result(restarted + first.output + notice, null, false, collector);
    }
    // time limit: Ctrl-C, then a fresh marker proves the shell is back at its prompt
    const notice = `\n[Command timed out after ${formatSeconds(timeoutMs)} and was interrupted (Ctrl-C); the shell is still usable.]`;
    const partial = first.output;
    const recovered = await this.interrupt(seq);
    if (this.limit !== undefined) {
      return this.result(`${restarted}${partial}\n[The command's output passed what the terminal may carry; the sandbox was ended (${this.limit}).]`, null, true, collector);
    }
    if (!recovered) {
      this.kill();
      await this.spawn().catch(() => undefined);
      return this.result(
        `${restarted}${partial}${notice.replace('the shell is still usable', 'the shell did not respond and was restarted (cwd and environment reset)')}`,
        null,
        true,
        collector,
      );
    }
    return this.result(restarted + partial + notice, null, true, collector);
  }

  /** Ctrl-C; escalates to SIGKILL of the shell's children when the command ignores SIGINT. */
  private async interrupt(seq: number): Promise<boolean> {
    const pty = this.pty!;
    for (let attempt = 0; attempt < 2; attempt++) {
      pty.write('\x03');
      await new Promise((resolve) => setTimeout(resolve, 30));
      const recovery = ++this.seq;
      pty.write(`${this.markerCommand(recovery)}\n`);
      const back = await this.read(recovery, attempt === 0 ? 1500 : 2000, new Collector(this.maxOutputChars), seq);
      if (back.kind === 'exit') return false;
      if (back.kind === 'marker') {
        if (back.seq === recovery) return true;
        // the original marker came first; the recovery marker follows at once
        const again = await this.read(recovery, 1000, new Collector(this.maxOutputChars));
        if (again.kind === 'marker') return true;
      }
      this.killShellChildren();
    }
    return false;
  }

  /** SIGKILLs the process groups of the shell's children (the foreground job that ignored ^C). */
  private killShellChildren(): void {
    this.pty?.killChildren();
  }

  private result(output: string, exitCode: number | null, timedOut: boolean, collector: Collector): BashResult {
    return { output: stripAnsi(output), exitCode, timedOut, truncated: collector.dropped > 0 };
  }

  private kill(): void {
    const pty = this.pty;
    this.pty = undefined;
    pty?.terminate();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.kill();
  }
}

function formatSeconds(ms: number): string {
  const s = ms / 1000;
  return `${Number.isInteger(s) ? s : s.toFixed(1)} seconds`;
}
