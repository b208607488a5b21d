import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import type Database from 'better-sqlite3';
import { RolloutError } from '../../../errors.ts';
import { MIGRATIONS } from './migrations.ts';
import type { Connection, Dialect } from '../../dialect.ts';
import { importDriver } from '../../driver.ts';

/** `sqlite:///abs/path.db`, `sqlite://rel/path.db`, `sqlite::memory:`; `?synchronous=full` to sync every commit. */
export function parseSqliteUrl(url: string): { path: string; synchronous: 'NORMAL' | 'FULL' } {
  const [location = '', query = ''] = url.slice('sqlite:'.length).split('?', 2);
  const path = location.startsWith('//') ? location.slice(2) : location;
  if (path === '') throw new RolloutError({ code: 'BAD_REQUEST', message: `store URL "${url}" names no file (sqlite:///path/to/file.db or sqlite::memory:)` });
  const synchronous = new URLSearchParams(query).get('synchronous')?.toUpperCase() ?? 'NORMAL';
  if (synchronous !== 'NORMAL' && synchronous !== 'FULL') throw new RolloutError({ code: 'BAD_REQUEST', message: `store URL "${url}": synchronous is normal or full` });
  return { path, synchronous };
}

/**
 * The turn all SQLite connections of this process take: the driver runs on this thread, and a
 * transaction's statements are awaited one by one, so another connection's transaction starting in
 * between would wait on the file's lock with the thread blocked (busy_timeout) while the first one
 * could not finish. Other processes still take turns through the lock.
 */
let turn: Promise<unknown> = Promise.resolve();

/** Prepared statements kept by SQL text; more distinct texts than this (IN lists of every length) start the cache afresh. */
const STATEMENT_CACHE = 500;

/**
 * One SQLite file in WAL mode through better-sqlite3. With `synchronous=NORMAL` (the default) a
 * committed transaction survives the process dying (SIGKILL, OOM); the last ones before an OS crash
 * or power loss may be lost, never half-written. `?synchronous=full` syncs every commit. Several
 * processes may open the same file (writes take turns, `busy_timeout` 5 s); it must be on a local
 * disk, not NFS. The driver is synchronous, so the store's async operations take turns (a
 * transaction's statements never interleave with another operation's), and its statements are
 * prepared once.
 */
export class SqliteDialect implements Dialect {
  readonly kind = 'sqlite';
  readonly writers = 'one';
  readonly skipLocked = '';
  readonly #db: Database.Database;
  readonly #statements = new Map<string, Database.Statement>();
  readonly #connection: Connection;

  private constructor(db: Database.Database) {
    this.#db = db;
    this.#connection = {
      all: async <R>(sql: string, params: readonly unknown[] = []) => this.#prepare(sql).all(...params) as R[],
      run: async (sql: string, params: readonly unknown[] = []) => this.#prepare(sql).run(...params).changes,
    };
  }

  static async open(path: string, { synchronous = 'NORMAL' }: { synchronous?: 'NORMAL' | 'FULL' } = {}): Promise<SqliteDialect> {
    const { default: Database } = await importDriver('better-sqlite3', () => import('better-sqlite3'));
    if (path !== ':memory:') mkdirSync(dirname(path), { recursive: true });
    const db = new Database(path, { timeout: 5_000 });
    db.pragma('journal_mode = WAL');
    db.pragma(`synchronous = ${synchronous}`);
    // Checkpoints (the only fsyncs under NORMAL) every ~40 MB of WAL instead of 4 MB: twice the
    // commits per second with ~5 KB results; the WAL file is cut back to 64 MB after each.
    db.pragma('wal_autocheckpoint = 10000');
    db.pragma('journal_size_limit = 67108864');
    return new SqliteDialect(db);
  }

  #prepare(sql: string): Database.Statement {
    let statement = this.#statements.get(sql);
    if (!statement) {
      if (this.#statements.size >= STATEMENT_CACHE) this.#statements.clear();
      statement = this.#db.prepare(sql);
      this.#statements.set(sql, statement);
    }
    return statement;
  }

  /** `work` alone on the connection: the next operation starts when it has settled. */
  #inTurn<T>(work: () => Promise<T>): Promise<T> {
    const run = turn.then(work);
    turn = run.catch(() => {});
    return run;
  }

  json<T>(value: unknown): T {
    return JSON.parse(value as string) as T;
  }

  isUniqueViolation(error: unknown): boolean {
    return (error as { code?: string }).code?.startsWith('SQLITE_CONSTRAINT') === true;
  }

  migrate(): Promise<void> {
    return this.#inTurn(async () => this.#migrate());
  }

  #migrate(): void {
    const db = this.#db;
    db.exec('CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)');
    for (const migration of MIGRATIONS) {
      // IMMEDIATE: two processes opening a new file together apply each migration once.
      db.transaction(() => {
        const applied = db.prepare('SELECT 1 FROM schema_version WHERE version = ?').get(migration.version);
        if (applied) return;
        db.exec(migration.sql);
        db.prepare('INSERT INTO schema_version (version, applied_at) VALUES (?, ?)').run(migration.version, new Date().toISOString());
      }).immediate();
    }
  }

  connection<T>(work: (connection: Connection) => Promise<T>): Promise<T> {
    return this.#inTurn(() => work(this.#connection));
  }

  transaction<T>(work: (connection: Connection) => Promise<T>): Promise<T> {
    return this.#inTurn(async () => {
      // IMMEDIATE: the write lock from the start, so a transaction never fails upgrading a read
      this.#prepare('BEGIN IMMEDIATE').run();
      try {
        const value = await work(this.#connection);
        this.#prepare('COMMIT').run();
        return value;
      } catch (error) {
        if (this.#db.inTransaction) this.#prepare('ROLLBACK').run();
        throw error;
      }
    });
  }

  async close(): Promise<void> {
    await this.#inTurn(async () => {
      if (this.#db.open) this.#db.close();
    });
  }
}
