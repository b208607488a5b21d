import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { chown, mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const exec = promisify(execFile);

export interface TestPostgres {
  /** `postgres://postgres@127.0.0.1:<port>/postgres` (trust auth: no password). */
  url: string;
  port: number;
  /** The directory holding the cluster's Unix socket (`?host=<socketDir>` in a URL). */
  socketDir: string;
  /** The cluster's data directory (its size on disk, say). */
  dataDir: string;
  /** A new empty database on this cluster; its URL. */
  createDatabase(name?: string): Promise<string>;
  /** `pg_ctl restart -m fast`: every connection is dropped, the server comes back on the same port. */
  restart(): Promise<void>;
  /** Stops the server and removes its files. */
  close(): Promise<void>;
}

export interface TestPostgresOptions {
  /** Sync writes to disk as a production server does (default false: a throwaway cluster for tests). */
  fsync?: boolean;
}

const INSTALL_HINT = 'install PostgreSQL (Debian/Ubuntu: apt-get install postgresql; it provides initdb and pg_ctl under /usr/lib/postgresql/<version>/bin and the postgres user)';

/** The newest /usr/lib/postgresql/<version>/bin with initdb, or ROLLSERVE_PG_BIN. */
function findBinDir(): string {
  const given = process.env.ROLLSERVE_PG_BIN;
  if (given) return given;
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).filter((v) => existsSync(join(root, v, 'bin', 'initdb'))) : [];
  versions.sort((a, b) => Number(b) - Number(a));
  if (versions[0] === undefined) throw new Error(`no PostgreSQL server binaries (initdb) under ${root}: ${INSTALL_HINT}`);
  return join(root, versions[0], 'bin');
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/**
 * Starts a throwaway PostgreSQL cluster in a temp dir, listening on 127.0.0.1 on a free port and
 * on a Unix socket in that dir. PostgreSQL refuses to run as root, so as root the server and its
 * tools run as the `postgres` user (through `runuser`, util-linux) on a dir chowned to it.
 *
 * @example
 * const pg = await startTestPostgres();
 * const store = await openStore(await pg.createDatabase());
 * // …
 * await store.close();
 * await pg.close();
 */
export async function startTestPostgres(options: TestPostgresOptions = {}): Promise<TestPostgres> {
  const bin = findBinDir();
  const asRoot = process.getuid?.() === 0;
  let owner: { uid: number; gid: number } | undefined;
  if (asRoot) {
    const runuser = ['/usr/sbin/runuser', '/sbin/runuser', '/usr/bin/runuser'].find((path) => existsSync(path));
    if (!runuser) throw new Error('running as root, the test PostgreSQL needs runuser (Debian: util-linux) to start the server as the postgres user');
    try {
      const uid = Number((await exec('id', ['-u', 'postgres'])).stdout.trim());
      const gid = Number((await exec('id', ['-g', 'postgres'])).stdout.trim());
      owner = { uid, gid };
    } catch {
      throw new Error(`running as root, the test PostgreSQL needs the postgres user: ${INSTALL_HINT}`);
    }
  }
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-pg-'));
  const dataDir = join(dir, 'data');
  const logFile = join(dir, 'server.log');
  const run = async (tool: string, args: string[]) => {
    const [file, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', join(bin, tool), ...args]] : [join(bin, tool), args];
    try {
      return await exec(file as string, argv as string[], { cwd: dir });
    } catch (error) {
      const { stderr = '', stdout = '' } = error as { stderr?: string; stdout?: string };
      const log = await readFile(logFile, 'utf8').catch(() => '');
      throw new Error(`${tool} ${args.join(' ')} failed: ${stderr || stdout}${log ? `\nserver log:\n${log.slice(-2_000)}` : ''}`, { cause: error });
    }
  };
  let started = false;
  const stop = async () => {
    if (started) await run('pg_ctl', ['stop', '-D', dataDir, '-m', 'fast', '-w', '-t', '60']).catch(() => {});
    started = false;
    await rm(dir, { recursive: true, force: true });
  };
  try {
    if (owner) await chown(dir, owner.uid, owner.gid);
    await run('initdb', ['-D', dataDir, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--no-sync']);
    const port = await freePort();
    const settings = [`-p ${port}`, `-k ${dir}`, '-c listen_addresses=127.0.0.1', '-c max_connections=200'];
    if (!options.fsync) settings.push('-c fsync=off', '-c synchronous_commit=off', '-c full_page_writes=off');
    started = true;
    await run('pg_ctl', ['start', '-D', dataDir, '-w', '-t', '60', '-l', logFile, '-o', settings.join(' ')]);
    return {
      url: `postgres://postgres@127.0.0.1:${port}/postgres`,
      port,
      socketDir: dir,
      dataDir,
      async createDatabase(name = `t_${randomBytes(6).toString('hex')}`) {
        await run('createdb', ['-h', dir, '-p', String(port), '-U', 'postgres', name]);
        return `postgres://postgres@127.0.0.1:${port}/${name}`;
      },
      async restart() {
        await run('pg_ctl', ['restart', '-D', dataDir, '-m', 'fast', '-w', '-t', '60', '-l', logFile]);
      },
      close: stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
