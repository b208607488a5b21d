import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
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
        id text PRIMARY KEY,
        fingerprint text NOT NULL,
        body json NOT NULL,
        rollout_ids json NOT NULL,
        created_at text NOT NULL
      );
      CREATE TABLE rollouts (
        seq bigserial PRIMARY KEY,
        id text NOT NULL UNIQUE,
        task_id text NOT NULL,
        sample_index integer NOT NULL,
        state text NOT NULL,
        attempt integer NOT NULL DEFAULT 0,
        worker_id text,
        lease_expires_at bigint,
        committed_attempt integer
      );
      CREATE INDEX rollouts_task ON rollouts (task_id);
      CREATE INDEX rollouts_state ON rollouts (state, seq);
      CREATE INDEX rollouts_lease ON rollouts (lease_expires_at) WHERE state = 'leased';
      CREATE INDEX rollouts_worker ON rollouts (worker_id) WHERE state = 'leased';
      CREATE TABLE results (
        seq bigserial PRIMARY KEY,
        rollout_id text NOT NULL UNIQUE,
        task_id text NOT NULL,
        state text NOT NULL,
        stored_at bigint NOT NULL,
        body json NOT NULL
      );
      CREATE INDEX results_task ON results (task_id, seq);
      CREATE INDEX results_stored ON results (stored_at);
      CREATE TABLE imports (
        source text PRIMARY KEY,
        imported_at text NOT NULL,
        tasks integer NOT NULL,
        results integer NOT NULL
      );
    `,
  },
  {
    // rollout nodes' credentials (hashes): a node registering again after a restart proves it is the same node
    version: 2,
    sql: `
      CREATE TABLE nodes (
        id text PRIMARY KEY,
        credential_hash text NOT NULL,
        issued_at bigint NOT NULL
      );
    `,
  },
];

interface RolloutRow {
  seq: string;
  id: string;
  task_id: string;
  sample_index: number;
  state: StoreRolloutState;
  attempt: number;
  worker_id: string | null;
  lease_expires_at: string | null;
  committed_attempt: number | null;
}

const toRollout = (row: RolloutRow): StoredRollout => ({
  id: row.id,
  taskId: row.task_id,
  sampleIndex: row.sample_index,
  state: row.state,
  attempt: row.attempt,
  workerId: row.worker_id,
  leaseExpiresAt: row.lease_expires_at === null ? null : Number(row.lease_expires_at),
});

/** Errors after which the same operation may succeed on a new connection: the server went away or is starting. */
const TRANSIENT_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ENOENT', 'EPIPE', 'ETIMEDOUT', '57P01', '57P02', '57P03', '40001', '40P01']);

function isTransient(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: string; message?: string };
  if (code && (TRANSIENT_CODES.has(code) || code.startsWith('08'))) return true;
  return /Connection terminated|connection error|Client was closed|not queryable/i.test(message ?? '');
}

type Client = pg.PoolClient;

type PreparedTasks = ReturnType<typeof prepareTasks>;

/** Inserts the tasks not stored yet (a known id is left as it is); answers the ids inserted. */
async function insertNewTasks(client: Client, prepared: PreparedTasks, at: string): Promise<Set<string>> {
  const inserted = await client.query<{ id: string }>(
    `INSERT INTO tasks (id, fingerprint, body, rollout_ids, created_at)
     SELECT id, fingerprint, body, rollout_ids, $5 FROM unnest($1::text[], $2::text[], $3::json[], $4::json[]) AS t(id, fingerprint, body, rollout_ids)
     ON CONFLICT (id) DO NOTHING RETURNING id`,
    [prepared.map((t) => t.id), prepared.map((t) => t.fingerprint), prepared.map((t) => t.body), prepared.map((t) => JSON.stringify(t.rolloutIds)), at],
  );
  return new Set(inserted.rows.map((row) => row.id));
}

/** The rollouts of the `fresh` tasks, queued in submission order; a rollout id another task has is a conflict. */
async function insertQueuedRollouts(client: Client, prepared: PreparedTasks, fresh: ReadonlySet<string>): Promise<void> {
  const rollouts = prepared.filter((t) => fresh.has(t.id)).flatMap((t) => t.rolloutIds.map((id, k) => ({ id, taskId: t.id, k })));
  if (rollouts.length === 0) return;
  try {
    await client.query(
      `INSERT INTO rollouts (id, task_id, sample_index, state)
       SELECT id, task_id, k, 'queued' FROM unnest($1::text[], $2::text[], $3::int[]) WITH ORDINALITY AS r(id, task_id, k, ord) ORDER BY ord`,
      [rollouts.map((r) => r.id), rollouts.map((r) => r.taskId), rollouts.map((r) => r.k)],
    );
  } catch (error) {
    if ((error as { code?: string }).code === '23505') throw conflict(`a rollout id of this batch is already another task's rollout (${(error as { detail?: string }).detail ?? ''})`, error);
    throw error;
  }
}

