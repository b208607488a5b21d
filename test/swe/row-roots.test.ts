import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import swe from '@rollserve/env-swe';
import { createBwrapProvider, registerSandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse, startFakePolicy, workspaceRoot, type FakePolicy } from '@rollserve/testing';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildSweFixtures, type SweFixture } from './fixtures.ts';

// Dataset rows are untrusted: every host path, bind and image a SWE row names must lie under a
// root the operator configured (repos_root, images_root, binds_root; defaults under the data
// dir), checked when the row is accepted (422 naming the field, on the NeMo Gym face and on the
// rollout API) and again at use; git reads a row's repository with no more privilege than a
// sandbox. Hostile rows, through `rollserve start` (as root and as an unprivileged service user)
// and the NeMo Gym face's /seed_session.

const isRoot = process.getuid?.() === 0;
const built = buildSweFixtures();
const [calc] = built.fixtures as [SweFixture];

/** The host: a directory the rows try to reach, with a secret, a socket and a writable directory. */
const host = mkdtempSync(join(tmpdir(), 'rollserve-swe-host-'));
chmodSync(host, 0o755);
const SECRET = 'host secret 7c2f9a';
writeFileSync(join(host, 'secret.txt'), `${SECRET}\n`);
mkdirSync(join(host, 'drop'), { mode: 0o777 });
chmodSync(join(host, 'drop'), 0o777);
/** The operator's roots: the fixture repositories, an images directory and a binds directory. */
const roots = mkdtempSync(join(tmpdir(), 'rollserve-swe-roots-'));
chmodSync(roots, 0o755);
const bindsRoot = join(roots, 'binds');
const imagesRoot = join(roots, 'images');
mkdirSync(join(bindsRoot, 'data'), { recursive: true, mode: 0o755 });
mkdirSync(imagesRoot, { mode: 0o755 });
writeFileSync(join(bindsRoot, 'data', 'hello.txt'), 'bound in\n');
symlinkSync(host, join(bindsRoot, 'host-link'));
symlinkSync(join(host, 'secret.txt'), join(bindsRoot, 'secret-link'));
symlinkSync(built.fixtures[0]!.repoPath, join(bindsRoot, 'repo-link'));
const socketPath = join(bindsRoot, 'service.sock');
let socketServer: Server;
const socketHits: string[] = [];

afterAll(async () => {
  await new Promise((resolve) => socketServer?.close(resolve));
  built.close();
  rmSync(host, { recursive: true, force: true });
  rmSync(roots, { recursive: true, force: true });
});
beforeAll(async () => {
  socketServer = createServer((connection) => {
    socketHits.push('connected');
    connection.end();
  });
  await new Promise<void>((resolve) => socketServer.listen(socketPath, resolve));
  chmodSync(socketPath, 0o777);
});

