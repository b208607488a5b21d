import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { constants as osConstants } from 'node:os';

/** Quotes a string for POSIX sh. */
export function shQuote(value: string): string {
  return `'${value.replaceAll("'", `'\\''`)}'`;
}

export interface ProcInfo {
  pid: number;
  /** `R`, `S`, ..., `Z` (a zombie: ended, not yet reaped), `X`. */
  state: string;
  ppid: number;
  pgrp: number;
  session: number;
  /** Clock ticks after boot: with the pid, what tells a process from a later one given its pid. */
  starttime: string;
}

/** A process's /proc/<pid>/stat (`self`: this process's), or undefined when it is gone. */
export function readStat(pid: number | 'self'): ProcInfo | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    // the fields after the command's name, which may hold spaces and parentheses
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return {
      pid: pid === 'self' ? process.pid : pid,
      state: fields[0]!,
      ppid: Number(fields[1]),
      pgrp: Number(fields[2]),
      session: Number(fields[3]),
      starttime: fields[19]!,
    };
  } catch {
    return undefined;
  }
}

function listPids(): number[] {
  const pids: number[] = [];
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (Number.isInteger(pid) && pid > 0) pids.push(pid);
  }
  return pids;
}

/** The pid namespace link of a process (`pid:[4026532256]`), or undefined when it is gone. */
export function pidNamespaceOf(pid: number): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/ns/pid`);
  } catch {
    return undefined;
  }
}

export interface KillTreeOptions {
  /**
   * A `KEY=value` string in the environment of every process of the tree. It finds processes
   * that left the process group and the session (setsid, double fork) but kept the environment.
   */
  envTag?: string;
  /** Only processes in this pid namespace are matched by `envTag`. */
  pidNamespace?: string;
  /**
   * The processes `envTag` may be found in (the sandbox's cgroup), read again each round; where
   * undefined or answering undefined, every process of the host is looked at: a sweep then costs
   * a read per process of the host, not of the sandbox. (With a leader, its process group and
   * session are looked for among every process of the host.)
   */
  candidates?: () => number[] | undefined;
}

/**
 * SIGKILLs the process group and session led by `leader` and, with `envTag`, every process that
 * carries the tag: what a time limit or a close must end. Rounds repeat because a fork bomb forks
 * while it is being killed.
 */
export function killTree(leader: number | undefined, options: KillTreeOptions = {}): void {
  if (leader !== undefined) {
    try {
      process.kill(-leader, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  const tag = options.envTag === undefined ? undefined : Buffer.from(`${options.envTag}\0`);
  const innerTag = tag === undefined ? undefined : Buffer.concat([Buffer.from('\0'), tag]);
  for (let round = 0; round < 4; round++) {
    let found = 0;
    for (const pid of (leader === undefined ? options.candidates?.() : undefined) ?? listPids()) {
      if (pid === process.pid) continue;
      // (a process's stat is read only to match a leader: with a tag alone, a scan of a machine
      // running many sandboxes spent most of its time opening stat files it did not need)
      let hit = false;
      if (leader !== undefined) {
        const info = readStat(pid);
        if (info === undefined) continue;
        hit = info.pgrp === leader || info.session === leader;
      }
      if (!hit && tag !== undefined && (options.pidNamespace === undefined || pidNamespaceOf(pid) === options.pidNamespace)) {
        try {
          const environ = readFileSync(`/proc/${pid}/environ`);
          hit = environ.indexOf(tag) === 0 || environ.indexOf(innerTag!) >= 0;
        } catch {
          hit = false;
        }
      }
      if (!hit) continue;
      found++;
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // raced with its exit
      }
    }
    if (found === 0) return;
  }
}

/** Direct children of a process (from /proc). */
export function childrenOf(pid: number): number[] {
  const out: number[] = [];
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tasks) {
    try {
      for (const child of readFileSync(`/proc/${pid}/task/${tid}/children`, 'latin1').trim().split(/\s+/)) {
        if (child !== '') out.push(Number(child));
      }
    } catch {
      // gone
    }
  }
  return out;
}

/**
 * SIGKILLs every descendant of `pid` but not `pid` itself. Used for processes that entered a
 * sandbox: the entering process (nsenter, outside the sandbox's pid namespace) must outlive its
 * child and reap it, or the zombie goes to the host's init, and the sandbox's pid namespace cannot
 * finish dying until that init gets round to reaping it (seconds, in some containers).
 */
export function killDescendants(pid: number): void {
  for (let round = 0; round < 3; round++) {
    const seen: number[] = [];
    const stack = childrenOf(pid);
    while (stack.length > 0) {
      const next = stack.pop()!;
      seen.push(next);
      stack.push(...childrenOf(next));
    }
    if (seen.length === 0) return;
    for (const victim of seen) {
      try {
        process.kill(victim, 'SIGKILL');
      } catch {
        // gone
      }
    }
  }
}

/** A bounded byte collector: keeps the head and the tail, counts what it dropped. */
export class OutputBuffer {
  private head: Buffer[] = [];
  private headBytes = 0;
  private tail: Buffer[] = [];
  private tailBytes = 0;
  dropped = 0;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    const half = Math.floor(this.limit / 2);
    if (this.headBytes < half) {
      const take = Math.min(half - this.headBytes, chunk.length);
      this.head.push(chunk.subarray(0, take));
      this.headBytes += take;
      chunk = chunk.subarray(take);
      if (chunk.length === 0) return;
    }
    this.tail.push(chunk);
    this.tailBytes += chunk.length;
    const tailLimit = this.limit - half;
    while (this.tailBytes > tailLimit) {
      const first = this.tail[0]!;
      const excess = this.tailBytes - tailLimit;
      if (first.length <= excess) {
        this.tail.shift();
        this.tailBytes -= first.length;
        this.dropped += first.length;
      } else {
        this.tail[0] = first.subarray(excess);
        this.tailBytes -= excess;
        this.dropped += excess;
      }
    }
  }

  toBuffer(): Buffer {
    if (this.dropped === 0) return Buffer.concat([...this.head, ...this.tail]);
    const notice = Buffer.from(`\n[... ${this.dropped} bytes of output truncated ...]\n`);
    return Buffer.concat([...this.head, notice, ...this.tail]);
  }
}

