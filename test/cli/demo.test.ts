import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { workspaceRoot } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';

// The README's first run, as a newcomer types it: `rollserve demo` (the command line is taken from
// the README), then `demo --serve` and the README's curl examples against it, as written but for
// the port.

const root = workspaceRoot();
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const shBlocks = [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
const children = new Set<ChildProcess>();

afterEach(async () => {
  for (const child of children) {
    child.kill('SIGTERM');
    if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
  }
  children.clear();
});

/** The README's demo command (`node packages/cli/bin/rollserve.js demo ...`), as argv. */
function documented(pattern: RegExp): string[] {
  const line = shBlocks
    .flatMap((block) => block.split('\n'))
    .map((l) => l.replace(/#.*$/, '').trim())
    .find((l) => pattern.test(l));
  expect(line, `README has a line matching ${pattern}`).toBeDefined();
  const [node, ...args] = line!.split(/\s+/);
  expect(node).toBe('node');
  return args;
}

function startDemo(args: string[]): { child: ChildProcess; output: () => string; done: Promise<number | null> } {
  const child = spawn(process.execPath, args, { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' } });
  children.add(child);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => (stdout += c));
  child.stderr!.on('data', (c: Buffer) => (stderr += c));
  const done = once(child, 'exit').then(([code]) => code as number | null);
  return { child, output: () => `${stdout}\n--- stderr ---\n${stderr}`, done };
}

/** The summary table's row of an environment: [done, total, failed, mean reward]. */
function tableRow(stdout: string, env: string): [number, number, number, string] | undefined {
  const match = new RegExp(`^${env}\\s+(\\d+)/(\\d+)\\s+(\\d+)\\s+(\\S+)$`, 'm').exec(stdout);
  return match ? [Number(match[1]), Number(match[2]), Number(match[3]), match[4]!] : undefined;
}

describe('rollserve demo', () => {
  it('runs rollouts of every environment with the scripted policy, each with its reward, and exits 0', async () => {
    const demo = startDemo([...documented(/rollserve\.js demo$/), '--port', '0']);
    const code = await demo.done;
    const out = demo.output();
    expect(code, out).toBe(0);
    expect(tableRow(out, 'math'), out).toEqual([5, 5, 0, '1.000']);
    expect(tableRow(out, 'stem'), out).toEqual([5, 5, 0, '1.000']);
    expect(tableRow(out, 'code'), out).toEqual([5, 5, 0, '1.000']);
    expect(tableRow(out, 'swe'), out).toEqual([1, 1, 0, '1.000']);
    // each rollout printed as it finished, with its reward
    for (const env of ['math', 'stem', 'code']) {
      for (let i = 0; i < 5; i++) expect(out).toMatch(new RegExp(`^${env}\\s+demo-${env}-${i}\\s+reward 1 `, 'm'));
    }
    expect(out).toMatch(/^swe\s+demo-swe-0\s+reward 1\s+\(3 turns/m);
    expect(out).toContain('16 rollouts of 4 environments: all done');
  }, 240_000);

  it('--serve keeps serving, and the README curl examples work as written against it', async () => {
    const demo = startDemo([...documented(/rollserve\.js demo --serve$/), '--port', '0']);
    let url: string | undefined;
    while (url === undefined) {
      if (demo.child.exitCode !== null) throw new Error(`demo --serve exited: ${demo.output()}`);
      url = /^serving (http:\/\/127\.0\.0\.1:\d+) until Ctrl-C/m.exec(demo.output())?.[1];
      if (url === undefined) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const port = new URL(url).port;
    const curlBlocks = shBlocks.filter((block) => /\bcurl\b/.test(block) && block.includes('localhost:8100'));
    expect(curlBlocks.length).toBeGreaterThan(0);
    const outputs: string[] = [];
    for (const block of curlBlocks) {
      // as written, but for the port; each curl's output on lines of its own
      const script = `curl() { command curl --fail-with-body "$@"; echo; }\n${block.replaceAll('localhost:8100', `127.0.0.1:${port}`)}`;
      const { stdout } = await promisify(execFile)('bash', ['-euc', script], { timeout: 120_000 });
      outputs.push(stdout);
      for (const line of stdout.split('\n').filter((l) => l.trim().startsWith('{'))) {
        expect((JSON.parse(line) as { error?: unknown }).error ?? null, line).toBeNull();
      }
    }
    // the rollout example: 202 with the task's rollout ids, then its 4 results, each right (3+5 = 8)
    const rollouts = outputs.find((o) => o.includes('sum-3-5'));
    expect(rollouts, outputs.join('\n----\n')).toBeDefined();
    const lines = rollouts!
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines[0]).toMatchObject({ tasks: [{ task_id: 'sum-3-5', rollout_ids: ['sum-3-5:0', 'sum-3-5:1', 'sum-3-5:2', 'sum-3-5:3'] }] });
    const results = lines.slice(1);
    expect(results.map((r) => r.id).sort()).toEqual(['sum-3-5:0', 'sum-3-5:1', 'sum-3-5:2', 'sum-3-5:3']);
    for (const result of results) expect(result).toMatchObject({ reward: 1, env: 'math', state: 'done' });

    // the README's Python client example, as written but for the port: 8 groups of 4, each right
    const readmePython = (model?: string) => {
      const section = readme.slice(readme.indexOf('## Python client'));
      const block = /```python\n([\s\S]*?)```/.exec(section)?.[1];
      expect(block, "README's Python client example").toBeDefined();
      const asWritten = block!.replaceAll('http://127.0.0.1:8100', `http://127.0.0.1:${port}`);
      return model === undefined ? asWritten : asWritten.replace('"model": "scripted-policy"', `"model": ${JSON.stringify(model)}`);
    };
    const python = (source: string) =>
      promisify(execFile)('python3', ['-c', source], { timeout: 120_000, env: { ...process.env, PYTHONPATH: join(root, 'clients/python/src') } });
    const { stdout: printed } = await python(readmePython());
    const groups = printed.split('\n').filter((l) => / \[.*\] \[.*\]$/.test(l));
    expect(groups, printed).toHaveLength(8);
    for (const line of groups) expect(line, printed).toMatch(/ \[1, 1, 1, 1\] \[0, 0, 0, 0\]$/);
    expect(printed).not.toContain('failed:');

    // a model the demo's policy does not serve: every sample failed, filtered, the server's 404 said; not reward 0 as a score
    const { stdout: refused } = await python(readmePython('Qwen/Qwen3-8B'));
    const failures = refused.split('\n').filter((l) => l.trim().startsWith('failed:'));
    expect(failures, refused).toHaveLength(32);
    for (const line of failures) expect(line).toMatch(/failed: \S+:\d LLM_BACKEND .*HTTP 404: The model `Qwen\/Qwen3-8B` does not exist/);
    expect(refused.split('\n').filter((l) => / \[0, 0, 0, 0\] \[None, None, None, None\]$/.test(l))).toHaveLength(8);
    expect(refused).toMatch(/'failed': 32, 'cancelled': 0, 'in_flight': 0, 'drifted': 0\}/); // the status line: failed, not done
    demo.child.kill('SIGTERM');
    expect(await demo.done).toBe(0);
  }, 240_000);
});
