import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { call, makeResponse, startFakePolicy, workspaceRoot } from '@rollserve/testing';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';

const bin = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');

/** The CLI as a child, with no token or allowance inherited from the shell running the tests. */
function rollserve(args: string[], env: Record<string, string> = {}) {
  const { ROLLSERVE_TOKEN: _t, ROLLSERVE_ALLOW_NO_TOKEN: _a, ...inherited } = process.env;
  const child = spawn(process.execPath, [bin, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...inherited, ROLLSERVE_LOG_LEVEL: 'silent', ...env },
  });
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c));
  child.stderr!.on('data', (c: Buffer) => (output += c));
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  return { child, exited, output: () => output };
}

/** A port taken on 127.0.0.1, so that binding it on 0.0.0.0 fails (EADDRINUSE) without ever listening openly. */
async function takenPort(): Promise<{ port: number; close: () => void }> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address();
  return { port: typeof address === 'object' && address ? address.port : 0, close: () => server.close() };
}

describe('rollserve and non-loopback addresses', () => {
  it('start and serve refuse a non-loopback --host without a token, before binding anything', async () => {
    for (const args of [['start', '--host', '0.0.0.0', '--port', '0'], ['serve', 'math', '--host', '::', '--port', '0'], ['serve', 'math', '--host', '10.1.2.3']]) {
      const run = rollserve(args);
      expect(await run.exited, args.join(' ')).not.toBe(0);
      expect(run.output()).toMatch(/refusing to serve (0\.0\.0\.0|::|10\.1\.2\.3) without a token.*--allow-no-token/s);
    }
  });

  it('--allow-no-token and ROLLSERVE_ALLOW_NO_TOKEN=1 let serve go on to bind', async () => {
    const taken = await takenPort();
    try {
      for (const [args, env] of [
        [['serve', 'math', '--host', '0.0.0.0', '--port', String(taken.port), '--allow-no-token'], {}],
        [['serve', 'math', '--host', '0.0.0.0', '--port', String(taken.port)], { ROLLSERVE_ALLOW_NO_TOKEN: '1' }],
      ] as const) {
        const run = rollserve([...args], env);
        expect(await run.exited).not.toBe(0);
        expect(run.output()).toContain('EADDRINUSE');
        expect(run.output()).not.toContain('refusing');
      }
    } finally {
      taken.close();
    }
  });

  it('the NeMo Gym launch binds the configured address with only a warning, as NeMo Gym expects', async () => {
    const taken = await takenPort();
    try {
      const config = { math_instance: { resources_servers: { math: { entrypoint: 'app.py', domain: 'math', host: '0.0.0.0', port: taken.port } } } };
      const run = rollserve(['nemo-gym', join(workspaceRoot(), 'environments', 'math')], {
        NEMO_GYM_CONFIG_DICT: stringify(config),
        NEMO_GYM_CONFIG_PATH: 'math_instance',
      });
      expect(await run.exited).not.toBe(0);
      expect(run.output()).toContain('warning: serving 0.0.0.0 without a token');
      expect(run.output()).toContain('EADDRINUSE');
    } finally {
      taken.close();
    }
  });
});

describe('rollserve start --token', () => {
  it('protects the rollout service and every environment server; /health and GET / stay open', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-token-'));
    const fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
    const token = 'start-token-456';
    const run = rollserve(['start', '--port', '0', '--llm', fake.url, '--store', `sqlite://${join(dir, 'store.db')}`, '--token', token]);
    try {
      while (!/^swe\s+http/m.test(run.output())) {
        if (run.child.exitCode !== null) throw new Error(`not started: ${run.output()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const urls = Object.fromEntries([...run.output().matchAll(/^(\S+)\s+(http:\/\/127\.0\.0\.1:\d+)/gm)].map((m) => [m[1]!, m[2]!]));
      const auth = { authorization: `Bearer ${token}` };
      expect((await call(urls.rollouts!, 'GET', '/health')).status).toBe(200);
      expect((await call(urls.rollouts!, 'GET', '/v1/status')).json).toMatchObject({ error: { code: 'UNAUTHORIZED' } });
      expect((await call(urls.rollouts!, 'GET', '/v1/status', undefined, { authorization: 'Bearer has space' })).status).toBe(401);
      expect((await call(urls.rollouts!, 'GET', '/v1/status', undefined, auth)).status).toBe(200);
      const verify = { responses_create_params: { input: 'x' }, response: makeResponse([]) };
      for (const env of ['code', 'math', 'stem', 'swe']) {
        expect((await call(urls[env]!, 'GET', '/')).status, env).toBe(200);
        expect(await call(urls[env]!, 'POST', '/verify', verify), env).toMatchObject({ status: 401, json: { detail: 'Not authenticated' } });
        expect((await call(urls[env]!, 'POST', '/verify', verify, auth)).status, env).not.toBe(401);
      }
    } finally {
      run.child.kill('SIGINT');
      await run.exited;
      await fake.close();
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
