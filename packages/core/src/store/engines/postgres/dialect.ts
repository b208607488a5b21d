import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { RolloutError } from '../../../errors.ts';
import { MIGRATIONS } from './migrations.ts';
import type { Connection, Dialect } from '../../dialect.ts';
import { importDriver } from '../../driver.ts';

/** Errors after which the same operation may succeed on a new connection: the server went away or is starting. */
const TRANSIENT_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ENOENT', 'EPIPE', 'ETIMEDOUT', '57P01', '57P02', '57P03', '40001', '40P01']);

function isTransient(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: string; message?: string };
  if (code && (TRANSIENT_CODES.has(code) || code.startsWith('08'))) return true;
  return /Connection terminated|connection error|Client was closed|not queryable/i.test(message ?? '');
}

/** `?` placeholders as `$1, $2, …` (the store's SQL has no `?` of its own), compiled once per text. */
const compiled = new Map<string, string>();
function compile(sql: string): string {
  let text = compiled.get(sql);
  if (text === undefined) {
    let n = 0;
    text = sql.replace(/\?/g, () => `$${++n}`);
    if (compiled.size >= 1_000) compiled.clear();
    compiled.set(sql, text);
  }
  return text;
}

const connectionOf = (client: pg.PoolClient): Connection => ({
  all: async <R>(sql: string, params: readonly unknown[] = []) => (await client.query(compile(sql), params as unknown[])).rows as R[],
  run: async (sql: string, params: readonly unknown[] = []) => (await client.query(compile(sql), params as unknown[])).rowCount ?? 0,
});

/**
 * PostgreSQL through a pool of connections. Every commit is one transaction (durable as the server
 * is configured: `synchronous_commit` on by default). Claims lock rows with `FOR UPDATE SKIP LOCKED`,
 * so concurrent claimers never wait on each other and never share a rollout. While the server cannot
 * be reached (a restart), operations retry on new connections for `reconnectMs`; that is safe because
 * every write of the store is idempotent (tasks by id) or fenced (commits by attempt: a commit retried
 * after its first try went through answers `duplicate`).
 */
export class PostgresDialect implements Dialect {
  readonly kind = 'postgres';
  readonly writers = 'many';
  readonly skipLocked = ' FOR UPDATE SKIP LOCKED';
  readonly #pool: pg.Pool;
  readonly #reconnectMs: number;
  #closed = false;

  private constructor(pool: pg.Pool, reconnectMs: number) {
    this.#pool = pool;
    this.#reconnectMs = reconnectMs;
  }

  static async open(url: string, { poolSize = 10, reconnectMs = 30_000 }: { poolSize?: number; reconnectMs?: number } = {}): Promise<PostgresDialect> {
    const { default: pg } = await importDriver('pg', () => import('pg'));
    const pool = new pg.Pool({ connectionString: url, max: poolSize, connectionTimeoutMillis: 10_000 });
    // An idle connection the server drops (a restart) is an 'error' event: the pool discards it
    // and the next query takes a new one; unhandled, the event would end the process.
    pool.on('error', () => {});
    // The same for a connection checked out between two queries (a transaction's, say): the
    // pool's own listener is only on idle ones. Its next query fails, and the work is retried.
    pool.on('connect', (client) => client.on('error', () => {}));
    return new PostgresDialect(pool, reconnectMs);
  }

  json<T>(value: unknown): T {
    return value as T;
  }

  isUniqueViolation(error: unknown): boolean {
    return (error as { code?: string }).code === '23505';
  }

  async migrate(): Promise<void> {
    try {
      await this.transaction(async (connection) => {
        await connection.run("SELECT pg_advisory_xact_lock(hashtext('rollserve.store.migrations'))");
        await connection.run('CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY, applied_at text NOT NULL)');
        const applied = new Set((await connection.all<{ version: number }>('SELECT version FROM schema_version')).map((row) => row.version));
        for (const migration of MIGRATIONS) {
          if (applied.has(migration.version)) continue;
          await connection.run(migration.sql);
          await connection.run('INSERT INTO schema_version (version, applied_at) VALUES (?, ?)', [migration.version, new Date().toISOString()]);
        }
      });
    } catch (error) {
      await this.close();
      throw error;
    }
  }

  /** Runs `work` on one connection, again on a new one while the database cannot be reached. */
  async connection<T>(work: (connection: Connection) => Promise<T>): Promise<T> {
    const deadline = Date.now() + this.#reconnectMs;
    for (let delay = 50; ; delay = Math.min(delay * 2, 1_000)) {
      if (this.#closed) throw new RolloutError({ code: 'UNAVAILABLE', message: 'the store is closed', retryable: true });
      let client: pg.PoolClient | undefined;
      try {
        client = await this.#pool.connect();
        const value = await work(connectionOf(client));
        client.release();
        return value;
      } catch (error) {
        // A connection that failed is destroyed, not returned to the pool.
        client?.release(isTransient(error) ? (error as Error) : undefined);
        if (!isTransient(error)) throw error;
        if (Date.now() + delay > deadline) {
          throw new RolloutError({ code: 'UNAVAILABLE', message: `the store's database cannot be reached: ${(error as Error).message}`, cause: error, retryable: true });
        }
        await sleep(delay);
      }
    }
  }

  transaction<T>(work: (connection: Connection) => Promise<T>): Promise<T> {
    return this.connection(async (connection) => {
      await connection.run('BEGIN');
      try {
        const value = await work(connection);
        await connection.run('COMMIT');
        return value;
      } catch (error) {
        await connection.run('ROLLBACK').catch(() => {});
        throw error;
      }
    });
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#pool.end();
  }
}
