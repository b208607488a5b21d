export * from './types.ts';
export { rolloutIdsOf } from './common.ts';
export { importJournal, readJournal, type JournalContents, type JournalImport, type JournalRecord } from './import-journal.ts';
export { openStore } from './open.ts';
export { PostgresStore } from './postgres.ts';
export { SqliteStore } from './sqlite.ts';
