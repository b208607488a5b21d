import type { RolloutResult, RolloutTask } from '../protocol/rollout.ts';
import type { SampledGroupOutcome, SamplingSettings, SamplingState } from '../protocol/sampling.ts';
import { decodeResult, encodeResult } from '../protocol/result-codec.ts';
import { asList, checkClaim, checkPositiveInt, checkResult, conflict, emptyCounts, pageLimit, parseCursor, prepareTasks, TERMINAL_STATES, type PreparedTask } from './common.ts';
import type { Connection, Dialect } from './dialect.ts';
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
  SamplingChange,
  StoredNodeCredential,
  StoredSampling,
  StoredRollout,
  StoredTask,
  StoreRolloutState,
} from './types.ts';

/** Rows per statement where a list becomes `?` placeholders (within every engine's limit on parameters). */
const CHUNK = 500;

/** Leases renewed per statement: a heartbeat's long list is renewed a chunk at a time, the event loop free between them. */
const RENEW_CHUNK = 500;

/** Integer columns: a number from SQLite, a string from PostgreSQL's bigint. */
interface RolloutRow {
  seq: number | string;
  id: string;
  task_id: string;
  sample_index: number;
  state: StoreRolloutState;
  attempt: number;
  worker_id: string | null;
  lease_expires_at: number | string | null;
  committed_attempt: number | null;
}

interface SamplingRow {
  id: string;
  settings: unknown;
  pool: unknown;
  pool_size: number;
  next_position: number;
  state: SamplingState;
  error: string | null;
  created_at: number | string;
  ended_at: number | string | null;
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

const marks = (n: number, mark = '?') => Array.from({ length: n }, () => mark).join(', ');

function chunks<T>(items: readonly T[], size = CHUNK): T[][] {
  const out: T[][] = [];
  for (let start = 0; start < items.length; start += size) out.push(items.slice(start, start + size));
  return out;
}

/** A fence on leases: the rollout at that attempt (several in one statement). */
const leaseMatch = (leases: readonly LeaseRef[]) => ({
  sql: `(${leases.map(() => '(id = ? AND attempt = ?)').join(' OR ')})`,
  params: leases.flatMap((l) => [l.rolloutId, l.attempt]),
});

/** The WHERE clause of a listing (after the cursor, by state and task) and its parameters. */
function filter(query: ListRolloutsQuery | ListResultsQuery): { where: string; params: unknown[] } {
  const where = ['seq > ?'];
  const params: unknown[] = [parseCursor(query.cursor)];
  const states = asList(query.state);
  if (states) {
    where.push(`state IN (${marks(states.length)})`);
    params.push(...states);
  }
  if (query.taskId !== undefined) {
    where.push('task_id = ?');
    params.push(query.taskId);
  }
  return { where: where.join(' AND '), params };
}

/**
 * The store, written once over a dialect (./dialects): SQLite embedded, PostgreSQL shared. Every
 * write that must be whole is one transaction; commits are fenced by attempt and holder in the
 * statement that finishes the rollout, so a stale or foreign commit stores nothing.
 */
export class SqlStore implements RolloutStore {
  readonly kind: string;
  readonly #dialect: Dialect;
  readonly #now: () => number;
  readonly #retention: RetentionPolicy;

  private constructor(dialect: Dialect, options: OpenStoreOptions) {
    this.kind = dialect.kind;
    this.#dialect = dialect;
    this.#now = options.now ?? Date.now;
    this.#retention = options.retention ?? {};
  }

  /** The store over `dialect`, its migrations applied. */
  static async open(dialect: Dialect, options: OpenStoreOptions = {}): Promise<SqlStore> {
    await dialect.migrate();
    return new SqlStore(dialect, options);
  }

  async putTasks(tasks: readonly RolloutTask[]): Promise<PutTaskOutcome[]> {
    const prepared = prepareTasks(tasks);
    return this.#dialect.transaction((c) => this.#putIn(c, tasks, prepared));
  }

  async putTasksAndClaim(tasks: readonly RolloutTask[], claim: ClaimOptions): Promise<{ outcomes: PutTaskOutcome[]; claimed: ClaimedRollout[] }> {
    checkClaim(claim);
    const prepared = prepareTasks(tasks);
    return this.#dialect.transaction(async (c) => ({ outcomes: await this.#putIn(c, tasks, prepared), claimed: await this.#claimIn(c, claim) }));
  }

