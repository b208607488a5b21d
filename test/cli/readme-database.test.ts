import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { startTestPostgres, workspaceRoot, type TestPostgres } from '@rollserve/testing';
import { request } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';

// README "HPC: Slurm and Apptainer": the commands that make the service's PostgreSQL database, run
// as written against a throwaway cluster (`sudo -u postgres` becomes the cluster's superuser: as
// root `runuser -u postgres --`, which is what sudo does here; otherwise the cluster is the test's
// own user's), then `rollserve start --store postgres://rollserve:…` as written: the service, as
// the role the README made (not a superuser), creates and migrates its tables in that database.

const exec = promisify(execFile);
const ROOT = workspaceRoot();
const ROLLSERVE = join(ROOT, 'packages', 'cli', 'bin', 'rollserve.js');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');

/** The README's inline command that creates the database, and the `rollserve start` line after it. */
function readmeCommands(): { create: string; start: string } {
  const create = [...README.matchAll(/`([^`]*createdb --owner[^`]*)`/g)].map((m) => m[1]!);
  const start = [...README.matchAll(/`(rollserve start --store postgres:\/\/[^`]*<password>[^`]*)`/g)].map((m) => m[1]!);
  expect(create, 'the README says once how to create the database').toHaveLength(1);
  expect(start, 'and once how to start the service on it').toHaveLength(1);
  return { create: create[0]!, start: start[0]! };
}

let pg: TestPostgres | undefined;
afterAll(async () => {
  await pg?.close();
});

describe('README: the service\'s PostgreSQL database', () => {
  it('is created by the README\'s commands, and `rollserve start --store` as written migrates it as its owner', { timeout: 180_000 }, async () => {
    const { create, start } = readmeCommands();
    expect(create).not.toMatch(/--pwprompt|--interactive/); // a command that asks can not be run from a script (or this test)
    pg = await startTestPostgres();
    const password = randomBytes(9).toString('hex');
    const asSuperuser = process.getuid?.() === 0 ? 'runuser -u postgres -- ' : '';
    const script = create.replaceAll('<password>', password).replaceAll('sudo -u postgres ', asSuperuser);
    const env = { ...process.env, PGHOST: pg.socketDir, PGPORT: String(pg.port), PGUSER: 'postgres' };
    await exec('bash', ['-euc', script], { env });

    const url = start
      .replace(/^rollserve start --store /, '')
      .replaceAll('<password>', password)
      .replaceAll('<db host>', '127.0.0.1')
      .replace(':5432/', `:${pg.port}/`);
    const child = spawn(process.execPath, [ROLLSERVE, 'start', '--port', '0', '--store', url], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' },
    });
    let output = '';
    child.stdout!.on('data', (c: Buffer) => (output += c));
    child.stderr!.on('data', (c: Buffer) => (output += c));
    try {
      while (!/^rollouts?\s+http/m.test(output)) {
        if (child.exitCode !== null) throw new Error(`rollserve start exited: ${output}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const service = /^rollouts?\s+(http:\/\/127\.0\.0\.1:\d+)/m.exec(output)![1]!;
      const listed = await request(`${service}/v1/rollouts`);
      expect(listed.statusCode).toBe(200);
      await listed.body.dump();
      // its tables, made by the role the README created (the database's owner), not by a superuser
      const { stdout } = await exec('psql', ['-At', '-d', 'rollserve', '-c', "select distinct tableowner from pg_tables where schemaname = 'public'"], { env });
      expect(stdout.trim().split('\n')).toEqual(['rollserve']);
      const role = await exec('psql', ['-At', '-d', 'rollserve', '-c', "select rolsuper from pg_roles where rolname = 'rollserve'"], { env });
      expect(role.stdout.trim()).toBe('f');
    } finally {
      child.kill('SIGINT');
      if (child.exitCode === null) await once(child, 'exit');
    }
  });
});
