import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';
import { RolloutError } from '../errors.ts';
import type { RolloutResult, RolloutTask } from '../rollout/types.ts';
import { decodeResult, encodeResult } from '../rollout/result-codec.ts';
import { asList, checkClaim, checkPositiveInt, checkResult, conflict, emptyCounts, pageLimit, parseCursor, prepareTasks, TERMINAL_STATES } from './common.ts';
import type {
  ClaimedRollout,
  ClaimOptions,
  CommitInput,
  CommitOutcome,
  LeaseRef,
  ListResultsQuery,
  ListRolloutsQuery,
  OpenStoreOptions,
  Page,
  PruneOutcome,
  PutTaskOutcome,
  RenewOutcome,
  RetentionPolicy,
  RolloutStore,
  StoredNodeCredential,
  StoredRollout,
  StoredTask,
  StoreRolloutState,
} from './types.ts';

/** Schema versions, applied in order, each in its own transaction; never edit one once released. */
const MIGRATIONS: ReadonlyArray<{ version: number; sql: string }> = [
  {
    version: 1,
    sql: `
      CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        body TEXT NOT NULL,
        rollout_ids TEXT NOT NULL,
        created_at TEXT NOT NULL
      );
      CREATE TABLE rollouts (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        task_id TEXT NOT NULL,
        sample_index INTEGER NOT NULL,
        state TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        worker_id TEXT,
        lease_expires_at INTEGER,
        committed_attempt INTEGER
      );
      CREATE INDEX rollouts_task ON rollouts (task_id);
      CREATE INDEX rollouts_state ON rollouts (state, seq);
      CREATE INDEX rollouts_lease ON rollouts (state, lease_expires_at);
      CREATE INDEX rollouts_worker ON rollouts (worker_id, state);
      CREATE TABLE results (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        rollout_id TEXT NOT NULL UNIQUE,
        task_id TEXT NOT NULL,
        state TEXT NOT NULL,
        stored_at INTEGER NOT NULL,
        body TEXT NOT NULL
      );
      CREATE INDEX results_task ON results (task_id, seq);
      CREATE INDEX results_stored ON results (stored_at);
      CREATE TABLE imports (
        source TEXT PRIMARY KEY,
        imported_at TEXT NOT NULL,
        tasks INTEGER NOT NULL,
        results INTEGER NOT NULL
      );
    `,
  },
  {
    // rollout nodes' credentials (hashes): a node registering again after a restart proves it is the same node
    version: 2,
    sql: `
      CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        credential_hash TEXT NOT NULL,
        issued_at INTEGER NOT NULL
      );
    `,
  },
];

/** Leases renewed per transaction: a heartbeat's long list is renewed a chunk at a time, the event loop free between them. */
const RENEW_CHUNK = 500;

interface RolloutRow {
  seq: number;
  id: string;
  task_id: string;
  sample_index: number;
  state: StoreRolloutState;
  attempt: number;
  worker_id: string | null;
  lease_expires_at: number | null;
  committed_attempt: number | null;
}

const toRollout = (row: RolloutRow): StoredRollout => ({
  id: row.id,
  taskId: row.task_id,
  sampleIndex: row.sample_index,
  state: row.state,
  attempt: row.attempt,
  workerId: row.worker_id,
  leaseExpiresAt: row.lease_expires_at,
});

const isUniqueViolation = (error: unknown) => (error as { code?: string }).code?.startsWith('SQLITE_CONSTRAINT') === true;

