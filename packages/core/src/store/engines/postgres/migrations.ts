import type { Migration } from '../../dialect.ts';

/** Schema versions, applied in order, each in its own transaction; never edit one once released. */
export const MIGRATIONS: readonly Migration[] = [
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
  {
    // the service's own settings that outlive a restart (the weight versions and a pause for a weight update)
    version: 3,
    sql: `
      CREATE TABLE settings (
        key text PRIMARY KEY,
        value text NOT NULL
      );
    `,
  },
  {
    // dynamic samplings (DAPO): the request (its whole pool) and each group started with its
    // outcome, so that a restarted service goes on with a sampling where it was
    version: 4,
    sql: `
      CREATE TABLE samplings (
        seq bigserial PRIMARY KEY,
        id text NOT NULL UNIQUE,
        settings json NOT NULL,
        pool json NOT NULL,
        pool_size integer NOT NULL,
        next_position integer NOT NULL DEFAULT 0,
        state text NOT NULL,
        error text,
        created_at bigint NOT NULL,
        ended_at bigint
      );
      CREATE INDEX samplings_state ON samplings (state, seq);
      CREATE TABLE sampling_groups (
        sampling_id text NOT NULL,
        task_id text NOT NULL,
        position integer NOT NULL,
        outcome text NOT NULL,
        kept_rank integer,
        PRIMARY KEY (sampling_id, task_id)
      );
      CREATE INDEX sampling_groups_outcome ON sampling_groups (outcome);
    `,
  },
];
