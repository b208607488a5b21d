import type { StoreEngine } from '../../dialect.ts';

/** SQLite through better-sqlite3: one file, nothing to set up. */
export const sqliteEngine: StoreEngine = {
  name: 'sqlite',
  accepts: (url) => url.startsWith('sqlite:'),
  forms: ['sqlite:///path/to/file.db', 'sqlite::memory:'],
  async open(url) {
    const { parseSqliteUrl, SqliteDialect } = await import('./dialect.ts');
    const { path, synchronous } = parseSqliteUrl(url);
    return SqliteDialect.open(path, { synchronous });
  },
};