/**
 * The shared store: PostgreSQL through a pool of connections. Every commit is one transaction
 * (durable as the server is configured: `synchronous_commit` on by default). Claims lock rows with
 * `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on each other and never share a
 * rollout. While the server cannot be reached (a restart), operations retry on new connections for
 * `reconnectMs`; that is safe because every write is idempotent (tasks by id) or fenced (commits by
 * attempt: a commit retried after its first try went through answers `duplicate`).
 */
export class PostgresStore implements RolloutStore {
  readonly kind = 'postgres';
  readonly #pool: pg.Pool;
  readonly #now: () => number;
  readonly #retention: RetentionPolicy;
  readonly #reconnectMs: number;
  #closed = false;

  private constructor(pool: pg.Pool, options: OpenStoreOptions) {
    this.#pool = pool;
    this.#now = options.now ?? Date.now;
    this.#retention = options.retention ?? {};
    this.#reconnectMs = options.reconnectMs ?? 30_000;
  }

  static async open(url: string, options: OpenStoreOptions = {}): Promise<PostgresStore> {
    const pool = new pg.Pool({ connectionString: url, max: options.poolSize ?? 10, connectionTimeoutMillis: 10_000 });
    // An idle connection the server drops (a restart) is an 'error' event: the pool discards it
    // and the next query takes a new one; unhandled, the event would end the process.
    pool.on('error', () => {});
    // The same for a connection checked out between two queries (a transaction's, say): the
    // pool's own listener is only on idle ones. Its next query fails, and the work is retried.
    pool.on('connect', (client) => client.on('error', () => {}));
    const store = new PostgresStore(pool, options);
    try {
      await store.#transaction(async (client) => {
        await client.query("SELECT pg_advisory_xact_lock(hashtext('rollserve.store.migrations'))");
        await client.query('CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY, applied_at text NOT NULL)');
        const { rows } = await client.query<{ version: number }>('SELECT version FROM schema_version');
        const applied = new Set(rows.map((row) => row.version));
        for (const migration of MIGRATIONS) {
          if (applied.has(migration.version)) continue;
          await client.query(migration.sql);
          await client.query('INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)', [migration.version, new Date().toISOString()]);
        }
      });
    } catch (error) {
      await pool.end();
      throw error;
    }
    return store;
  }

  /** Runs `work` on one connection, again on a new one while the database cannot be reached. */
  async #withClient<T>(work: (client: Client) => Promise<T>): Promise<T> {
    const deadline = Date.now() + this.#reconnectMs;
    for (let delay = 50; ; delay = Math.min(delay * 2, 1_000)) {
      if (this.#closed) throw new RolloutError({ code: 'UNAVAILABLE', message: 'the store is closed', retryable: true });
      let client: Client | undefined;
      try {
        client = await this.#pool.connect();
        const value = await work(client);
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

  #transaction<T>(work: (client: Client) => Promise<T>): Promise<T> {
    return this.#withClient(async (client) => {
      await client.query('BEGIN');
      try {
        const value = await work(client);
        await client.query('COMMIT');
        return value;
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {});
        throw error;
      }
    });
  }

  #query<R extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<pg.QueryResult<R>> {
    return this.#withClient((client) => client.query<R>(text, values));
  }

  async putTasks(tasks: readonly RolloutTask[]): Promise<PutTaskOutcome[]> {
    const prepared = prepareTasks(tasks);
    return this.#transaction((client) => this.#putWith(client, tasks, prepared));
  }

  async putTasksAndClaim(tasks: readonly RolloutTask[], claim: ClaimOptions): Promise<{ outcomes: PutTaskOutcome[]; claimed: ClaimedRollout[] }> {
    checkClaim(claim);
    const prepared = prepareTasks(tasks);
    return this.#transaction(async (client) => ({ outcomes: await this.#putWith(client, tasks, prepared), claimed: await this.#claimWith(client, claim) }));
  }

  /** putTasks on the caller's transaction. */
  async #putWith(client: Client, tasks: readonly RolloutTask[], prepared: ReturnType<typeof prepareTasks>): Promise<PutTaskOutcome[]> {
    const at = new Date(this.#now()).toISOString();
    const fresh = await insertNewTasks(client, prepared, at);
    const outcomes = new Map<string, PutTaskOutcome>();
    const known = prepared.filter((t) => !fresh.has(t.id));
    if (known.length > 0) {
      const { rows } = await client.query<{ id: string; fingerprint: string; rollout_ids: string[] }>('SELECT id, fingerprint, rollout_ids FROM tasks WHERE id = ANY($1::text[])', [
        known.map((t) => t.id),
      ]);
      const byId = new Map(rows.map((row) => [row.id, row]));
      for (const task of known) {
        const row = byId.get(task.id)!;
        if (row.fingerprint !== task.fingerprint) throw conflict(`task id "${task.id}" was already submitted with a different body`);
        outcomes.set(task.id, { taskId: task.id, rolloutIds: row.rollout_ids, existing: true });
      }
    }
    await insertQueuedRollouts(client, prepared, fresh);
    for (const task of prepared) if (fresh.has(task.id)) outcomes.set(task.id, { taskId: task.id, rolloutIds: task.rolloutIds, existing: false });
    return tasks.map((task) => outcomes.get(task.id!)!);
  }

  async getTask(taskId: string): Promise<StoredTask | undefined> {
    const { rows } = await this.#query<{ id: string; body: RolloutTask; rollout_ids: string[]; created_at: string }>('SELECT * FROM tasks WHERE id = $1', [taskId]);
    const row = rows[0];
    return row && { id: row.id, task: row.body, rolloutIds: row.rollout_ids, createdAt: row.created_at };
  }

  async claim(options: ClaimOptions): Promise<ClaimedRollout[]> {
    checkClaim(options);
    return this.#withClient((client) => this.#claimWith(client, options));
  }

  /**
   * One statement (its own transaction unless the caller's): expired leases first, then queued
   * rollouts, oldest first; rows another claimer has locked are skipped, not waited for.
   */
  async #claimWith(client: Client, { workerId, limit, leaseMs }: ClaimOptions): Promise<ClaimedRollout[]> {
    const now = this.#now();
    const { rows } = await client.query<{ id: string; task_id: string; sample_index: number; attempt: number; lease_expires_at: string; body: RolloutTask }>(
      `WITH expired AS (
         SELECT seq FROM rollouts WHERE state = 'leased' AND lease_expires_at < $1 ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
       ), queued AS (
         SELECT seq FROM rollouts WHERE state = 'queued' ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
       ), picked AS (
         SELECT seq FROM (SELECT seq, 0 AS rank FROM expired UNION ALL SELECT seq, 1 FROM queued) AS candidates ORDER BY rank, seq LIMIT $2
       )
       UPDATE rollouts AS r SET state = 'leased', attempt = r.attempt + 1, worker_id = $3, lease_expires_at = $4
       FROM picked, tasks AS t
       WHERE r.seq = picked.seq AND t.id = r.task_id
       RETURNING r.seq, r.id, r.task_id, r.sample_index, r.attempt, r.lease_expires_at, t.body`,
      [now, limit, workerId, now + leaseMs],
    );
    return rows.map((row) => ({ id: row.id, taskId: row.task_id, sampleIndex: row.sample_index, attempt: row.attempt, leaseExpiresAt: Number(row.lease_expires_at), task: row.body }));
  }

  async renewLeases(workerId: string, leases: readonly LeaseRef[], leaseMs: number): Promise<RenewOutcome> {
    checkPositiveInt('leaseMs', leaseMs);
    if (leases.length === 0) return { renewed: [], lost: [] };
    const { rows } = await this.#query<{ id: string; attempt: number }>(
      `UPDATE rollouts AS r SET lease_expires_at = $1
       FROM unnest($3::text[], $4::int[]) AS l(id, attempt)
       WHERE r.id = l.id AND r.attempt = l.attempt AND r.worker_id = $2 AND r.state = 'leased'
       RETURNING r.id, r.attempt`,
      [this.#now() + leaseMs, workerId, leases.map((l) => l.rolloutId), leases.map((l) => l.attempt)],
    );
    // by id and attempt: a lease quoted at another attempt as well is lost, not renewed
    const key = (id: string, attempt: number) => `${attempt}:${id}`;
    const renewed = new Set(rows.map((row) => key(row.id, row.attempt)));
    const outcome: RenewOutcome = { renewed: [], lost: [] };
    for (const l of leases) (renewed.has(key(l.rolloutId, l.attempt)) ? outcome.renewed : outcome.lost).push(l.rolloutId);
    return outcome;
  }

  async expireLeases(): Promise<string[]> {
    const { rows } = await this.#query<{ id: string }>(
      "UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE state = 'leased' AND lease_expires_at < $1 RETURNING id",
      [this.#now()],
    );
    return rows.map((row) => row.id);
  }

  async releaseWorker(workerId: string): Promise<string[]> {
    const { rows } = await this.#query<{ id: string }>(
      "UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE worker_id = $1 AND state = 'leased' RETURNING id",
      [workerId],
    );
    return rows.map((row) => row.id);
  }

  async releaseLeases(workerId: string, leases: readonly LeaseRef[]): Promise<string[]> {
    if (leases.length === 0) return [];
    const { rows } = await this.#query<{ id: string }>(
      `UPDATE rollouts AS r SET state = 'queued', worker_id = NULL, lease_expires_at = NULL
       FROM unnest($2::text[], $3::int[]) AS l(id, attempt)
       WHERE r.id = l.id AND r.attempt = l.attempt AND r.worker_id = $1 AND r.state = 'leased'
       RETURNING r.id`,
      [workerId, leases.map((l) => l.rolloutId), leases.map((l) => l.attempt)],
    );
    return rows.map((row) => row.id);
  }

  async commitMany(inputs: readonly CommitInput[]): Promise<CommitOutcome[]> {
    for (const input of inputs) {
      checkResult(input.result);
      for (const other of input.amend ?? []) checkResult(other);
    }
    // one rollout's commits in order (a repeat sees the first); different rollouts concurrently
    const outcomes: CommitOutcome[] = new Array(inputs.length);
    const byRollout = new Map<string, number[]>();
    inputs.forEach((input, index) => byRollout.set(input.rolloutId, [...(byRollout.get(input.rolloutId) ?? []), index]));
    await Promise.all(
      [...byRollout.values()].map(async (indexes) => {
        for (const index of indexes) outcomes[index] = await this.commit(inputs[index]!);
      }),
    );
    return outcomes;
  }

  async commit({ rolloutId, attempt, result, workerId, unheld = false, amend = [] }: CommitInput): Promise<CommitOutcome> {
    checkResult(result);
    for (const other of amend) checkResult(other);
    // The fenced update and the insert are one statement: it stores the result only if this
    // attempt is current, the rollout unfinished and leased to the committer (or queued, for the
    // service's own `unheld` commits); a concurrent twin waits on the row lock, then finds it finished.
    const finish = `WITH finished AS (
        UPDATE rollouts SET state = $3, worker_id = $4, lease_expires_at = NULL, committed_attempt = attempt
        WHERE id = $1 AND attempt = $2 AND ((state = 'leased' AND worker_id = $4) OR (state = 'queued' AND $7::boolean)) RETURNING id, task_id
      )
      INSERT INTO results (rollout_id, task_id, state, stored_at, body) SELECT id, task_id, $3, $5, $6 FROM finished RETURNING task_id`;
    const values = [rolloutId, attempt, result.state, workerId, this.#now(), JSON.stringify(encodeResult(result)), unheld];
    const classify = async (client: Client): Promise<CommitOutcome> => {
      const { rows } = await client.query<{ state: StoreRolloutState; attempt: number; committed_attempt: number | null; worker_id: string | null }>(
        'SELECT state, attempt, committed_attempt, worker_id FROM rollouts WHERE id = $1',
        [rolloutId],
      );
      const row = rows[0];
      if (!row) return { status: 'not_found' };
      if (row.committed_attempt === attempt && row.worker_id === workerId) return { status: 'duplicate' };
      return { status: 'stale', currentAttempt: row.attempt, state: row.state };
    };
    const others = amend.filter((other) => other.id !== rolloutId);
    if (others.length === 0) {
      return this.#withClient(async (client) => {
        const { rowCount } = await client.query(finish, values);
        return rowCount ? { status: 'committed' } : classify(client);
      });
    }
    return this.#transaction(async (client) => {
      const { rows } = await client.query<{ task_id: string }>(finish, values);
      if (rows.length === 0) return classify(client);
      await client.query(
        `UPDATE results AS r SET body = a.body, state = a.state FROM unnest($1::text[], $2::json[], $3::text[]) AS a(id, body, state)
         WHERE r.rollout_id = a.id AND r.task_id = $4`,
        [others.map((o) => o.id), others.map((o) => JSON.stringify(encodeResult(o))), others.map((o) => o.state), rows[0]!.task_id],
      );
      return { status: 'committed' };
    });
  }

  async getResult(rolloutId: string): Promise<RolloutResult | undefined> {
    const { rows } = await this.#query<{ body: RolloutResult }>('SELECT body FROM results WHERE rollout_id = $1', [rolloutId]);
    return rows[0] && decodeResult(rows[0].body);
  }

  async getResults(rolloutIds: readonly string[]): Promise<Map<string, RolloutResult>> {
    const found = new Map<string, RolloutResult>();
    for (let start = 0; start < rolloutIds.length; start += 500) {
      const { rows } = await this.#query<{ rollout_id: string; body: RolloutResult }>('SELECT rollout_id, body FROM results WHERE rollout_id = ANY($1::text[])', [rolloutIds.slice(start, start + 500)]);
      for (const row of rows) found.set(row.rollout_id, decodeResult(row.body));
    }
    return found;
  }

  async getRollout(rolloutId: string): Promise<StoredRollout | undefined> {
    const { rows } = await this.#query<RolloutRow>('SELECT * FROM rollouts WHERE id = $1', [rolloutId]);
    return rows[0] && toRollout(rows[0]);
  }

  #filter(query: { state?: string | readonly string[]; taskId?: string; cursor?: string | null }): { where: string; values: unknown[] } {
    const values: unknown[] = [parseCursor(query.cursor)];
    const where = ['seq > $1'];
    const states = asList(query.state);
    if (states) {
      values.push(states);
      where.push(`state = ANY($${values.length}::text[])`);
    }
    if (query.taskId !== undefined) {
      values.push(query.taskId);
      where.push(`task_id = $${values.length}`);
    }
    return { where: where.join(' AND '), values };
  }

  async listRollouts(query: ListRolloutsQuery = {}): Promise<Page<StoredRollout>> {
    const limit = pageLimit(query.limit);
    const { where, values } = this.#filter(query);
    const { rows } = await this.#query<RolloutRow>(`SELECT * FROM rollouts WHERE ${where} ORDER BY seq LIMIT ${limit}`, values);
    return { items: rows.map(toRollout), cursor: rows.length === limit ? rows.at(-1)!.seq : null };
  }

  async listResults(query: ListResultsQuery = {}): Promise<Page<RolloutResult>> {
    const limit = pageLimit(query.limit);
    const { where, values } = this.#filter(query);
    const { rows } = await this.#query<{ seq: string; body: RolloutResult }>(`SELECT seq, body FROM results WHERE ${where} ORDER BY seq LIMIT ${limit}`, values);
    return { items: rows.map((row) => decodeResult(row.body)), cursor: rows.length === limit ? rows.at(-1)!.seq : null };
  }

  async counts(): Promise<Record<StoreRolloutState, number>> {
    const { rows } = await this.#query<{ state: StoreRolloutState; n: string }>('SELECT state, count(*) AS n FROM rollouts GROUP BY state');
    const counts = emptyCounts();
    for (const row of rows) counts[row.state] = Number(row.n);
    return counts;
  }

  async prune(policy: RetentionPolicy = this.#retention): Promise<PruneOutcome> {
    if (policy.maxAgeMs === undefined && policy.keepLast === undefined) return { results: 0, tasks: 0 };
    const before = policy.maxAgeMs === undefined ? null : this.#now() - policy.maxAgeMs;
    return this.#transaction(async (client) => {
      let below: string | null = null;
      if (policy.keepLast !== undefined) {
        if (policy.keepLast <= 0) below = String(Number.MAX_SAFE_INTEGER);
        else below = (await client.query<{ seq: string }>('SELECT seq FROM results ORDER BY seq DESC LIMIT 1 OFFSET $1', [policy.keepLast - 1])).rows[0]?.seq ?? null;
      }
      const gone = await client.query<{ rollout_id: string; task_id: string }>(
        'DELETE FROM results WHERE stored_at < $1 OR seq < $2 RETURNING rollout_id, task_id',
        [before, below],
      );
      if (gone.rows.length === 0) return { results: 0, tasks: 0 };
      await client.query('DELETE FROM rollouts WHERE id = ANY($1::text[])', [gone.rows.map((row) => row.rollout_id)]);
      const tasks = await client.query('DELETE FROM tasks AS t WHERE t.id = ANY($1::text[]) AND NOT EXISTS (SELECT 1 FROM rollouts AS r WHERE r.task_id = t.id)', [
        [...new Set(gone.rows.map((row) => row.task_id))],
      ]);
      return { results: gone.rows.length, tasks: tasks.rowCount ?? 0 };
    });
  }

  async hasImport(source: string): Promise<boolean> {
    const { rows } = await this.#query('SELECT 1 FROM imports WHERE source = $1', [source]);
    return rows.length > 0;
  }

  async recordImport(source: string, tasks: readonly RolloutTask[], results: readonly RolloutResult[]) {
    const prepared = prepareTasks(tasks);
    const now = this.#now();
    const at = new Date(now).toISOString();
    const finished = results.filter((result) => (TERMINAL_STATES as readonly string[]).includes(result.state));
    return this.#transaction(async (client) => {
      const first = await client.query("INSERT INTO imports (source, imported_at, tasks, results) VALUES ($1, $2, 0, 0) ON CONFLICT DO NOTHING RETURNING source", [source, at]);
      if (first.rows.length === 0) return { imported: false, tasks: 0, results: 0 };
      const fresh = await insertNewTasks(client, prepared, at);
      await insertQueuedRollouts(client, prepared, fresh);
      const stored = await client.query(
        `WITH given AS (
           SELECT * FROM unnest($1::text[], $2::text[], $3::json[]) WITH ORDINALITY AS g(id, state, body, ord)
         ), finished AS (
           UPDATE rollouts AS r SET state = g.state, worker_id = NULL, lease_expires_at = NULL, committed_attempt = r.attempt
           FROM given AS g WHERE r.id = g.id AND r.state IN ('queued', 'leased') RETURNING r.id, r.task_id
         )
         INSERT INTO results (rollout_id, task_id, state, stored_at, body)
         SELECT g.id, f.task_id, g.state, $4, g.body FROM finished AS f JOIN given AS g ON g.id = f.id ORDER BY g.ord`,
        [finished.map((r) => r.id), finished.map((r) => r.state), finished.map((r) => JSON.stringify(encodeResult(r))), now],
      );
      const counts = { tasks: fresh.size, results: stored.rowCount ?? 0 };
      await client.query('UPDATE imports SET tasks = $2, results = $3 WHERE source = $1', [source, counts.tasks, counts.results]);
      return { imported: true, ...counts };
    });
  }

  async putNodeCredential({ nodeId, credentialHash, issuedAt }: StoredNodeCredential): Promise<void> {
    await this.#query(
      'INSERT INTO nodes (id, credential_hash, issued_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET credential_hash = excluded.credential_hash, issued_at = excluded.issued_at',
      [nodeId, credentialHash, issuedAt],
    );
  }

  async getNodeCredential(nodeId: string): Promise<StoredNodeCredential | undefined> {
    const { rows } = await this.#query<{ id: string; credential_hash: string; issued_at: string }>('SELECT * FROM nodes WHERE id = $1', [nodeId]);
    const row = rows[0];
    return row && { nodeId: row.id, credentialHash: row.credential_hash, issuedAt: Number(row.issued_at) };
  }

  async deleteNodeCredential(nodeId: string): Promise<void> {
    await this.#query('DELETE FROM nodes WHERE id = $1', [nodeId]);
  }

  async schemaVersion(): Promise<number> {
    const { rows } = await this.#query<{ version: number | null }>('SELECT max(version) AS version FROM schema_version');
    return rows[0]?.version ?? 0;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#pool.end();
  }
}