export interface RunOptions {
  env: Record<string, string>;
  cwd?: string;
  stdin?: string | Buffer;
  timeoutMs: number;
  maxOutputBytes: number;
  /** See KillTreeOptions. */
  kill?: KillTreeOptions;
  /** Called with the child as soon as it is spawned (the sandbox tracks it for close). */
  onSpawn?(child: ChildProcess): void;
}

export interface RunResult {
  stdout: Buffer;
  stderr: Buffer;
  /** Exit code, or 128 + signal number. */
  code: number;
  timedOut: boolean;
  spawnError?: Error;
}

const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGSEGV: 11, SIGPIPE: 13, SIGTERM: 15, SIGXCPU: 24, SIGXFSZ: 25 };

export function exitCode(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  return 128 + (signal === null ? 0 : (SIGNALS[signal] ?? 0));
}

/**
 * Runs argv in a new session and collects its output. When the leader exits, output still held
 * open by background processes is waited for only briefly: a command may leave a server running.
 */
export function runProcess(argv: string[], options: RunOptions): Promise<RunResult> {
  return new Promise((resolve) => {
    const stdout = new OutputBuffer(options.maxOutputBytes);
    const stderr = new OutputBuffer(options.maxOutputBytes);
    let timedOut = false;
    let settled = false;
    let exit: number | undefined;
    let closeTimer: NodeJS.Timeout | undefined;
    const child = spawn(argv[0]!, argv.slice(1), {
      env: options.env,
      cwd: options.cwd,
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    options.onSpawn?.(child);
    const finish = (spawnError?: Error): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearTimeout(closeTimer);
      child.stdout?.destroy();
      child.stderr?.destroy();
      resolve({
        stdout: stdout.toBuffer(),
        stderr: stderr.toBuffer(),
        code: exit ?? 125,
        timedOut,
        ...(spawnError === undefined ? {} : { spawnError }),
      });
    };
    const timer = setTimeout(() => {
      timedOut = true;
      if (child.pid !== undefined) killTree(child.pid, options.kill);
      // the pipes may be held by processes outside the tree we could find; do not wait forever
      closeTimer = setTimeout(() => finish(), 200);
    }, options.timeoutMs);
    child.stdout!.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr!.on('data', (chunk: Buffer) => stderr.push(chunk));
    child.on('error', (error) => finish(error));
    child.on('exit', (code, signal) => {
      exit = exitCode(code, signal);
      if (!timedOut) {
        // reaped: its pid (and group id) may be reused from now on, so never signal it again
        clearTimeout(timer);
        closeTimer = setTimeout(() => finish(), 50);
      }
    });
    child.on('close', () => finish());
    child.stdin!.on('error', () => {
      // the command did not read its stdin
    });
    if (options.stdin !== undefined) child.stdin!.end(options.stdin);
    else child.stdin!.end();
  });
}

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(
  Object.entries(osConstants.signals).map(([name, number]) => [number as number, name as NodeJS.Signals]),
);

/** A signal's name (`SIGKILL` for 9), undefined for a number the platform has no name for. */
export function signalName(signal: number): NodeJS.Signals | undefined {
  return SIGNAL_NAMES.get(signal);
}
