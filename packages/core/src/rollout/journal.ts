import fs, { createReadStream, existsSync } from 'node:fs';
import { mkdir, open, type FileHandle } from 'node:fs/promises';
import { dirname } from 'node:path';
import { createInterface } from 'node:readline';
import { RolloutError } from '../errors.ts';
import type { RolloutResult, RolloutTask } from './types.ts';

const closedError = () => new RolloutError({ code: 'UNAVAILABLE', message: 'journal is closed', retryable: true });

/** A line of the journal. */
export type JournalRecord =
  | { type: 'task'; taskId: string; task: RolloutTask; rolloutIds: string[]; at: string }
  | { type: 'result'; result: RolloutResult };

export interface JournalContents {
  tasks: Map<string, Extract<JournalRecord, { type: 'task' }>>;
  results: Map<string, RolloutResult>;
  /** Lines that could not be read (a write cut short by a crash); skipped. */
  skippedLines: number;
}

/**
 * Append-only JSONL journal of accepted tasks and finished results. A task is written when it is
 * accepted and a result before anyone is told of it, so after a restart every known id either has
 * its stored result or runs again: nothing lost, nothing run twice to completion.
 *
 * Writes are group commits: records appended while a write is under way go out together in the
 * next one (one `write`, then one `fdatasync` when `fsync` is on), and each `append` resolves once
 * its own records are written. Without `fsync`, a written record survives the process dying
 * (SIGKILL, OOM) but not the machine; with it, it survives both. Without `fsync` the write is
 * synchronous (into the page cache, microseconds), grouping what was appended in the same tick: a
 * thread-pool round trip cost more than the write, and on a busy machine far more.
 */
export class Journal {
  #file: FileHandle | undefined;
  /** Text waiting for the next write, and who waits for it. */
  #pending: string[] = [];
  #waiters: Array<{ resolve: () => void; reject: (error: unknown) => void }> = [];
  #writing: Promise<void> | undefined;
  /** A failed write may have left a partial line: the next write starts on a fresh line. */
  #mayBeCut = false;
  #closed = false;

  private constructor(
    readonly path: string,
    private readonly fsync: boolean,
  ) {}

  /** Opens (creating) the journal and reads what it holds. */
  static async open(path: string, options: { fsync?: boolean } = {}): Promise<{ journal: Journal; contents: JournalContents }> {
    await mkdir(dirname(path), { recursive: true });
    const contents = await Journal.read(path);
    const journal = new Journal(path, options.fsync ?? false);
    journal.#file = await open(path, 'a+');
    // A crash mid-write leaves a line without its newline: end it, so the next record stands alone.
    const { size } = await journal.#file.stat();
    if (size > 0) {
      const last = Buffer.alloc(1);
      await journal.#file.read(last, 0, 1, size - 1);
      if (last[0] !== 0x0a) await journal.#file.appendFile('\n');
    }
    return { journal, contents };
  }

  static async read(path: string): Promise<JournalContents> {
    const contents: JournalContents = { tasks: new Map(), results: new Map(), skippedLines: 0 };
    if (!existsSync(path)) return contents;
    const lines = createInterface({ input: createReadStream(path, 'utf8'), crlfDelay: Infinity });
    for await (const line of lines) {
      if (line.trim() === '') continue;
      let record: JournalRecord;
      try {
        record = JSON.parse(line) as JournalRecord;
      } catch {
        contents.skippedLines++;
        continue;
      }
      if (record.type === 'task') contents.tasks.set(record.taskId, record);
      else if (record.type === 'result') contents.results.set(record.result.id, record.result);
    }
    return contents;
  }

  /**
   * Appends records (one, or a batch written in one go); resolves once they are written (and
   * synced, when asked). Rejects, writing none of them, when the journal is closed.
   */
  append(records: JournalRecord | readonly JournalRecord[]): Promise<void> {
    if (this.#closed || !this.#file) return Promise.reject(closedError());
    const list: readonly JournalRecord[] = Array.isArray(records) ? records : [records as JournalRecord];
    if (list.length === 0) return Promise.resolve();
    let text = '';
    for (const record of list) text += `${JSON.stringify(record)}\n`;
    return new Promise<void>((resolve, reject) => {
      this.#pending.push(text);
      this.#waiters.push({ resolve, reject });
      this.#writing ??= this.#drain();
    });
  }

  async #drain(): Promise<void> {
    if (!this.fsync) await undefined; // what else is appended in this tick joins the write
    while (this.#pending.length > 0) {
      const text = (this.#mayBeCut ? '\n' : '') + this.#pending.join('');
      const waiters = this.#waiters;
      this.#pending = [];
      this.#waiters = [];
      try {
        if (!this.#file) throw closedError();
        const buffer = Buffer.from(text, 'utf8');
        if (this.fsync) {
          await this.#writeAll(this.#file, buffer);
          await this.#file.datasync();
        } else {
          for (let offset = 0; offset < buffer.length; ) offset += fs.writeSync(this.#file.fd, buffer, offset, buffer.length - offset, null);
        }
        this.#mayBeCut = false;
        for (const waiter of waiters) waiter.resolve();
      } catch (error) {
        this.#mayBeCut = true;
        for (const waiter of waiters) waiter.reject(error);
      }
    }
    this.#writing = undefined;
  }

  /** One `write` for the whole buffer (appended: the file is open in 'a' mode); loops on a short write. */
  async #writeAll(file: FileHandle, buffer: Buffer): Promise<void> {
    let offset = 0;
    while (offset < buffer.length) {
      const { bytesWritten } = await file.write(buffer, offset, buffer.length - offset, null);
      offset += bytesWritten;
    }
  }

  /** Waits for what was appended, then closes; later appends reject. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#writing;
    await this.#file?.close();
    this.#file = undefined;
  }
}