/** Rows that name what they may not, each with the field the 422 must name. */
function hostileRows(reposRoot: string, base: Record<string, unknown>): Array<{ name: string; row: Record<string, unknown>; loc: Array<string | number> }> {
  const bind = (b: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({ ...base, binds: [{ sandbox: '/data', ...b }], ...extra });
  return [
    { name: 'a host repository outside repos_root', row: { ...base, repo_path: host }, loc: ['repo_path'] },
    { name: 'repo_path climbing out with ..', row: { ...base, repo_path: `${reposRoot}/../../../..${host}` }, loc: ['repo_path'] },
    { name: 'repo_path "/"', row: { ...base, repo_path: '/' }, loc: ['repo_path'] },
    { name: 'image "/" (the host root as a bwrap root)', row: { ...base, image: '/' }, loc: ['image'] },
    { name: 'an image outside images_root', row: { ...base, image: `oci:${host}:latest` }, loc: ['image'] },
    { name: 'an image through a transport of the host', row: { ...base, image: 'docker-daemon:alpine:latest' }, loc: ['image'] },
    { name: 'image_template outside images_root', row: { ...base, image_template: `${host}/{instance_id}` }, loc: ['image_template'] },
    { name: 'a bind of a host directory', row: bind({ host }), loc: ['binds', 0, 'host'] },
    { name: 'a bind of /var/tmp', row: bind({ host: '/var/tmp' }), loc: ['binds', 0, 'host'] },
    { name: 'a writable bind of a host directory', row: bind({ host: join(host, 'drop'), read_only: false }), loc: ['binds', 0, 'read_only'] },
    { name: 'a writable bind under binds_root', row: bind({ host: join(bindsRoot, 'data'), read_only: false }), loc: ['binds', 0, 'read_only'] },
    { name: 'a bind through a symlink out of binds_root', row: bind({ host: join(bindsRoot, 'host-link') }), loc: ['binds', 0, 'host'] },
    { name: 'a file through a symlink out of binds_root', row: bind({ host: join(bindsRoot, 'secret-link'), sandbox: '/data/secret' }), loc: ['binds', 0, 'host'] },
    { name: 'a bind of a host Unix socket', row: bind({ host: socketPath, sandbox: '/data/sock' }), loc: ['binds', 0, 'host'] },
    { name: 'a bind of a device', row: bind({ host: '/dev/vda' }), loc: ['binds', 0, 'host'] },
    { name: 'a bind over /proc', row: bind({ host: join(bindsRoot, 'data'), sandbox: '/proc/self' }), loc: ['binds', 0, 'sandbox'] },
  ];
}

/** What none of the rows may have done on the host. */
function hostUntouched(): void {
  expect(readdirSync(join(host, 'drop'))).toEqual([]);
  expect(socketHits).toEqual([]);
}

// bwrap, counting the sandboxes it has open: a refused row holds none
const live = new Set<string>();
registerSandboxProvider('swe-roots-counting', () => {
  const inner = createBwrapProvider();
  return {
    name: 'swe-roots-counting',
    async create(spec) {
      const sandbox = await inner.create(spec);
      live.add(sandbox.id);
      const close = sandbox.close.bind(sandbox);
      sandbox.close = async () => {
        live.delete(sandbox.id);
        await close();
      };
      return sandbox;
    },
    close: async () => inner.close?.(),
  };
});

describe('SWE rows on the NeMo Gym face name host paths only under the configured roots', () => {
  let app: ResourcesServer;
  let running: RunningServer;
  let url: string;
  const config = { sandbox_provider: 'swe-roots-counting', repos_root: built.root, images_root: imagesRoot, binds_root: bindsRoot };

  beforeAll(async () => {
    app = createResourcesServer(swe, { config });
    running = await serveFetch(app);
    url = running.url;
  });
  afterAll(async () => {
    await running?.close();
    await app?.close();
  });

  it('/seed_session answers each hostile row with a 422 naming its field, opens no sandbox and touches nothing on the host', async () => {
    for (const { name, row, loc } of hostileRows(built.root, calc.row)) {
      const seed = await call(url, 'POST', '/seed_session', row);
      expect(seed.status, `${name}: ${seed.text}`).toBe(422);
      const detail = (seed.json as { detail: Array<{ loc: unknown[]; msg: string; type: string }> }).detail;
      expect(detail[0]!.loc, name).toEqual(['body', ...loc]);
      expect(detail[0]!.msg, name).not.toBe('');
      expect(live.size, name).toBe(0);
    }
    hostUntouched();
  });

  it('/verify of a session that was never seeded refuses a hostile row the same way (no eval sandbox on it)', async () => {
    for (const { name, row, loc } of hostileRows(built.root, calc.row).slice(0, 4)) {
      const verify = await call(url, 'POST', '/verify', { ...row, verify_from: 'response', response: makeResponse([]) });
      // an empty response is an empty patch before any sandbox; a patch would reach the row's paths
      const text = `\`\`\`diff\n${calc.goldPatch}\`\`\``;
      const withPatch = await call(url, 'POST', '/verify', {
        ...row,
        verify_from: 'response',
        response: makeResponse([{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] }]),
      });
      expect([verify.status, withPatch.status], `${name}: ${withPatch.text}`).toEqual([200, 422]);
      expect((withPatch.json as { detail: Array<{ loc: unknown[] }> }).detail[0]!.loc, name).toEqual(['body', ...loc]);
    }
    expect(live.size).toBe(0);
  });

  it('a bind that is swapped for a symlink to the host after seeding is refused when the eval sandbox is made', async () => {
    const data = join(bindsRoot, 'swap');
    mkdirSync(data, { mode: 0o755 });
    writeFileSync(join(data, 'hello.txt'), 'bound in\n');
    try {
      const row = { ...calc.row, binds: [{ host: data, sandbox: '/data' }], test_command: `cat /data/secret.txt; cat /data/hello.txt && python3 -m pytest -rA {tests}` };
      const seed = await call(url, 'POST', '/seed_session', row);
      expect(seed.status, seed.text).toBe(200);
      const cookie = cookieHeader(seed.setCookies);
      const edit = await call(url, 'POST', '/str_replace_editor', { command: 'str_replace', ...calc.goldEdit, path: `/workspace/${calc.goldEdit.path}` }, { cookie });
      expect(edit.status, edit.text).toBe(200);
      // between the seed and the evaluation, the bound directory becomes a way to the host
      rmSync(data, { recursive: true });
      symlinkSync(host, data);
      const verify = await call(url, 'POST', '/verify', { ...row, response: makeResponse([]) }, { cookie });
      expect(verify.status, verify.text).toBe(200);
      expect(verify.json).toMatchObject({ reward: 0, failure_reason: 'eval_sandbox_failed', failure_detail: expect.stringMatching(/^binds\.0\.host .*(outside binds_root|changed since the row was accepted)/) });
      expect(verify.text).not.toContain(SECRET);
      expect(live.size).toBe(0);
    } finally {
      rmSync(data, { recursive: true, force: true });
    }
  });

  it('a bind under binds_root is used, read-only', async () => {
    const row = { ...calc.row, binds: [{ host: join(bindsRoot, 'data'), sandbox: '/data' }] };
    const seed = await call(url, 'POST', '/seed_session', row);
    expect(seed.status, seed.text).toBe(200);
    const cookie = cookieHeader(seed.setCookies);
    const bash = await call(url, 'POST', '/bash', { command: 'cat /data/hello.txt; touch /data/new 2>/dev/null || echo read-only' }, { cookie });
    expect(bash.text).toContain('bound in\nread-only');
    await call(url, 'POST', '/verify', { ...row, response: makeResponse([]) }, { cookie });
    expect(live.size).toBe(0);
  });

  it.skipIf(!isRoot)("as root, git reads a row's repository as the sandbox user: a root-only repository under repos_root stays unreadable", async () => {
    // an operator's root-only repository (mode 0700, owned by root) inside repos_root
    const secretRepo = join(built.root, 'root-only');
    execFileSync('cp', ['-a', calc.repoPath, secretRepo]);
    chmodSync(secretRepo, 0o700);
    try {
      const seed = await call(url, 'POST', '/seed_session', { ...calc.row, repo_path: secretRepo });
      expect(seed.status, seed.text).toBe(422);
      expect((seed.json as { detail: Array<{ loc: unknown[]; msg: string }> }).detail[0]).toMatchObject({ loc: ['body', 'repo_path'], msg: expect.stringMatching(/Permission denied/) });
      expect(live.size).toBe(0);
      // readable by others, it is read (as the sandbox user, whoever owns it: safe.directory)
      chmodSync(secretRepo, 0o755);
      const ok = await call(url, 'POST', '/seed_session', { ...calc.row, repo_path: secretRepo });
      expect(ok.status, ok.text).toBe(200);
      await call(url, 'POST', '/verify', { ...calc.row, response: makeResponse([]) }, { cookie: cookieHeader(ok.setCookies) });
    } finally {
      rmSync(secretRepo, { recursive: true, force: true });
    }
    expect(live.size).toBe(0);
  });
});

