import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { RolloutError } from '../errors.ts';
import { Journal } from '../rollout/journal.ts';
import type { RolloutStore } from './types.ts';

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
 * Moves an old JSONL journal (see Journal) into a store, once: its tasks, and for each rollout its
 * last result record (a group's credit rewrites an earlier one). Rollouts without a result are
 * queued, to run again. The import is recorded under the journal's absolute path in the same
 * transaction, so a second call with the same journal is a no-op.
 */
export async function importJournal(store: RolloutStore, journalPath: string): Promise<JournalImport> {
  if (!existsSync(journalPath)) throw new RolloutError({ code: 'NOT_FOUND', message: `no journal at ${journalPath}` });
  const source = `journal:${resolve(journalPath)}`;
  if (await store.hasImport(source)) return { imported: false, tasks: 0, results: 0, skippedLines: 0 };
  const contents = await Journal.read(journalPath);
  const tasks = [...contents.tasks.values()].map((record) => ({ ...record.task, id: record.taskId }));
  const outcome = await store.recordImport(source, tasks, [...contents.results.values()]);
  return { ...outcome, skippedLines: outcome.imported ? contents.skippedLines : 0 };
}