  /** putTasks inside the caller's transaction. */
  async #putIn(c: Connection, tasks: readonly RolloutTask[], prepared: readonly PreparedTask[]): Promise<PutTaskOutcome[]> {
    const fresh = await this.#insertNewTasks(c, prepared);
    const outcomes = new Map<string, PutTaskOutcome>();
    for (const known of chunks(prepared.filter((t) => !fresh.has(t.id)))) {
      const rows = await c.all<{ id: string; fingerprint: string; rollout_ids: unknown }>(`SELECT id, fingerprint, rollout_ids FROM tasks WHERE id IN (${marks(known.length)})`, known.map((t) => t.id));
      const byId = new Map(rows.map((row) => [row.id, row]));
      for (const task of known) {
        const row = byId.get(task.id)!;
        if (row.fingerprint !== task.fingerprint) throw conflict(`task id "${task.id}" was already submitted with a different body`);
        outcomes.set(task.id, { taskId: task.id, rolloutIds: this.#dialect.json<string[]>(row.rollout_ids), existing: true });
      }
    }
    await this.#insertQueuedRollouts(c, prepared, fresh);
    for (const task of prepared) if (fresh.has(task.id)) outcomes.set(task.id, { taskId: task.id, rolloutIds: task.rolloutIds, existing: false });
    return tasks.map((task) => outcomes.get(task.id!)!);
  }

  /** Inserts the tasks not stored yet (a known id is left as it is); answers the ids inserted. */
  async #insertNewTasks(c: Connection, prepared: readonly PreparedTask[]): Promise<Set<string>> {
    const at = new Date(this.#now()).toISOString();
    const fresh = new Set<string>();
    for (const chunk of chunks(prepared, 200)) {
      const rows = await c.all<{ id: string }>(
        `INSERT INTO tasks (id, fingerprint, body, rollout_ids, created_at) VALUES ${marks(chunk.length, '(?, ?, ?, ?, ?)')} ON CONFLICT (id) DO NOTHING RETURNING id`,
        chunk.flatMap((t) => [t.id, t.fingerprint, t.body, JSON.stringify(t.rolloutIds), at]),
      );
      for (const row of rows) fresh.add(row.id);
    }
    return fresh;
  }

  /** The rollouts of the `fresh` tasks, queued in submission order; a rollout id another task has is a conflict. */
  async #insertQueuedRollouts(c: Connection, prepared: readonly PreparedTask[], fresh: ReadonlySet<string>): Promise<void> {
    const rollouts = prepared.filter((t) => fresh.has(t.id)).flatMap((t) => t.rolloutIds.map((id, k) => [id, t.id, k] as const));
    for (const chunk of chunks(rollouts, 300)) {
      try {
        await c.run(`INSERT INTO rollouts (id, task_id, sample_index, state) VALUES ${marks(chunk.length, "(?, ?, ?, 'queued')")}`, chunk.flat());
      } catch (error) {
        if (this.#dialect.isUniqueViolation(error)) throw conflict(`a rollout id of this batch is already another task's rollout (${(error as Error).message})`, error);
        throw error;
      }
    }
  }

  async getTask(taskId: string): Promise<StoredTask | undefined> {
    const [row] = await this.#dialect.connection((c) =>
      c.all<{ id: string; body: unknown; rollout_ids: unknown; created_at: string }>('SELECT id, body, rollout_ids, created_at FROM tasks WHERE id = ?', [taskId]),
    );
    return row && { id: row.id, task: this.#dialect.json<RolloutTask>(row.body), rolloutIds: this.#dialect.json<string[]>(row.rollout_ids), createdAt: row.created_at };
  }

  async claim(options: ClaimOptions): Promise<ClaimedRollout[]> {
    checkClaim(options);
    return this.#dialect.transaction((c) => this.#claimIn(c, options));
  }

  /**
   * claim inside the caller's transaction: expired leases first, then queued rollouts, oldest
   * first; where rows can be locked, rows another claimer holds are skipped, not waited for.
   */
  async #claimIn(c: Connection, { workerId, limit, leaseMs }: ClaimOptions): Promise<ClaimedRollout[]> {
    const now = this.#now();
    const { skipLocked } = this.#dialect;
    const seqs = (await c.all<{ seq: number | string }>(`SELECT seq FROM rollouts WHERE state = 'leased' AND lease_expires_at < ? ORDER BY seq LIMIT ?${skipLocked}`, [now, limit])).map((row) => Number(row.seq));
    if (seqs.length < limit) {
      const queued = await c.all<{ seq: number | string }>(`SELECT seq FROM rollouts WHERE state = 'queued' ORDER BY seq LIMIT ?${skipLocked}`, [limit - seqs.length]);
      seqs.push(...queued.map((row) => Number(row.seq)));
    }
    if (seqs.length === 0) return [];
    const leased = new Map<number, RolloutRow>();
    for (const chunk of chunks(seqs)) {
      const rows = await c.all<RolloutRow>(
        `UPDATE rollouts SET state = 'leased', attempt = attempt + 1, worker_id = ?, lease_expires_at = ? WHERE seq IN (${marks(chunk.length)}) RETURNING *`,
        [workerId, now + leaseMs, ...chunk],
      );
      for (const row of rows) leased.set(Number(row.seq), row);
    }
    const tasks = new Map<string, RolloutTask>();
    for (const chunk of chunks([...new Set([...leased.values()].map((row) => row.task_id))])) {
      const rows = await c.all<{ id: string; body: unknown }>(`SELECT id, body FROM tasks WHERE id IN (${marks(chunk.length)})`, chunk);
      for (const row of rows) tasks.set(row.id, this.#dialect.json<RolloutTask>(row.body));
    }
    return seqs.map((seq) => {
      const row = leased.get(seq)!;
      return { id: row.id, taskId: row.task_id, sampleIndex: row.sample_index, attempt: row.attempt, leaseExpiresAt: Number(row.lease_expires_at), task: tasks.get(row.task_id)! };
    });
  }

  async renewLeases(workerId: string, leases: readonly LeaseRef[], leaseMs: number): Promise<RenewOutcome> {
    checkPositiveInt('leaseMs', leaseMs);
    const until = this.#now() + leaseMs;
    // by id and attempt: a lease quoted at another attempt as well is lost, not renewed
    const key = (id: string, attempt: number) => `${attempt}:${id}`;
    const renewed = new Set<string>();
    for (const [i, chunk] of chunks(leases, RENEW_CHUNK).entries()) {
      // other requests get their turn between chunks (a synchronous driver holds the event loop)
      if (i > 0) await new Promise((resolve) => setImmediate(resolve));
      const match = leaseMatch(chunk);
      const rows = await this.#dialect.connection((c) =>
        c.all<{ id: string; attempt: number }>(`UPDATE rollouts SET lease_expires_at = ? WHERE worker_id = ? AND state = 'leased' AND ${match.sql} RETURNING id, attempt`, [until, workerId, ...match.params]),
      );
      for (const row of rows) renewed.add(key(row.id, row.attempt));
    }
    const outcome: RenewOutcome = { renewed: [], lost: [] };
    for (const l of leases) (renewed.has(key(l.rolloutId, l.attempt)) ? outcome.renewed : outcome.lost).push(l.rolloutId);
    return outcome;
  }