/** `sqlite:///abs/path.db`, `sqlite://rel/path.db`, `sqlite::memory:`; `?synchronous=full` to sync every commit. */
export function parseSqliteUrl(url: string): { path: string; synchronous: 'NORMAL' | 'FULL' } {
  const [location = '', query = ''] = url.slice('sqlite:'.length).split('?', 2);
  const path = location.startsWith('//') ? location.slice(2) : location;
  if (path === '') throw new RolloutError({ code: 'BAD_REQUEST', message: `store URL "${url}" names no file (sqlite:///path/to/file.db or sqlite::memory:)` });
  const synchronous = new URLSearchParams(query).get('synchronous')?.toUpperCase() ?? 'NORMAL';
  if (synchronous !== 'NORMAL' && synchronous !== 'FULL') throw new RolloutError({ code: 'BAD_REQUEST', message: `store URL "${url}": synchronous is normal or full` });
  return { path, synchronous };
}

/** The WHERE clause of a listing (after the cursor, by state and task) and its parameters. */
function filter(query: ListRolloutsQuery | ListResultsQuery): { where: string; params: unknown[] } {
  const where = ['seq > ?'];
  const params: unknown[] = [parseCursor(query.cursor)];
  const states = asList(query.state);
  if (states) {
    where.push(`state IN (${states.map(() => '?').join(', ')})`);
    params.push(...states);
  }
  if (query.taskId !== undefined) {
    where.push('task_id = ?');
    params.push(query.taskId);
  }
  return { where: where.join(' AND '), params };
}

/**
 * The embedded store: one SQLite file in WAL mode. With `synchronous=NORMAL` (the default) a
 * committed transaction survives the process dying (SIGKILL, OOM); the last ones before an OS
 * crash or power loss may be lost, never half-written. `?synchronous=full` syncs every commit.
 * Several processes may open the same file (writes take turns, `busy_timeout` 5 s); it must be on
 * a local disk, not NFS.
 */
export class SqliteStore implements RolloutStore {
  readonly kind = 'sqlite';
  readonly #db: Database.Database;
  readonly #now: () => number;
  readonly #retention: RetentionPolicy;
  readonly #statements;

