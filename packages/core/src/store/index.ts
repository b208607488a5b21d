export * from './types.ts';
export { rolloutIdsOf } from './common.ts';
export { importJournal, type JournalImport } from './import-journal.ts';
export { openStore } from './open.ts';
export { PostgresStore } from './postgres.ts';
export { SqliteStore } from './sqlite.ts';
