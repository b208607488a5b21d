import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { call, workspaceRoot } from '@rollserve/testing';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';

// What `gym env start` does with rollserve's environments: it finds resources_servers/<name>
// under NEMO_GYM_EXTRA_ROOTS, checks its files, and runs `python app.py` there with the merged
// config in NEMO_GYM_CONFIG_DICT (CONTRACT.md §4.4, §4.6).

const root = workspaceRoot();
const bin = join(root, 'packages', 'cli', 'bin', 'rollserve.js');
const gymRoot = join(root, 'nemo-gym');

async function freePort(): Promise<number> {
  const server = createServer().listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  server.close();
  return port;
}

describe('NeMo Gym registration', () => {
  it('lays out every environment as NeMo Gym expects a server directory', () => {
    const listed = spawnSync(process.execPath, [bin, 'list'], { encoding: 'utf8' });
    const names = listed.stdout.trim().split('\n').map((line) => line.split(/\s+/)[0]!);
    expect(names).toEqual(expect.arrayContaining(['math', 'stem']));
    expect(existsSync(join(gymRoot, 'pyproject.toml'))).toBe(true); // editable install mode
    for (const name of names) {
      const dir = join(gymRoot, 'resources_servers', name);
      expect(existsSync(join(dir, 'app.py')), name).toBe(true);
      expect(existsSync(join(dir, 'requirements.txt')), name).toBe(true);
      expect(existsSync(join(dir, 'pyproject.toml')), name).toBe(false); // one of the two, not both
      const own = parse(readFileSync(join(dir, 'configs', `${name}.yaml`), 'utf8')) as Record<string, { resources_servers: Record<string, { entrypoint: string; domain: string }> }>;
      expect(own[name]!.resources_servers[name]).toMatchObject({ entrypoint: 'app.py' });
    }
  });

  it('gym-config writes a config whose instances start through the app.py shim and stop on SIGINT', async () => {
    const port = await freePort();
    const written = spawnSync(process.execPath, [bin, 'gym-config', 'math', 'stem', '--host', '127.0.0.1', '--port', String(port)], { encoding: 'utf8' });
    expect(written.status, written.stderr).toBe(0);
    const config = parse(written.stdout) as Record<string, Record<string, Record<string, Record<string, unknown>>>>;
    expect(config.math!.resources_servers!.math).toMatchObject({ entrypoint: 'app.py', domain: 'math', host: '127.0.0.1', port, should_use_judge: false });
    expect(config.stem!.resources_servers!.stem).toMatchObject({ domain: 'knowledge', port: port + 1 });
    const agent = config.math_simple_agent!.responses_api_agents!.simple_agent!;
    expect(agent).toMatchObject({ resources_server: { type: 'resources_servers', name: 'math' }, model_server: { type: 'responses_api_models', name: 'policy_model' } });
    expect(existsSync((agent.datasets as Array<{ jsonl_fpath: string }>)[0]!.jsonl_fpath)).toBe(true);

    const child = spawn('python3', ['app.py'], {
      cwd: join(gymRoot, 'resources_servers', 'math'),
      env: { ...process.env, NEMO_GYM_CONFIG_DICT: written.stdout, NEMO_GYM_CONFIG_PATH: 'math' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout!.on('data', (c: Buffer) => (output += c));
    child.stderr!.on('data', (c: Buffer) => (output += c));
    try {
      const url = `http://127.0.0.1:${port}`;
      const deadline = Date.now() + 15_000;
      while (!output.includes(url)) {
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`not started: ${output}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect((await call(url, 'GET', '/')).json).toEqual({ status: 'ok' });
      const verify = await call(url, 'POST', '/verify', {
        responses_create_params: { input: 'What is 3+5?' },
        question: 'What is 3+5?',
        expected_answer: '8',
        response: { id: 'r', output: [{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: '\\boxed{8}' }] }] },
      });
      expect(verify.json).toMatchObject({ reward: 1, extracted_answer: '8' });
      // The shim execs node: the process NeMo Gym signals is the server itself.
      child.kill('SIGINT');
      const [code] = (await once(child, 'exit')) as [number | null];
      expect(code).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });
});
