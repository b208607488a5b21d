import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { bwrapAvailable } from '@rollserve/core/sandbox';
import { call, nemoGymFixture, readJsonl, startFakePolicy, workspaceRoot, type FakePolicy } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { post } from '../gym/post-body.ts';

// Through the real `rollserve start`: a policy whose Python cell floods the kernel's socket with
// 1.3 GB (no newline) ends its rollout with RESOURCE_LIMIT, while the service answers /health, and
// the service's peak memory grows by a bounded amount, not by the flood. `--max-body-mib` caps the
// bodies of every server it runs; `rollserve serve` and `rollserve nemo-gym` take the same cap.

const ROLLSERVE = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');
const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';

/** Cell code: the kernel's own connection to the service, 1.3 GB written to it without a newline. */
const FLOOD = [
  'import gc, socket',
  'chunk = b"x" * (1 << 20)',
  'for s in [o for o in gc.get_objects() if isinstance(o, socket.socket)]:',
  '    try:',
  '        for _ in range(1300):',
  '            s.sendall(chunk)',
  '    except OSError:',
  '        pass',
].join('\n');

/** The service's peak resident memory so far (VmHWM), MB. */
function peakRssMb(pid: number): number {
  const match = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(match![1]) / 1024;
}

function startCli(command: string, args: string[], env: Record<string, string> = {}) {
  const child = spawn(process.execPath, [ROLLSERVE, command, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent', ...env } });
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c));
  child.stderr!.on('data', (c: Buffer) => (output += c));
  return { child, output: () => output };
}

async function urlsOf({ child, output }: ReturnType<typeof startCli>, last: RegExp): Promise<Record<string, string>> {
  const deadline = Date.now() + 30_000;
  while (!last.test(output())) {
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

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

const fastApi413 = (cap: number) => ({ detail: `Request Entity Too Large: the body may be at most ${cap} bytes` });

describe.skipIf(skip !== undefined)('rollserve start bounds what sandboxes and clients send it', () => {
  let fake: FakePolicy;
  let service: ReturnType<typeof startCli>;
  let urls: Record<string, string>;
  beforeAll(async () => {
    // first turn: the flood; any later turn (there should be none) answers
    fake = await startFakePolicy({
      script: (request) => (request.messages.some((m) => (m as { role: string }).role === 'tool') ? 'The answer is \\boxed{1}.' : { toolCalls: [{ name: 'execute_python', arguments: { code: FLOOD } }] }),
    });
    service = startCli('start', ['--port', '0', '--llm', fake.url, '--store', 'sqlite::memory:', '--max-body-mib', '1']);
    urls = await urlsOf(service, /^swe\s+http/m);
  }, 60_000);
  afterAll(async () => {
    if (service) await stop(service.child);
    await fake?.close();
  });

  it('ends a rollout whose Python cell floods the kernel socket with RESOURCE_LIMIT, answering /health, its memory bounded', async () => {
    const [row] = readJsonl<Record<string, unknown>>(nemoGymFixture('math_with_code', 'example.jsonl'));
    const before = peakRssMb(service.child.pid!);
    const submitted = await call(urls.rollouts!, 'POST', '/v1/rollouts', { id: 'flood', env: 'math', row, policy: { model: 'fake-policy' } });
    expect(submitted.status).toBe(202);
    let result: { state: string; error: { code: string; message: string } | null; filter: boolean } | undefined;
    let healthChecks = 0;
    const deadline = Date.now() + 120_000;
    while (result === undefined && Date.now() < deadline) {
      expect((await call(urls.rollouts!, 'GET', '/health')).status).toBe(200);
      healthChecks++;
      const view = (await call(urls.rollouts!, 'GET', '/v1/rollouts/flood')).json as { state: string; result?: typeof result };
      if (view.result) result = view.result;
      else await new Promise((r) => setTimeout(r, 100));
    }
    expect(result).toMatchObject({ state: 'failed', filter: false, error: { code: 'RESOURCE_LIMIT' } });
    expect(result!.error!.message).toMatch(/Python kernel's channel to the service was flooded/);
    expect(healthChecks).toBeGreaterThan(0);
    // peak RSS (VmHWM) grew by far less than the 1.3 GB the cell wrote
    expect(peakRssMb(service.child.pid!) - before).toBeLessThan(200);
    expect((await call(urls.rollouts!, 'GET', '/v1/status')).status).toBe(200);
  }, 150_000);

  it('caps request bodies at --max-body-mib on the rollout API and on every resources server', async () => {
    const cap = 1024 * 1024;
    for (const [url, path] of [[urls.rollouts!, '/v1/rollouts'], [urls.rollouts!, '/process'], [urls.math!, '/verify'], [urls.code!, '/verify']] as const) {
      for (const declared of [undefined, 2 * cap]) {
        const sent = await post(url, path, { total: 1024 ** 3, ...(declared ? { declared } : {}), hold: true });
        expect(sent.status, `${path} ${declared}`).toBe(413);
        const body = JSON.parse(sent.body) as unknown;
        if (path === '/v1/rollouts') expect(body).toMatchObject({ error: { code: 'PAYLOAD_TOO_LARGE', details: { max_bytes: cap } } });
        else expect(body).toEqual(fastApi413(cap));
      }
    }
  });
});

describe('the body cap of rollserve serve and rollserve nemo-gym', () => {
  it('serve takes --max-body-mib; nemo-gym takes it or ROLLSERVE_MAX_BODY_MIB; a bad value is refused', async () => {
    const serve = startCli('serve', ['math', '--max-body-mib', '0.5']);
    try {
      const { math: url } = await urlsOf(serve, /^math\s+http/m);
      const sent = await post(url!, '/verify', { total: 1024 ** 3, hold: true });
      expect(sent.status).toBe(413);
      expect(JSON.parse(sent.body)).toEqual(fastApi413(512 * 1024));
    } finally {
      await stop(serve.child);
    }
    const port = await freePort();
    const config = `math:\n  resources_servers:\n    math:\n      entrypoint: app.py\n      domain: math\n      host: 127.0.0.1\n      port: ${port}\n`;
    const gym = startCli('nemo-gym', [join(workspaceRoot(), 'environments', 'math')], { NEMO_GYM_CONFIG_DICT: config, NEMO_GYM_CONFIG_PATH: 'math', ROLLSERVE_MAX_BODY_MIB: '2' });
    try {
      const deadline = Date.now() + 30_000;
      while (!gym.output().includes(`127.0.0.1:${port}`)) {
        if (Date.now() > deadline || gym.child.exitCode !== null) throw new Error(`not started: ${gym.output()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const sent = await post(`http://127.0.0.1:${port}`, '/verify', { total: 1024 ** 3, hold: true });
      expect(sent.status).toBe(413);
      expect(JSON.parse(sent.body)).toEqual(fastApi413(2 * 1024 * 1024));
    } finally {
      await stop(gym.child);
    }
    const bad = spawnSync(process.execPath, [ROLLSERVE, 'serve', 'math', '--max-body-mib', 'lots'], { encoding: 'utf8' });
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/--max-body-mib takes a number/);
  }, 90_000);
});
