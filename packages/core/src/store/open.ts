import { RolloutError } from '../errors.ts';
import type { StoreEngine } from './dialect.ts';
import { postgresEngine } from './engines/postgres/index.ts';
import { sqliteEngine } from './engines/sqlite/index.ts';
import { SqlStore } from './store.ts';
import type { OpenStoreOptions, RolloutStore } from './types.ts';

/** The engines openStore() knows, by URL. */
const ENGINES: readonly StoreEngine[] = [sqliteEngine, postgresEngine];

/**
 * Opens a store by URL, applying its migrations:
 * `sqlite:///abs/path.db` (`?synchronous=full` to sync every commit), `sqlite::memory:`,
 * `postgres://user:password@host:port/db` or `postgresql://…` (libpq-style parameters such as
 * `?host=/run/postgresql` for a Unix socket).
 */
export async function openStore(url: string, options: OpenStoreOptions = {}): Promise<RolloutStore> {
  const engine = ENGINES.find((candidate) => candidate.accepts(url));
  if (!engine) {
    const forms = ENGINES.flatMap((candidate) => candidate.forms);
    const named = forms.length > 1 ? `${forms.slice(0, -1).join(', ')} or ${forms.at(-1)}` : forms.join('');
    throw new RolloutError({ code: 'BAD_REQUEST', message: `unknown store URL "${url}" (${named})` });
  }
  return SqlStore.open(await engine.open(url, options), options);
}