const ROLLSERVE = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');

/** `rollserve start` in `dir` (its data dir: repos/, images/, binds/ under it), as `uid` when given. */
function startCli(dir: string, fake: FakePolicy, asNobody: boolean) {
  const argv = [process.execPath, ROLLSERVE, 'start', '--port', '0', '--llm', fake.url, '--store', `sqlite://${join(dir, 'store.db')}`, '--journal', join(dir, 'journal.jsonl')];
  const [command, ...args] = asNobody ? ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', ...argv] : argv;
  const child = spawn(command!, args, {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent', ROLLSERVE_DATA_DIR: dir, ROLLSERVE_IMAGE_CACHE: join(dir, 'image-cache') },
  });
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c));
  child.stderr!.on('data', (c: Buffer) => (output += c));
  return { child, output: () => output };
}

async function started({ child, output }: ReturnType<typeof startCli>): Promise<Record<string, string>> {
  const deadline = Date.now() + 30_000;
  while (!/^swe\s+http/m.test(output())) {
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`not started: ${output()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return Object.fromEntries([...output().matchAll(/^(\S+)\s+(http:\/\/127\.0\.0\.1:\d+)/gm)].map((m) => [m[1]!, m[2]!]));
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  child.kill('SIGINT');
  await once(child, 'exit');
}

describe.each([
  { user: 'the service user', asNobody: false },
  ...(isRoot ? [{ user: 'an unprivileged service user (65534)', asNobody: true }] : []),
])('rollserve start as $user: the rollout API refuses hostile SWE rows at submit', ({ asNobody }) => {
  it('POST /v1/rollouts and /process answer 422 naming the row field; a row under the default roots (the data dir) is accepted', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollserve-swe-start-'));
    chmodSync(dir, 0o755);
    // the default roots: <data dir>/repos, images, binds; the fixture repository copied in
    mkdirSync(join(dir, 'repos'));
    execFileSync('cp', ['-a', calc.repoPath, join(dir, 'repos', 'calc')]);
    if (asNobody) execFileSync('chown', ['-R', '65534:65534', dir]);
    const fake = await startFakePolicy({ script: () => 'Nothing to do.' });
    const service = startCli(dir, fake, asNobody);
    try {
      const urls = await started(service);
      const rollouts = urls.rollouts!;
      const good = { ...calc.row, repo_path: 'calc' };
      const rows = hostileRows(join(dir, 'repos'), good);
      // the fixture row's repo_path is outside the data dir's repos/: refused too
      rows.push({ name: 'a repository outside the default repos_root', row: { ...calc.row }, loc: ['repo_path'] });
      for (const { name, row, loc } of rows) {
        const answer = await call(rollouts, 'POST', '/v1/rollouts', { env: 'swe', row, policy: { model: 'fake-policy' } });
        expect(answer.status, `${name}: ${answer.text}`).toBe(422);
        const error = (answer.json as { error: { code: string; message: string; details: Array<{ path: unknown[]; message: string }> } }).error;
        expect(error.code, name).toBe('UNPROCESSABLE');
        expect(error.details[0]!.path, name).toEqual(['row', ...loc]);
        expect(error.message, name).toMatch(/row does not fit environment "swe"/);
      }
      // a batch with one such row is refused whole
      const batch = await call(rollouts, 'POST', '/v1/rollouts', { tasks: [{ env: 'swe', row: good, policy: { model: 'fake-policy' } }, { env: 'swe', row: rows[0]!.row, policy: { model: 'fake-policy' } }] });
      expect(batch.status, batch.text).toBe(422);
      // ProRL's /process goes through the same check
      expect((await call(rollouts, 'POST', '/start', {})).status).toBe(200);
      const processed = await call(rollouts, 'POST', '/process', { instance: { ...rows[7]!.row, env: 'swe' }, sampling_params: { model: 'fake-policy' } });
      expect(processed.status, processed.text).toBe(422);
      expect(processed.text).toMatch(/binds/);
      // the repository in the data dir's repos/ (relative to it) is accepted
      const accepted = await call(rollouts, 'POST', '/v1/rollouts', { id: 'fine', env: 'swe', row: good, policy: { model: 'fake-policy' } });
      expect(accepted.status, accepted.text).toBe(202);
      const stream = await request(`${rollouts}/v1/rollouts/stream?ids=fine`);
      const result = JSON.parse((await stream.body.text()).trim()) as Record<string, unknown>;
      expect(result).toMatchObject({ id: 'fine', reward: 0, verify_extras: { failure_reason: 'empty_patch' } });
      hostUntouched();
      expect(existsSync(join(host, 'drop', 'pwned'))).toBe(false);
    } finally {
      await stop(service.child);
      await fake.close();
      if (asNobody) chownSync(dir, 0, 0);
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
