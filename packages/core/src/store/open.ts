import { RolloutError } from '../errors.ts';
import { PostgresStore } from './postgres.ts';
import { parseSqliteUrl, SqliteStore } from './sqlite.ts';
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
    return SqliteStore.open(path, { ...options, synchronous });
  }
  if (url.startsWith('postgres://') || url.startsWith('postgresql://')) return PostgresStore.open(url, options);
  throw new RolloutError({ code: 'BAD_REQUEST', message: `unknown store URL "${url}" (sqlite:///path/to/file.db, sqlite::memory: or postgres://…)` });
}