  async expireLeases(): Promise<string[]> {
    const rows = await this.#dialect.connection((c) =>
      c.all<{ id: string }>("UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE state = 'leased' AND lease_expires_at < ? RETURNING id", [this.#now()]),
    );
    return rows.map((row) => row.id);
  }

  async releaseWorker(workerId: string): Promise<string[]> {
    const rows = await this.#dialect.connection((c) =>
      c.all<{ id: string }>("UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE worker_id = ? AND state = 'leased' RETURNING id", [workerId]),
    );
    return rows.map((row) => row.id);
  }

  async releaseLeases(workerId: string, leases: readonly LeaseRef[]): Promise<string[]> {
    if (leases.length === 0) return [];
    return this.#dialect.transaction(async (c) => {
      const released: string[] = [];
      for (const chunk of chunks(leases)) {
        const match = leaseMatch(chunk);
        const rows = await c.all<{ id: string }>(
          `UPDATE rollouts SET state = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE worker_id = ? AND state = 'leased' AND ${match.sql} RETURNING id`,
          [workerId, ...match.params],
        );
        released.push(...rows.map((row) => row.id));
      }
      return released;
    });
  }

  async commit(input: CommitInput): Promise<CommitOutcome> {
    checkResult(input.result);
    for (const other of input.amend ?? []) checkResult(other);
    return this.#dialect.transaction((c) => this.#commitIn(c, input));
  }

  async commitMany(inputs: readonly CommitInput[]): Promise<CommitOutcome[]> {
    for (const input of inputs) {
      checkResult(input.result);
      for (const other of input.amend ?? []) checkResult(other);
    }
    // one writer: the batch is one transaction (one sync of the file for all)
    if (this.#dialect.writers === 'one') return this.#dialect.transaction(async (c) => {
      const outcomes: CommitOutcome[] = [];
      for (const input of inputs) outcomes.push(await this.#commitIn(c, input));
      return outcomes;
    });
    // many: one rollout's commits in order (a repeat sees the first); different rollouts concurrently
    const outcomes: CommitOutcome[] = new Array(inputs.length);
    const byRollout = new Map<string, number[]>();
    inputs.forEach((input, index) => byRollout.set(input.rolloutId, [...(byRollout.get(input.rolloutId) ?? []), index]));
    await Promise.all(
      [...byRollout.values()].map(async (indexes) => {
        for (const index of indexes) outcomes[index] = await this.#dialect.transaction((c) => this.#commitIn(c, inputs[index]!));
      }),
    );
    return outcomes;
  }

  /**
   * One commit, inside the caller's transaction. The fence and the holder are one statement: it
   * finishes the rollout only if this attempt is current, unfinished and leased to the committer
   * (or queued, for the service's own `unheld` commits); a concurrent twin waits on the row, then
   * finds it finished.
   */
  async #commitIn(c: Connection, { rolloutId, attempt, result, workerId, unheld = false, amend = [] }: CommitInput): Promise<CommitOutcome> {
    const [finished] = await c.all<{ task_id: string }>(
      "UPDATE rollouts SET state = ?, worker_id = ?, lease_expires_at = NULL, committed_attempt = attempt WHERE id = ? AND attempt = ? AND ((state = 'leased' AND worker_id = ?) OR (state = 'queued' AND ? = 1)) RETURNING task_id",
      [result.state, workerId, rolloutId, attempt, workerId, unheld ? 1 : 0],
    );
    if (!finished) {
      const [row] = await c.all<RolloutRow>('SELECT * FROM rollouts WHERE id = ?', [rolloutId]);
      if (!row) return { status: 'not_found' };
      if (row.committed_attempt === attempt && row.worker_id === workerId) return { status: 'duplicate' };
      return { status: 'stale', currentAttempt: row.attempt, state: row.state };
    }
    await c.run('INSERT INTO results (rollout_id, task_id, state, stored_at, body) VALUES (?, ?, ?, ?, ?)', [rolloutId, finished.task_id, result.state, this.#now(), JSON.stringify(encodeResult(result))]);
    for (const other of amend) {
      if (other.id !== rolloutId) await c.run('UPDATE results SET body = ?, state = ? WHERE rollout_id = ? AND task_id = ?', [JSON.stringify(encodeResult(other)), other.state, other.id, finished.task_id]);
    }
    return { status: 'committed' };
  }

  async getResult(rolloutId: string): Promise<RolloutResult | undefined> {
    const [row] = await this.#dialect.connection((c) => c.all<{ body: unknown }>('SELECT body FROM results WHERE rollout_id = ?', [rolloutId]));
    return row && decodeResult(this.#dialect.json(row.body));
  }

  async getResults(rolloutIds: readonly string[]): Promise<Map<string, RolloutResult>> {
    const found = new Map<string, RolloutResult>();
    for (const chunk of chunks(rolloutIds)) {
      const rows = await this.#dialect.connection((c) => c.all<{ rollout_id: string; body: unknown }>(`SELECT rollout_id, body FROM results WHERE rollout_id IN (${marks(chunk.length)})`, chunk));
      for (const row of rows) found.set(row.rollout_id, decodeResult(this.#dialect.json(row.body)));
    }
    return found;
  }

  async getRollout(rolloutId: string): Promise<StoredRollout | undefined> {
    const [row] = await this.#dialect.connection((c) => c.all<RolloutRow>('SELECT * FROM rollouts WHERE id = ?', [rolloutId]));
    return row && toRollout(row);
  }

  async listRollouts(query: ListRolloutsQuery = {}): Promise<Page<StoredRollout>> {
    const limit = pageLimit(query.limit);
    const { where, params } = filter(query);
    const rows = await this.#dialect.connection((c) => c.all<RolloutRow>(`SELECT * FROM rollouts WHERE ${where} ORDER BY seq LIMIT ?`, [...params, limit]));
    return { items: rows.map(toRollout), cursor: rows.length === limit ? String(rows.at(-1)!.seq) : null };
  }

  async listResults(query: ListResultsQuery = {}): Promise<Page<RolloutResult>> {
    const limit = pageLimit(query.limit);
    const { where, params } = filter(query);
    const rows = await this.#dialect.connection((c) => c.all<{ seq: number | string; body: unknown }>(`SELECT seq, body FROM results WHERE ${where} ORDER BY seq LIMIT ?`, [...params, limit]));
    return { items: rows.map((row) => decodeResult(this.#dialect.json(row.body))), cursor: rows.length === limit ? String(rows.at(-1)!.seq) : null };
  }

  async counts(): Promise<Record<StoreRolloutState, number>> {
    const rows = await this.#dialect.connection((c) => c.all<{ state: StoreRolloutState; n: number | string }>('SELECT state, count(*) AS n FROM rollouts GROUP BY state'));
    const counts = emptyCounts();
    for (const { state, n } of rows) counts[state] = Number(n);
    return counts;
  }

  async prune(policy: RetentionPolicy = this.#retention): Promise<PruneOutcome> {
    if (policy.maxAgeMs === undefined && policy.keepLast === undefined) return { results: 0, tasks: 0 };
    const before = policy.maxAgeMs === undefined ? undefined : this.#now() - policy.maxAgeMs;
    return this.#dialect.transaction(async (c): Promise<PruneOutcome> => {
      const where: string[] = [];
      const params: number[] = [];
      if (before !== undefined) {
        where.push('stored_at < ?');
        params.push(before);
      }
      if (policy.keepLast !== undefined) {
        const [nth] = policy.keepLast > 0 ? await c.all<{ seq: number | string }>('SELECT seq FROM results ORDER BY seq DESC LIMIT 1 OFFSET ?', [policy.keepLast - 1]) : [{ seq: Number.MAX_SAFE_INTEGER }];
        if (nth) {
          where.push('seq < ?');
          params.push(Number(nth.seq));
        }
      }
      if (where.length === 0) return { results: 0, tasks: 0 };
      const gone = await c.all<{ rollout_id: string; task_id: string }>(`DELETE FROM results WHERE ${where.join(' OR ')} RETURNING rollout_id, task_id`, params);
      for (const chunk of chunks(gone.map((row) => row.rollout_id))) await c.run(`DELETE FROM rollouts WHERE id IN (${marks(chunk.length)})`, chunk);
      let tasks = 0;
      for (const chunk of chunks([...new Set(gone.map((row) => row.task_id))])) {
        tasks += await c.run(`DELETE FROM tasks WHERE id IN (${marks(chunk.length)}) AND NOT EXISTS (SELECT 1 FROM rollouts WHERE rollouts.task_id = tasks.id)`, chunk);
      }
      return { results: gone.length, tasks };
    });
  }

  async hasImport(source: string): Promise<boolean> {
    const rows = await this.#dialect.connection((c) => c.all('SELECT 1 FROM imports WHERE source = ?', [source]));
    return rows.length > 0;
  }

  async recordImport(source: string, tasks: readonly RolloutTask[], results: readonly RolloutResult[]) {
    const prepared = prepareTasks(tasks);
    const now = this.#now();
    const at = new Date(now).toISOString();
    return this.#dialect.transaction(async (c) => {
      const first = await c.all('INSERT INTO imports (source, imported_at, tasks, results) VALUES (?, ?, 0, 0) ON CONFLICT DO NOTHING RETURNING source', [source, at]);
      if (first.length === 0) return { imported: false, tasks: 0, results: 0 };
      const fresh = await this.#insertNewTasks(c, prepared);
      await this.#insertQueuedRollouts(c, prepared, fresh);
      let stored = 0;
      for (const result of results) {
        if (!(TERMINAL_STATES as readonly string[]).includes(result.state)) continue;
        const [finished] = await c.all<{ task_id: string }>(
          "UPDATE rollouts SET state = ?, worker_id = NULL, lease_expires_at = NULL, committed_attempt = attempt WHERE id = ? AND state IN ('queued', 'leased') RETURNING task_id",
          [result.state, result.id],
        );
        if (!finished) continue;
        await c.run('INSERT INTO results (rollout_id, task_id, state, stored_at, body) VALUES (?, ?, ?, ?, ?)', [result.id, finished.task_id, result.state, now, JSON.stringify(encodeResult(result))]);
        stored++;
      }
      await c.run('UPDATE imports SET tasks = ?, results = ? WHERE source = ?', [fresh.size, stored, source]);
      return { imported: true, tasks: fresh.size, results: stored };
    });
  }

  async putNodeCredential({ nodeId, credentialHash, issuedAt }: StoredNodeCredential): Promise<void> {
    await this.#dialect.connection((c) =>
      c.run(
        'INSERT INTO nodes (id, credential_hash, issued_at) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET credential_hash = excluded.credential_hash, issued_at = excluded.issued_at',
        [nodeId, credentialHash, issuedAt],
      ),
    );
  }

  async getNodeCredential(nodeId: string): Promise<StoredNodeCredential | undefined> {
    const [row] = await this.#dialect.connection((c) => c.all<{ id: string; credential_hash: string; issued_at: number | string }>('SELECT * FROM nodes WHERE id = ?', [nodeId]));
    return row && { nodeId: row.id, credentialHash: row.credential_hash, issuedAt: Number(row.issued_at) };
  }

  async deleteNodeCredential(nodeId: string): Promise<void> {
    await this.#dialect.connection((c) => c.run('DELETE FROM nodes WHERE id = ?', [nodeId]));
  }

  async getSetting(key: string): Promise<unknown> {
    const [row] = await this.#dialect.connection((c) => c.all<{ value: string }>('SELECT value FROM settings WHERE key = ?', [key]));
    return row === undefined ? undefined : (JSON.parse(row.value) as unknown);
  }

  async putSetting(key: string, value: unknown): Promise<void> {
    await this.#dialect.connection((c) =>
      c.run('INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value', [key, JSON.stringify(value)]),
    );
  }

  async putSampling({ id, settings, pool }: { id: string; settings: SamplingSettings; pool: readonly RolloutTask[] }): Promise<boolean> {
    const rows = await this.#dialect.connection((c) =>
      c.all(
        "INSERT INTO samplings (id, settings, pool, pool_size, state, created_at) VALUES (?, ?, ?, ?, 'running', ?) ON CONFLICT (id) DO NOTHING RETURNING id",
        [id, JSON.stringify(settings), JSON.stringify(pool), pool.length, this.#now()],
      ),
    );
    return rows.length > 0;
  }

  async getSampling(id: string): Promise<StoredSampling | undefined> {
    const [sampling] = await this.#samplings('id = ?', [id]);
    return sampling;
  }

  runningSamplings(): Promise<StoredSampling[]> {
    return this.#samplings("state = 'running'", []);
  }

  /** Samplings matching `where`, oldest first, with their groups (one read, so a sampling and its groups agree). */
  #samplings(where: string, params: unknown[]): Promise<StoredSampling[]> {
    return this.#dialect.transaction(async (c) => {
      const rows = await c.all<SamplingRow>(`SELECT * FROM samplings WHERE ${where} ORDER BY seq`, params);
      const groups = new Map<string, StoredSampling['groups']>(rows.map((row) => [row.id, []]));
      for (const chunk of chunks(rows.map((row) => row.id))) {
        const found = await c.all<{ sampling_id: string; task_id: string; position: number; outcome: SampledGroupOutcome; kept_rank: number | null }>(
          `SELECT * FROM sampling_groups WHERE sampling_id IN (${marks(chunk.length)}) ORDER BY position`,
          chunk,
        );
        for (const row of found) groups.get(row.sampling_id)!.push({ taskId: row.task_id, position: row.position, outcome: row.outcome, kept: row.kept_rank });
      }
      return rows.map((row) => ({
        id: row.id,
        settings: this.#dialect.json<SamplingSettings>(row.settings),
        pool: this.#dialect.json<RolloutTask[]>(row.pool),
        poolSize: row.pool_size,
        next: row.next_position,
        state: row.state,
        error: row.error,
        groups: groups.get(row.id)!,
        createdAt: Number(row.created_at),
        endedAt: row.ended_at === null ? null : Number(row.ended_at),
      }));
    });
  }

  async updateSampling(id: string, { started = [], next, outcomes = [], unstarted = [], end }: SamplingChange): Promise<void> {
    await this.#dialect.transaction(async (c) => {
      for (const chunk of chunks(started, 200)) {
        await c.run(
          `INSERT INTO sampling_groups (sampling_id, task_id, position, outcome) VALUES ${marks(chunk.length, "(?, ?, ?, 'running')")} ON CONFLICT (sampling_id, task_id) DO NOTHING`,
          chunk.flatMap((group) => [id, group.taskId, group.position]),
        );
      }
      for (const { taskId, outcome, kept } of outcomes) {
        await c.run('UPDATE sampling_groups SET outcome = ?, kept_rank = ? WHERE sampling_id = ? AND task_id = ?', [outcome, kept ?? null, id, taskId]);
      }
      for (const chunk of chunks(unstarted)) await c.run(`DELETE FROM sampling_groups WHERE sampling_id = ? AND task_id IN (${marks(chunk.length)})`, [id, ...chunk]);
      if (next !== undefined) await c.run('UPDATE samplings SET next_position = ? WHERE id = ?', [next, id]);
      if (end) await c.run("UPDATE samplings SET state = ?, error = ?, pool = '[]', ended_at = ? WHERE id = ?", [end.state, end.error, this.#now(), id]);
    });
  }

  async deleteSampling(id: string): Promise<void> {
    await this.#dialect.transaction(async (c) => {
      await c.run('DELETE FROM sampling_groups WHERE sampling_id = ?', [id]);
      await c.run('DELETE FROM samplings WHERE id = ?', [id]);
    });
  }

  async unfinishedCancelledSamples(): Promise<string[]> {
    const rows = await this.#dialect.connection((c) =>
      c.all<{ id: string }>(
        "SELECT r.id FROM sampling_groups g JOIN samplings s ON s.id = g.sampling_id JOIN rollouts r ON r.task_id = g.task_id WHERE g.outcome = 'cancelled' AND s.state <> 'running' AND r.state IN ('queued', 'leased') ORDER BY r.seq",
      ),
    );
    return [...new Set(rows.map((row) => row.id))];
  }

  async pruneSamplings(keepEnded: number): Promise<number> {
    checkPositiveInt('keepEnded', keepEnded);
    return this.#dialect.transaction(async (c) => {
      const gone = await c.all<{ id: string }>(
        "DELETE FROM samplings WHERE state <> 'running' AND seq NOT IN (SELECT seq FROM samplings WHERE state <> 'running' ORDER BY ended_at DESC, seq DESC LIMIT ?) RETURNING id",
        [keepEnded],
      );
      for (const chunk of chunks(gone.map((row) => row.id))) await c.run(`DELETE FROM sampling_groups WHERE sampling_id IN (${marks(chunk.length)})`, chunk);
      return gone.length;
    });
  }

  async schemaVersion(): Promise<number> {
    const [row] = await this.#dialect.connection((c) => c.all<{ version: number | null }>('SELECT max(version) AS version FROM schema_version'));
    return row?.version ?? 0;
  }

  close(): Promise<void> {
    return this.#dialect.close();
  }
}
