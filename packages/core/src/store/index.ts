export * from './types.ts';
export { rolloutIdsOf } from './common.ts';
export type { Connection, Dialect, Migration } from './dialects/dialect.ts';
export { PostgresDialect } from './dialects/postgres.ts';
export { SqliteDialect } from './dialects/sqlite.ts';
export { importJournal, readJournal, type JournalContents, type JournalImport, type JournalRecord } from './import-journal.ts';
export { openStore } from './open.ts';
export { SqlStore } from './store.ts';
