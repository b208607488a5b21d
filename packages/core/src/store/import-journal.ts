import { createReadStream, existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { RolloutError } from '../errors.ts';
import type { RolloutResult, RolloutTask } from '../protocol/rollout.ts';
import type { RolloutStore } from './types.ts';

/** A line of the JSONL journal rollserve kept before the store. */
export type JournalRecord =
  | { type: 'task'; taskId: string; task: RolloutTask; rolloutIds: string[]; at: string }
  | { type: 'result'; result: RolloutResult };

export interface JournalContents {
  tasks: Map<string, Extract<JournalRecord, { type: 'task' }>>;
  /** Each rollout's last result record (a group's credit rewrote earlier ones). */
  results: Map<string, RolloutResult>;
  /** Lines that could not be read (a write cut short by a crash); skipped. */
  skippedLines: number;
}

/** Reads an old journal whole, a line at a time. */
export async function readJournal(path: string): Promise<JournalContents> {
  const contents: JournalContents = { tasks: new Map(), results: new Map(), skippedLines: 0 };
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

export interface JournalImport {
  /** False when this journal had already been imported: nothing was written. */
  imported: boolean;
  /** Tasks added (ids the store already knew are kept as they are). */
  tasks: number;
  /** Results added (rollouts that already had one keep theirs). */
  results: number;
  /** Lines cut short by a crash, skipped. */
  skippedLines: number;
}

/**
 * Moves an old JSONL journal (rollserve before the store) into a store, once: its tasks, and for
 * each rollout its last result record (a group's credit rewrites an earlier one). Rollouts without
 * a result are queued, to run again. The import is recorded under the journal's absolute path in
 * the same transaction, so a second call with the same journal is a no-op.
 */
export async function importJournal(store: RolloutStore, journalPath: string): Promise<JournalImport> {
  if (!existsSync(journalPath)) throw new RolloutError({ code: 'NOT_FOUND', message: `no journal at ${journalPath}` });
  const source = `journal:${resolve(journalPath)}`;
  if (await store.hasImport(source)) return { imported: false, tasks: 0, results: 0, skippedLines: 0 };
  const contents = await readJournal(journalPath);
  const tasks = [...contents.tasks.values()].map((record) => ({ ...record.task, id: record.taskId }));
  const outcome = await store.recordImport(source, tasks, [...contents.results.values()]);
  return { ...outcome, skippedLines: outcome.imported ? contents.skippedLines : 0 };
}