  private constructor(db: Database.Database, options: OpenStoreOptions) {
    this.#db = db;
    this.#now = options.now ?? Date.now;
    this.#retention = options.retention ?? {};
    this.#statements = {
      taskById: db.prepare<[string], { id: string; fingerprint: string; body: string; rollout_ids: string; created_at: string }>('SELECT * FROM tasks WHERE id = ?'),
      taskBody: db.prepare<[string], { body: string }>('SELECT body FROM tasks WHERE id = ?'),
      insertTask: db.prepare<[string, string, string, string, string]>('INSERT INTO tasks (id, fingerprint, body, rollout_ids, created_at) VALUES (?, ?, ?, ?, ?)'),
      insertRollout: db.prepare<[string, string, number]>("INSERT INTO rollouts (id, task_id, sample_index, state) VALUES (?, ?, ?, 'queued')"),
      expired: db.prepare<[number, number], { seq: number }>("SELECT seq FROM rollouts WHERE state = 'leased' AND lease_expires_at < ? ORDER BY seq LIMIT ?"),
      queued: db.prepare<[number], { seq: number }>("SELECT seq FROM rollouts WHERE state = 'queued' ORDER BY seq LIMIT ?"),
      lease: db.prepare<[string, number, number], RolloutRow>(
        "UPDATE rollouts SET state = 'leased', attempt = attempt + 1, worker_id = ?, lease_expires_at = ? WHERE seq = ? RETURNING *",
      ),
      renew: db.prepare<[number, string, string, number]>("UPDATE rollouts SET lease_expires_at = ? WHERE id = ? AND worker_id = ? AND attempt = ? AND state = 'leased'"),
      expire: db.prepare<[number], { id: string }>("UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE state = 'leased' AND lease_expires_at < ? RETURNING id"),
      releaseLease: db.prepare<[string, string, number], { id: string }>(
        "UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE id = ? AND worker_id = ? AND attempt = ? AND state = 'leased' RETURNING id",
      ),
      release: db.prepare<[string], { id: string }>("UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE worker_id = ? AND state = 'leased' RETURNING id"),
      // the fence and the holder in one statement: the current attempt, unfinished, leased to the committer (or queued, for the service's own)
      finish: db.prepare<[string, string, string, number, string, number], { task_id: string }>(
        "UPDATE rollouts SET state = ?, worker_id = ?, lease_expires_at = NULL, committed_attempt = attempt WHERE id = ? AND attempt = ? AND ((state = 'leased' AND worker_id = ?) OR (state = 'queued' AND ? = 1)) RETURNING task_id",
      ),
      finishImported: db.prepare<[string, string], { task_id: string }>(
        "UPDATE rollouts SET state = ?, worker_id = NULL, lease_expires_at = NULL, committed_attempt = attempt WHERE id = ? AND state IN ('queued', 'leased') RETURNING task_id",
      ),
      insertResult: db.prepare<[string, string, string, number, string]>('INSERT INTO results (rollout_id, task_id, state, stored_at, body) VALUES (?, ?, ?, ?, ?)'),
      amendResult: db.prepare<[string, string, string, string]>('UPDATE results SET body = ?, state = ? WHERE rollout_id = ? AND task_id = ?'),
      rollout: db.prepare<[string], RolloutRow>('SELECT * FROM rollouts WHERE id = ?'),
      result: db.prepare<[string], { body: string }>('SELECT body FROM results WHERE rollout_id = ?'),
      counts: db.prepare<[], { state: StoreRolloutState; n: number }>('SELECT state, count(*) AS n FROM rollouts GROUP BY state'),
      nthNewest: db.prepare<[number], { seq: number }>('SELECT seq FROM results ORDER BY seq DESC LIMIT 1 OFFSET ?'),
      hasImport: db.prepare<[string], { source: string }>('SELECT source FROM imports WHERE source = ?'),
      insertImport: db.prepare<[string, string, number, number]>('INSERT INTO imports (source, imported_at, tasks, results) VALUES (?, ?, ?, ?)'),
      version: db.prepare<[], { version: number | null }>('SELECT max(version) AS version FROM schema_version'),
      putNode: db.prepare<[string, string, number]>('INSERT INTO nodes (id, credential_hash, issued_at) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET credential_hash = excluded.credential_hash, issued_at = excluded.issued_at'),
      getNode: db.prepare<[string], { id: string; credential_hash: string; issued_at: number }>('SELECT * FROM nodes WHERE id = ?'),
      deleteNode: db.prepare<[string]>('DELETE FROM nodes WHERE id = ?'),
    };
  }

  static open(path: string, options: OpenStoreOptions & { synchronous?: 'NORMAL' | 'FULL' } = {}): SqliteStore {
    if (path !== ':memory:') mkdirSync(dirname(path), { recursive: true });
    const db = new Database(path, { timeout: 5_000 });
    db.pragma('journal_mode = WAL');
    db.pragma(`synchronous = ${options.synchronous ?? 'NORMAL'}`);
    // Checkpoints (the only fsyncs under NORMAL) every ~40 MB of WAL instead of 4 MB: twice the
    // commits per second with ~5 KB results; the WAL file is cut back to 64 MB after each.
    db.pragma('wal_autocheckpoint = 10000');
    db.pragma('journal_size_limit = 67108864');
    SqliteStore.#migrate(db);
    return new SqliteStore(db, options);
  }

  static #migrate(db: Database.Database): void {
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

  async putTasks(tasks: readonly RolloutTask[]): Promise<PutTaskOutcome[]> {
    const prepared = prepareTasks(tasks);
    return this.#db.transaction(() => this.#putIn(tasks, prepared)).immediate();
  }

  async putTasksAndClaim(tasks: readonly RolloutTask[], claim: ClaimOptions): Promise<{ outcomes: PutTaskOutcome[]; claimed: ClaimedRollout[] }> {
    checkClaim(claim);
    const prepared = prepareTasks(tasks);
    return this.#db.transaction(() => ({ outcomes: this.#putIn(tasks, prepared), claimed: this.#claimIn(claim) })).immediate();
  }

  /** putTasks inside the caller's transaction. */
  #putIn(tasks: readonly RolloutTask[], prepared: ReturnType<typeof prepareTasks>): PutTaskOutcome[] {
    const s = this.#statements;
    const at = new Date(this.#now()).toISOString();
    const outcomes = new Map<string, PutTaskOutcome>();
    for (const task of prepared) {
      const known = s.taskById.get(task.id);
      if (known) {
        if (known.fingerprint !== task.fingerprint) throw conflict(`task id "${task.id}" was already submitted with a different body`);
        outcomes.set(task.id, { taskId: task.id, rolloutIds: JSON.parse(known.rollout_ids) as string[], existing: true });
        continue;
      }
      s.insertTask.run(task.id, task.fingerprint, task.body, JSON.stringify(task.rolloutIds), at);
      task.rolloutIds.forEach((id, k) => {
        try {
          s.insertRollout.run(id, task.id, k);
        } catch (error) {
          if (isUniqueViolation(error)) throw conflict(`rollout id "${id}" of task "${task.id}" is already another task's rollout`, error);
          throw error;
        }
      });
      outcomes.set(task.id, { taskId: task.id, rolloutIds: task.rolloutIds, existing: false });
    }
    return tasks.map((task) => outcomes.get(task.id!)!);
  }

  async getTask(taskId: string): Promise<StoredTask | undefined> {
    const row = this.#statements.taskById.get(taskId);
    if (!row) return undefined;
    return { id: row.id, task: JSON.parse(row.body) as RolloutTask, rolloutIds: JSON.parse(row.rollout_ids) as string[], createdAt: row.created_at };
  }

  async claim(options: ClaimOptions): Promise<ClaimedRollout[]> {
    checkClaim(options);
    return this.#db.transaction(() => this.#claimIn(options)).immediate();
  }

  /** claim inside the caller's transaction. */
  #claimIn({ workerId, limit, leaseMs }: ClaimOptions): ClaimedRollout[] {
    const s = this.#statements;
    const now = this.#now();
    const seqs = s.expired.all(now, limit).map((row) => row.seq);
    if (seqs.length < limit) seqs.push(...s.queued.all(limit - seqs.length).map((row) => row.seq));
    const tasks = new Map<string, RolloutTask>();
    return seqs.map((seq) => {
      const row = s.lease.get(workerId, now + leaseMs, seq)!;
      let task = tasks.get(row.task_id);
      if (!task) {
        task = JSON.parse(s.taskBody.get(row.task_id)!.body) as RolloutTask;
        tasks.set(row.task_id, task);
      }
      return { id: row.id, taskId: row.task_id, sampleIndex: row.sample_index, attempt: row.attempt, leaseExpiresAt: row.lease_expires_at!, task };
    });
  }

  async renewLeases(workerId: string, leases: readonly LeaseRef[], leaseMs: number): Promise<RenewOutcome> {
    checkPositiveInt('leaseMs', leaseMs);
    const until = this.#now() + leaseMs;
    const outcome: RenewOutcome = { renewed: [], lost: [] };
    const renewChunk = this.#db.transaction((chunk: readonly LeaseRef[]) => {
      for (const { rolloutId, attempt } of chunk) {
        const { changes } = this.#statements.renew.run(until, rolloutId, workerId, attempt);
        (changes > 0 ? outcome.renewed : outcome.lost).push(rolloutId);
      }
    });
    for (let start = 0; start < leases.length; start += RENEW_CHUNK) {
      // other requests get their turn between chunks (a synchronous driver holds the event loop)
      if (start > 0) await new Promise((resolve) => setImmediate(resolve));
      renewChunk.immediate(leases.slice(start, start + RENEW_CHUNK));
    }
    return outcome;
  }

  async expireLeases(): Promise<string[]> {
    return this.#statements.expire.all(this.#now()).map((row) => row.id);
  }

  async releaseWorker(workerId: string): Promise<string[]> {
    return this.#statements.release.all(workerId).map((row) => row.id);
  }

  async releaseLeases(workerId: string, leases: readonly LeaseRef[]): Promise<string[]> {
    return this.#db.transaction(() => leases.flatMap(({ rolloutId, attempt }) => this.#statements.releaseLease.all(rolloutId, workerId, attempt).map((row) => row.id))).immediate();
  }

  async commit(input: CommitInput): Promise<CommitOutcome> {
    checkResult(input.result);
    for (const other of input.amend ?? []) checkResult(other);
    return this.#db.transaction(() => this.#commitOne(input)).immediate();
  }

  async commitMany(inputs: readonly CommitInput[]): Promise<CommitOutcome[]> {
    for (const input of inputs) {
      checkResult(input.result);
      for (const other of input.amend ?? []) checkResult(other);
    }
    return this.#db.transaction(() => inputs.map((input) => this.#commitOne(input))).immediate();
  }

  /** One commit, inside the caller's transaction. */
  #commitOne({ rolloutId, attempt, result, workerId, unheld = false, amend = [] }: CommitInput): CommitOutcome {
    const s = this.#statements;
    const now = this.#now();
    const finished = s.finish.get(result.state, workerId, rolloutId, attempt, workerId, unheld ? 1 : 0);
    if (!finished) {
      const row = s.rollout.get(rolloutId);
      if (!row) return { status: 'not_found' };
      if (row.committed_attempt === attempt && row.worker_id === workerId) return { status: 'duplicate' };
      return { status: 'stale', currentAttempt: row.attempt, state: row.state };
    }
    s.insertResult.run(rolloutId, finished.task_id, result.state, now, JSON.stringify(encodeResult(result)));
    for (const other of amend) if (other.id !== rolloutId) s.amendResult.run(JSON.stringify(encodeResult(other)), other.state, other.id, finished.task_id);
    return { status: 'committed' };
  }

  async getResult(rolloutId: string): Promise<RolloutResult | undefined> {
    const row = this.#statements.result.get(rolloutId);
    return row ? decodeResult(JSON.parse(row.body)) : undefined;
  }

  async getResults(rolloutIds: readonly string[]): Promise<Map<string, RolloutResult>> {
    const found = new Map<string, RolloutResult>();
    for (let start = 0; start < rolloutIds.length; start += 500) {
      const chunk = rolloutIds.slice(start, start + 500);
      const rows = this.#db.prepare<string[], { rollout_id: string; body: string }>(`SELECT rollout_id, body FROM results WHERE rollout_id IN (${chunk.map(() => '?').join(', ')})`).all(...chunk);
      for (const row of rows) found.set(row.rollout_id, decodeResult(JSON.parse(row.body)));
    }
    return found;
  }

  async getRollout(rolloutId: string): Promise<StoredRollout | undefined> {
    const row = this.#statements.rollout.get(rolloutId);
    return row ? toRollout(row) : undefined;
  }

  async listRollouts(query: ListRolloutsQuery = {}): Promise<Page<StoredRollout>> {
    const limit = pageLimit(query.limit);
    const { where, params } = filter(query);
    const rows = this.#db.prepare<unknown[], RolloutRow>(`SELECT * FROM rollouts WHERE ${where} ORDER BY seq LIMIT ?`).all(...params, limit);
    return { items: rows.map(toRollout), cursor: rows.length === limit ? String(rows.at(-1)!.seq) : null };
  }

  async listResults(query: ListResultsQuery = {}): Promise<Page<RolloutResult>> {
    const limit = pageLimit(query.limit);
    const { where, params } = filter(query);
    const rows = this.#db.prepare<unknown[], { seq: number; body: string }>(`SELECT seq, body FROM results WHERE ${where} ORDER BY seq LIMIT ?`).all(...params, limit);
    return { items: rows.map((row) => decodeResult(JSON.parse(row.body))), cursor: rows.length === limit ? String(rows.at(-1)!.seq) : null };
  }

  async counts(): Promise<Record<StoreRolloutState, number>> {
    const counts = emptyCounts();
    for (const { state, n } of this.#statements.counts.all()) counts[state] = n;
    return counts;
  }

  async prune(policy: RetentionPolicy = this.#retention): Promise<PruneOutcome> {
    const where: string[] = [];
    const params: number[] = [];
    if (policy.maxAgeMs !== undefined) {
      where.push('stored_at < ?');
      params.push(this.#now() - policy.maxAgeMs);
    }
    return this.#db
      .transaction((): PruneOutcome => {
        if (policy.keepLast !== undefined) {
          const nth = policy.keepLast > 0 ? this.#statements.nthNewest.get(policy.keepLast - 1) : { seq: Number.MAX_SAFE_INTEGER };
          if (nth) {
            where.push('seq < ?');
            params.push(nth.seq);
          }
        }
        if (where.length === 0) return { results: 0, tasks: 0 };
        const gone = this.#db.prepare<number[], { rollout_id: string; task_id: string }>(`DELETE FROM results WHERE ${where.join(' OR ')} RETURNING rollout_id, task_id`).all(...params);
        const deleteRollout = this.#db.prepare('DELETE FROM rollouts WHERE id = ?');
        for (const { rollout_id } of gone) deleteRollout.run(rollout_id);
        const deleteTask = this.#db.prepare('DELETE FROM tasks WHERE id = ? AND NOT EXISTS (SELECT 1 FROM rollouts WHERE task_id = ?)');
        let tasks = 0;
        for (const taskId of new Set(gone.map((row) => row.task_id))) tasks += deleteTask.run(taskId, taskId).changes;
        return { results: gone.length, tasks };
      })
      .immediate();
  }

  async hasImport(source: string): Promise<boolean> {
    return this.#statements.hasImport.get(source) !== undefined;
  }

  async recordImport(source: string, tasks: readonly RolloutTask[], results: readonly RolloutResult[]) {
    const s = this.#statements;
    const now = this.#now();
    const at = new Date(now).toISOString();
    const prepared = prepareTasks(tasks);
    return this.#db
      .transaction(() => {
        if (s.hasImport.get(source)) return { imported: false, tasks: 0, results: 0 };
        let taskCount = 0;
        for (const task of prepared) {
          if (s.taskById.get(task.id)) continue;
          s.insertTask.run(task.id, task.fingerprint, task.body, JSON.stringify(task.rolloutIds), at);
          task.rolloutIds.forEach((id, k) => s.insertRollout.run(id, task.id, k));
          taskCount++;
        }
        let resultCount = 0;
        for (const result of results) {
          if (!(TERMINAL_STATES as readonly string[]).includes(result.state)) continue;
          const finished = s.finishImported.get(result.state, result.id);
          if (!finished) continue;
          s.insertResult.run(result.id, finished.task_id, result.state, now, JSON.stringify(encodeResult(result)));
          resultCount++;
        }
        s.insertImport.run(source, at, taskCount, resultCount);
        return { imported: true, tasks: taskCount, results: resultCount };
      })
      .immediate();
  }

  async putNodeCredential({ nodeId, credentialHash, issuedAt }: StoredNodeCredential): Promise<void> {
    this.#statements.putNode.run(nodeId, credentialHash, issuedAt);
  }

  async getNodeCredential(nodeId: string): Promise<StoredNodeCredential | undefined> {
    const row = this.#statements.getNode.get(nodeId);
    return row && { nodeId: row.id, credentialHash: row.credential_hash, issuedAt: row.issued_at };
  }

  async deleteNodeCredential(nodeId: string): Promise<void> {
    this.#statements.deleteNode.run(nodeId);
  }

  async schemaVersion(): Promise<number> {
    return this.#statements.version.get()?.version ?? 0;
  }

  async close(): Promise<void> {
    if (this.#db.open) this.#db.close();
  }
}
