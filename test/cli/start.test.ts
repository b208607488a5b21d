import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { call, startFakePolicy, workspaceRoot } from '@rollserve/testing';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';

// The main job the README's quickstart starts: the rollout service and every installed
// environment as a NeMo Gym resources server.
describe('rollserve start', () => {
  it('serves the rollout service and every environment, runs a rollout, and stops on SIGINT', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-start-'));
    const fake = await startFakePolicy({ script: () => 'The sum is \\boxed{8}.' });
    const journal = join(dir, 'journal.jsonl');
    const child = spawn(process.execPath, [join(workspaceRoot(), 'packages', 'core', 'bin', 'rollserve.js'), 'start', '--port', '0', '--llm', fake.url, '--journal', journal], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' },
    });
    let output = '';
    child.stdout!.on('data', (c: Buffer) => (output += c));
    child.stderr!.on('data', (c: Buffer) => (output += c));
    try {
      const deadline = Date.now() + 20_000;
      while (!/^swe\s+http/m.test(output)) {
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`not started: ${output}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const urls = Object.fromEntries([...output.matchAll(/^(\S+)\s+(http:\/\/127\.0\.0\.1:\d+)/gm)].map((m) => [m[1]!, m[2]!]));
      expect(Object.keys(urls).sort()).toEqual(['code', 'math', 'rollouts', 'stem', 'swe']);
      for (const env of ['code', 'math', 'stem', 'swe']) expect((await call(urls[env]!, 'GET', '/')).json).toEqual({ status: 'ok' });

      const submitted = await call(urls.rollouts!, 'POST', '/v1/rollouts', {
        id: 'quick',
        env: 'math',
        row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' },
        policy: { model: 'fake-policy' },
      });
      expect(submitted.status).toBe(202);
      const stream = await request(`${urls.rollouts}/v1/rollouts/stream?ids=quick`);
      const result = JSON.parse((await stream.body.text()).trim()) as { reward: number; id: string };
      expect(result).toMatchObject({ id: 'quick', reward: 1 });
      expect(await readFile(journal, 'utf8')).toContain('"type":"result"');

      child.kill('SIGINT');
      const [code] = (await once(child, 'exit')) as [number | null];
      expect(code).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
      await fake.close();
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
