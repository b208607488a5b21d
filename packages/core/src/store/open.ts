import { RolloutError } from '../errors.ts';
import { PostgresDialect } from './dialects/postgres.ts';
import { parseSqliteUrl, SqliteDialect } from './dialects/sqlite.ts';
import { SqlStore } from './store.ts';
import type { OpenStoreOptions, RolloutStore } from './types.ts';

/**
 * Opens a store by URL, applying its migrations:
 * `sqlite:///abs/path.db` (`?synchronous=full` to sync every commit), `sqlite::memory:`,
 * `postgres://user:password@host:port/db` or `postgresql://…` (libpq-style parameters such as
 * `?host=/run/postgresql` for a Unix socket).
 */
export async function openStore(url: string, options: OpenStoreOptions = {}): Promise<RolloutStore> {
  if (url.startsWith('sqlite:')) {
    const { path, synchronous } = parseSqliteUrl(url);
    return SqlStore.open(await SqliteDialect.open(path, { synchronous }), options);
  }
  if (url.startsWith('postgres://') || url.startsWith('postgresql://')) return SqlStore.open(await PostgresDialect.open(url, options), options);
  throw new RolloutError({ code: 'BAD_REQUEST', message: `unknown store URL "${url}" (sqlite:///path/to/file.db, sqlite::memory: or postgres://…)` });
}
