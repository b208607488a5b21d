import type { Migration } from '../../dialect.ts';

/** Schema versions, applied in order, each in its own transaction; never edit one once released. */
export const MIGRATIONS: readonly Migration[] = [
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
  {
    // the service's own settings that outlive a restart (the weight versions and a pause for a weight update)
    version: 3,
    sql: `
      CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
      );
    `,
  },
  {
    // dynamic samplings (DAPO): the request (its whole pool) and each group started with its
    // outcome, so that a restarted service goes on with a sampling where it was
    version: 4,
    sql: `
      CREATE TABLE samplings (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        settings TEXT NOT NULL,
        pool TEXT NOT NULL,
        pool_size INTEGER NOT NULL,
        next_position INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        error TEXT,
        created_at INTEGER NOT NULL,
        ended_at INTEGER
      );
      CREATE INDEX samplings_state ON samplings (state, seq);
      CREATE TABLE sampling_groups (
        sampling_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        kept_rank INTEGER,
        PRIMARY KEY (sampling_id, task_id)
      );
      CREATE INDEX sampling_groups_outcome ON sampling_groups (outcome);
    `,
  },
];
