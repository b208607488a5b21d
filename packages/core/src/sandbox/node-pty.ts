import { closeSync, constants, openSync, writeSync } from 'node:fs';
import { ReadStream } from 'node:tty';
import * as pty from 'node-pty';
import type { SandboxPty } from './types.ts';

// node-pty behind the sandboxes' own small SandboxPty type: the only file that knows node-pty.

/** A terminal as a provider holds it: SandboxPty's reading and writing, and a SIGKILL for its process. */
export interface Terminal extends Pick<SandboxPty, 'pid' | 'write' | 'onData' | 'onExit'> {
  /** SIGKILLs the terminal's process (nothing if it has exited). */
  kill(): void;
}

/** Starts a host command line on a pseudo-terminal (node-pty), its writes made on the spot (see directPtyWriter). */
export function spawnTerminal(host: { argv: string[]; env: Record<string, string>; cwd?: string }, size: { cols: number; rows: number }): Terminal {
  const term = pty.spawn(host.argv[0]!, host.argv.slice(1), {
    name: host.env.TERM ?? 'dumb',
    cols: size.cols,
    rows: size.rows,
    cwd: host.cwd ?? '/',
    env: host.env,
  });
  const direct = directPtyWriter(term);
  if (direct) term.onExit(() => direct.close());
  return {
    pid: term.pid,
    write: direct ? direct.write : (data) => term.write(data),
    onData: (listener) => term.onData(listener),
    onExit: (listener) => term.onExit(listener),
    kill: () => {
      try {
        term.kill('SIGKILL');
      } catch {
        // raced with its exit
      }
    },
  };
}

/**
 * Writes to a terminal's master side with write(2) on the spot instead of node-pty's queue, which
 * sends every write through libuv's thread pool (fs.write): on the bash tool's hot path that
 * hand-off (a thread wake-up there and back per command) was the largest single cost of a call,
 * 17 % of a resources server's CPU under 16 sessions. The master is non-blocking, so a full
 * terminal (a program that stops reading) gives EAGAIN: the rest waits, in order, and is retried
 * every millisecond. The descriptor is read from node-pty's reading socket at every write, never
 * kept: once that socket is destroyed (the terminal closed) the number may belong to another file,
 * and what is left is dropped. Undefined when this node-pty does not have that socket (then its
 * own write is kept; node-pty is pinned).
 */
function directPtyWriter(term: pty.IPty): { write: (data: string | Buffer) => void; close: () => void } | undefined {
  return directWriter((term as unknown as { _socket?: SocketLike })._socket);
}

type SocketLike = { _handle?: { fd?: unknown } | null; destroyed?: boolean };

function directWriter(socket: SocketLike | undefined): { write: (data: string | Buffer) => void; close: () => void } | undefined {
  const fdOf = (): number => {
    const fd = socket?.destroyed ? -1 : socket?._handle?.fd;
    return typeof fd === 'number' ? fd : -1;
  };
  if (fdOf() < 0) return undefined;
  const pending: Buffer[] = [];
  let retry: NodeJS.Timeout | undefined;
  const close = (): void => {
    pending.length = 0;
    clearTimeout(retry);
    retry = undefined;
  };
  const flush = (): void => {
    retry = undefined;
    while (pending.length > 0) {
      const fd = fdOf();
      if (fd < 0) return close();
      const head = pending[0]!;
      let written: number;
      try {
        written = writeSync(fd, head);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'EAGAIN') {
          retry = setTimeout(flush, 1);
          return;
        }
        return close(); // EIO and the like: the other side is gone, nothing will read it
      }
      if (written < head.length) pending[0] = head.subarray(written);
      else pending.shift();
    }
  };
  return {
    write: (data) => {
      const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data);
      if (bytes.length === 0) return;
      pending.push(bytes);
      if (pending.length === 1 && retry === undefined) flush();
    },
    close,
  };
}

/** A terminal's master side, opened here, whose program another process starts (see `openMaster`). */
export interface TerminalMaster {
  /** The master's descriptor in this process (close-on-exec: no child of this process inherits it). */
  readonly fd: number;
  write(data: string | Buffer): void;
  onData(listener: (data: string) => void): void;
  /** Calls `listener` once the other side is closed everywhere (read gives EIO) or the master is closed. */
  onClosed(listener: () => void): void;
  close(): void;
}

/**
 * Opens a new pseudo-terminal's master (/dev/ptmx, close-on-exec as every descriptor Node opens;
 * its other side stays locked until the process that starts the program unlocks it), read as
 * node-pty reads its own and written on the spot (directWriter). For a program started by
 * another process (the kernel fork server), where node-pty would fork this one.
 */
export function openMaster(): TerminalMaster {
  const fd = openSync('/dev/ptmx', constants.O_RDWR | constants.O_NOCTTY);
  let stream: ReadStream;
  try {
    stream = new ReadStream(fd);
  } catch (error) {
    closeSync(fd);
    throw error;
  }
  stream.setEncoding('utf8');
  const writer = directWriter(stream as unknown as SocketLike);
  const closedListeners: Array<() => void> = [];
  let closed = false;
  const onClosed = (): void => {
    if (closed) return;
    closed = true;
    writer?.close();
    for (const listener of closedListeners.splice(0)) listener();
  };
  // EIO: every descriptor of the other side is closed (the program and all it started are gone)
  stream.on('error', () => stream.destroy());
  stream.on('close', onClosed);
  return {
    fd,
    write: (data) => {
      if (closed) return;
      if (writer !== undefined) writer.write(data);
      else stream.write(data);
    },
    onData: (listener) => {
      stream.on('data', listener);
    },
    onClosed: (listener) => {
      if (closed) listener();
      else closedListeners.push(listener);
    },
    close: () => {
      stream.destroy();
    },
  };
}
