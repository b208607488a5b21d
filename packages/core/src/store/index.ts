export * from './types.ts';
export { rolloutIdsOf } from './common.ts';
export type { Connection, Dialect, Migration, StoreEngine } from './dialect.ts';
export { importJournal, readJournal, type JournalContents, type JournalImport, type JournalRecord } from './import-journal.ts';
export { openStore } from './open.ts';
export { SqlStore } from './store.ts';
