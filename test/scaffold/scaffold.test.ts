import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, readFileSync, readlinkSync, realpathSync, symlinkSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { call, workspaceRoot } from '@rollserve/testing';
import { afterAll, describe, expect, it } from 'vitest';

// `rollserve new` from scratch in a temporary directory: the package builds, passes its own tests
// (the NeMo Gym contract suite among them) and serves.

const root = workspaceRoot();
const bin = join(root, 'packages', 'cli', 'bin', 'rollserve.js');
const temps: string[] = [];
afterAll(async () => {
  await Promise.all(temps.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function temp(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-scaffold-'));
  temps.push(dir);
  return dir;
}

/** What `pnpm install` gives the new package, from this workspace's installed copies. */
function linkDependencies(dir: string): void {
  const links: Record<string, string> = {
    '@rollserve/core': join(root, 'packages', 'core'),
    '@rollserve/testing': join(root, 'packages', 'testing'),
    zod: realpathSync(join(root, 'packages', 'core', 'node_modules', 'zod')),
    vitest: realpathSync(join(root, 'node_modules', 'vitest')),
    typescript: realpathSync(join(root, 'node_modules', 'typescript')),
    '@types/node': realpathSync(join(root, 'node_modules', '@types', 'node')),
  };
  for (const [name, target] of Object.entries(links)) {
    const link = join(dir, 'node_modules', name);
    mkdirSync(dirname(link), { recursive: true });
    symlinkSync(target, link);
  }
}

describe('rollserve new', () => {
  it('creates a package outside the workspace that builds, passes its tests and serves', async () => {
    const dir = join(await temp(), 'word-count');
    const made = spawnSync(process.execPath, [bin, 'new', 'word-count', '--dir', dir], { encoding: 'utf8' });
    expect(made.status, made.stderr).toBe(0);
    for (const file of ['package.json', 'tsconfig.json', 'src/index.ts', 'src/index.test.ts', 'data/example.jsonl', 'nemo-gym/app.py', 'nemo-gym/requirements.txt', 'nemo-gym/configs/word-count.yaml', 'README.md']) {
      expect(existsSync(join(dir, file)), file).toBe(true);
    }
    const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { name: string; dependencies: Record<string, string> };
    expect(pkg.name).toBe('@rollserve/env-word-count');
    expect(resolve(dir, pkg.dependencies['@rollserve/core']!.replace(/^link:/, ''))).toBe(join(root, 'packages', 'core'));
    expect(readFileSync(join(dir, 'data', 'example.jsonl'), 'utf8').trim().split('\n')).toHaveLength(5);
    linkDependencies(dir);

    const build = spawnSync(process.execPath, [join(dir, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir], { encoding: 'utf8' });
    expect(build.status, build.stdout + build.stderr).toBe(0);
    expect(existsSync(join(dir, 'dist', 'index.js'))).toBe(true);

    const tests = spawnSync(process.execPath, [join(dir, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '--root', dir], {
      encoding: 'utf8',
      env: { ...process.env, CI: 'true', ROLLSERVE_LOG_LEVEL: 'silent' },
    });
    const summary = (tests.stdout + tests.stderr).replace(/\x1b\[[0-9;]*m/g, '');
    expect(tests.status, summary).toBe(0);
    // Its own 2 tests and the contract suite's (8 today), none failed.
    expect(Number(/Tests\s+(\d+) passed/.exec(summary)?.[1])).toBeGreaterThanOrEqual(10);
    expect(summary).not.toMatch(/\d+ failed/);

    const server = spawn(process.execPath, [bin, 'serve', 'word-count', '--port', '0'], {
      env: { ...process.env, ROLLSERVE_ENVIRONMENTS: dir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    server.stdout!.on('data', (c: Buffer) => (output += c));
    server.stderr!.on('data', (c: Buffer) => (output += c));
    try {
      const deadline = Date.now() + 15_000;
      let url: string | undefined;
      while (!(url = /http:\/\/127\.0\.0\.1:\d+/.exec(output)?.[0])) {
        if (Date.now() > deadline || server.exitCode !== null) throw new Error(`not served: ${output}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect((await call(url, 'POST', '/count_words', { text: 'one two three' })).json).toEqual({ count: 3 });
      const [row] = readFileSync(join(dir, 'data', 'example.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { expected_count: number });
      const verify = await call(url, 'POST', '/verify', {
        ...row,
        response: { id: 'r', output: [{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: `It has ${row!.expected_count} words.` }] }] },
      });
      expect(verify.json).toMatchObject({ reward: 1, extracted_answer: row!.expected_count });
    } finally {
      server.kill('SIGTERM');
      await once(server, 'exit');
    }
  }, 120_000);

  it('inside a workspace, adds the package to the build graph and the NeMo Gym search root', async () => {
    const ws = await temp();
    writeFileSync(join(ws, 'pnpm-workspace.yaml'), 'packages:\n  - environments/*\n');
    writeFileSync(join(ws, 'tsconfig.json'), JSON.stringify({ files: [], references: [] }));
    mkdirSync(join(ws, 'environments'));
    mkdirSync(join(ws, 'nemo-gym', 'resources_servers'), { recursive: true });
    const made = spawnSync(process.execPath, [bin, 'new', 'tiny'], { cwd: ws, encoding: 'utf8' });
    expect(made.status, made.stderr).toBe(0);
    const pkg = JSON.parse(readFileSync(join(ws, 'environments', 'tiny', 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
    expect(pkg.dependencies['@rollserve/core']).toBe('workspace:*');
    expect(JSON.parse(readFileSync(join(ws, 'tsconfig.json'), 'utf8')).references).toEqual([{ path: 'environments/tiny' }]);
    expect(readlinkSync(join(ws, 'nemo-gym', 'resources_servers', 'tiny'))).toBe('../../environments/tiny/nemo-gym');
    expect(realpathSync(join(ws, 'nemo-gym', 'resources_servers', 'tiny', 'data', 'example.jsonl'))).toBe(realpathSync(join(ws, 'environments', 'tiny', 'data', 'example.jsonl')));
    // A second scaffold of the same name is refused.
    const again = spawnSync(process.execPath, [bin, 'new', 'tiny'], { cwd: ws, encoding: 'utf8' });
    expect(again.status).not.toBe(0);
    expect(again.stderr).toContain('exists already');
    const bad = spawnSync(process.execPath, [bin, 'new', 'Bad_Name'], { cwd: ws, encoding: 'utf8' });
    expect(bad.stderr).toContain('lower-case');
  });
});
