/**
 * What the store (../store.ts) needs of a database engine, after kysely's Dialect/Driver split: the
 * store's methods and their SQL are written once, with `?` placeholders; a dialect runs them on its
 * driver (placeholders, JSON columns, transactions, which errors are worth a retry, its migrations).
 * An engine is a folder under engines/ (its dialect, its migrations, an index.ts naming it) and one
 * line in open.ts's ENGINES.
 */

/** A schema version: applied in order, each once; never edit one once released. */
export interface Migration {
  version: number;
  sql: string;
}

/** One connection, or a transaction on it. SQL has `?` placeholders, in the order of `params`. */
export interface Connection {
  /** The rows a statement answers (a write's, with RETURNING). */
  all<R>(sql: string, params?: readonly unknown[]): Promise<R[]>;
  /** How many rows a write changed. */
  run(sql: string, params?: readonly unknown[]): Promise<number>;
}

export interface Dialect {
  /** The engine's name (`sqlite`, `postgres`), as `RolloutStore.kind` shows it. */
  readonly kind: string;
  /**
   * 'one': every write goes through one connection, in turn (an embedded file): a batch of commits
   * is one transaction. 'many': a pool of connections writes concurrently (a server): a batch's
   * rollouts commit side by side, each in its own transaction.
   */
  readonly writers: 'one' | 'many';
  /** Appended to a SELECT that picks rows to claim: rows another transaction holds are skipped, not waited for ('' where one writer makes it moot). */
  readonly skipLocked: string;
  /** A JSON column's value as the driver gives it (text, or already parsed). */
  json<T>(value: unknown): T;
  /** A unique constraint refused the write. */
  isUniqueViolation(error: unknown): boolean;
  /** Applies the engine's migrations not applied yet, once even when several processes open a new database together. */
  migrate(): Promise<void>;
  /** Runs `work` on a connection (each statement its own transaction). */
  connection<T>(work: (connection: Connection) => Promise<T>): Promise<T>;
  /** Runs `work` in one write transaction, rolled back if it throws. */
  transaction<T>(work: (connection: Connection) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

/**
 * An engine as openStore() finds it: the URLs it takes and how to open one. Its driver is loaded on
 * open, not on import, so what never opens a store (a rollout node, an environment server) never
 * loads a database driver.
 */
export interface StoreEngine {
  readonly name: string;
  /** Whether `url` names a database of this engine. */
  accepts(url: string): boolean;
  /** The URL forms, for the error that names none of them. */
  readonly forms: readonly string[];
  open(url: string, options: { poolSize?: number; reconnectMs?: number }): Promise<Dialect>;
}
