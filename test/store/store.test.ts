import { mkdtemp, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describeStoreSuite, startTestPostgres, storeSuiteResult as result, storeSuiteTask as task, workspaceRoot, type TestPostgres } from '@rollserve/testing';
import { expect, it } from 'vitest';

// The store behaviour suite (@rollserve/testing's describeStoreSuite), run against the embedded store
// (a SQLite file) and a real PostgreSQL, plus what only one of them has.

const require = createRequire(join(workspaceRoot(), 'packages', 'core', 'package.json')); // the store's own drivers

let sqliteDir = '';
let files = 0;

describeStoreSuite({
  name: 'sqlite',
  connections: 'single',
  start: async () => {
    sqliteDir = await mkdtemp(join(tmpdir(), 'rollserve-store-test-'));
  },
  stop: () => rm(sqliteDir, { recursive: true, force: true }),
  newUrl: async () => `sqlite://${join(sqliteDir, `store-${files++}.db`)}`,
  exec: async (url, sql) => {
    const Database = require('better-sqlite3') as new (path: string) => { exec(sql: string): void; close(): void };
    const db = new Database(url.slice('sqlite://'.length));
    db.exec(sql);
    db.close();
  },
  extra: ({ store, open }) => {
    it('keeps everything when the file is reopened', async () => {
      await store().putTasks([task('a', 2), task('b')]);
      const [first] = await store().claim({ workerId: 'n1', limit: 1, leaseMs: 60_000 });
      await store().commit({ rolloutId: first!.id, attempt: first!.attempt, result: result(first!.id, 'a', 0), workerId: 'n1' });
      await store().claim({ workerId: 'n2', limit: 1, leaseMs: 60_000 });
      await store().close();
      const reopened = await open();
      expect(await reopened.counts()).toEqual({ queued: 1, leased: 1, done: 1, failed: 0, cancelled: 0 });
      expect(await reopened.getResult('a:0')).toEqual(result('a:0', 'a', 0));
      expect(await reopened.getRollout('a:1')).toMatchObject({ state: 'leased', workerId: 'n2', attempt: 1 });
      expect(await reopened.putTasks([task('a', 2)])).toEqual([{ taskId: 'a', rolloutIds: ['a:0', 'a:1'], existing: true }]);
      expect(await reopened.commit({ rolloutId: 'a:1', attempt: 1, result: result('a:1', 'a', 1), workerId: 'n2' })).toEqual({ status: 'committed' });
    });

    it('opens an in-memory store', async () => {
      const memory = await open('sqlite::memory:');
      await memory.putTasks([task('a')]);
      expect(await memory.counts()).toMatchObject({ queued: 1 });
    });
  },
});

let postgres: TestPostgres | undefined;

describeStoreSuite({
  name: 'postgres',
  connections: 'pooled',
  start: async () => {
    postgres = await startTestPostgres();
  },
  stop: async () => {
    await postgres?.close();
    postgres = undefined;
  },
  newUrl: () => postgres!.createDatabase(),
  exec: async (url, sql) => {
    const { Client } = require('pg') as { Client: new (options: { connectionString: string }) => { connect(): Promise<void>; query(sql: string): Promise<unknown>; end(): Promise<void> } };
    const client = new Client({ connectionString: url });
    await client.connect();
    try {
      await client.query(sql);
    } finally {
      await client.end();
    }
  },
  extra: ({ store }) => {
    it('reconnects after the database restarts mid-run, losing nothing', async () => {
      await store().putTasks(Array.from({ length: 6 }, (_, i) => task(`t${i}`)));
      const claimed = await store().claim({ workerId: 'n1', limit: 4, leaseMs: 60_000 });
      await store().commit({ rolloutId: claimed[0]!.id, attempt: 1, result: result(claimed[0]!.id, claimed[0]!.taskId), workerId: 'n1' });
      // every pooled connection is now dropped by the server
      await postgres!.restart();
      expect(await store().counts()).toEqual({ queued: 2, leased: 3, done: 1, failed: 0, cancelled: 0 });
      expect(await store().getResult(claimed[0]!.id)).toEqual(result(claimed[0]!.id, claimed[0]!.taskId));
      for (const c of claimed.slice(1)) {
        expect(await store().commit({ rolloutId: c.id, attempt: c.attempt, result: result(c.id, c.taskId), workerId: 'n1' })).toEqual({ status: 'committed' });
      }
      expect((await store().claim({ workerId: 'n2', limit: 10, leaseMs: 60_000 })).map((c) => c.id)).toEqual(['t4', 't5']);
      expect(await store().putTasks([task('t6')])).toMatchObject([{ existing: false }]);
      expect(await store().counts()).toEqual({ queued: 1, leased: 2, done: 4, failed: 0, cancelled: 0 });
    });

    it('retries through a restart that happens while operations are in flight', async () => {
      await store().putTasks(Array.from({ length: 30 }, (_, i) => task(`t${i}`)));
      const claimed = await store().claim({ workerId: 'n1', limit: 30, leaseMs: 60_000 });
      const restart = postgres!.restart();
      const outcomes = await Promise.all(claimed.map((c) => store().commit({ rolloutId: c.id, attempt: c.attempt, result: result(c.id, c.taskId), workerId: 'n1' })));
      await restart;
      // a commit whose first try went through before the connection dropped answers 'duplicate' on retry
      expect(outcomes.every((o) => o.status === 'committed' || o.status === 'duplicate')).toBe(true);
      expect(await store().counts()).toEqual({ queued: 0, leased: 0, done: 30, failed: 0, cancelled: 0 });
      expect((await store().listResults({ limit: 100 })).items).toHaveLength(30);
    });
  },
});
