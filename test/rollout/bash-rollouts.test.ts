import { readdirSync, readFileSync } from 'node:fs';
import { bashTool, defineEnvironment } from '@rollserve/core';
import type { RolloutService, RolloutTaskInput } from '@rollserve/core/service';
import { type FakePolicy, type FakeReply, startFakePolicy, startTestRolloutService } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';

// Multi-turn bash rollouts through the whole service, on real bwrap sandboxes.

const shell = defineEnvironment({
  name: 'shell',
  domain: 'agent',
  row: z.object({ expected: z.string() }),
  tools: { bash: bashTool },
  sandbox: { network: false, keepForVerify: true },
  async verify(row, _response, ctx) {
    const sandbox = await ctx.tools.sandbox();
    const content = await sandbox.download('/workspace/out/greeting.txt').then(String, () => '');
    return { reward: content.trim() === row.expected ? 1 : 0, found: content.trim() };
  },
});

/** Whether `pid` is a kernel fork server: the provider's, started at its first shell or kernel and kept while it lives. */
function isForkServer(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes('rollserve_forkserver');
  } catch {
    return false;
  }
}

/** Whether `pid`, a child of the test's process, is a bwrap provider's spawner: started at its first sandbox and kept while the provider lives. */
function isSpawner(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes('rs-spawner');
  } catch {
    return false;
  }
}

/** Processes below this one (by /proc ppid links), the provider's fork servers and spawner not counted (what they forked is). */
function descendants(root: number): number[] {
  const parents = new Map<number, number>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // gone meanwhile
    }
  }
  const found: number[] = [];
  const walk = (pid: number) => {
    // (the spawner's own forks, the sandboxes' guards, have its command line: only the child of the test's process is it)
    for (const [child, parent] of parents) if (parent === pid) (isForkServer(child) || (pid === root && isSpawner(child)) || found.push(child), walk(child));
  };
  walk(root);
  return found;
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

async function setup(script: FakeReply[] | ((r: { messages: unknown[] }) => FakeReply)): Promise<{ svc: RolloutService; fake: FakePolicy }> {
  const fake = await startFakePolicy({ script: script as never });
  const { service: svc, close } = await startTestRolloutService({ environments: [shell], backends: [fake.url] });
  cleanups.push(async () => {
    await close();
    await fake.close();
  });
  return { svc, fake };
}

const task = (id: string, expected = 'hello'): RolloutTaskInput => ({
  id,
  env: 'shell',
  row: { responses_create_params: { input: 'write a greeting' }, expected },
  policy: { model: 'fake-policy' },
});

describe('multi-turn bash rollouts on bwrap', () => {
  it('keeps cwd across turns, reports exit codes, and verifies in the agent sandbox', async () => {
    const { svc, fake } = await setup([
      { toolCalls: [{ name: 'bash', arguments: { command: 'mkdir -p out && cd out && echo hello > greeting.txt && pwd' } }] },
      { toolCalls: [{ name: 'bash', arguments: { command: 'cat greeting.txt; ls /root 2>&1 | head -1' } }] },
      { toolCalls: [{ name: 'bash', arguments: { command: 'false' } }] },
      'I wrote the greeting.',
    ]);
    const [submitted] = await svc.submit([task('b1')]);
    const result = await svc.wait(submitted!.rolloutIds[0]!);
    expect(result.error?.message ?? null).toBeNull();
    expect(result.critical_error).toBeNull();
    expect(result.reward).toBe(1);
    const outputs = result.turns.flatMap((t) => t.tool_calls.map((c) => c.output));
    expect(outputs[0]!.trim()).toBe('/workspace/out');
    expect(outputs[1]).toContain('hello');
    expect(outputs[1]).toMatch(/No such file|Permission denied|cannot access/); // the host's /root is not there
    expect(outputs[2]).toContain('[exit code: 1]');
    // Whether each command ran cleanly: the per-turn tool-success signal.
    expect(result.turns.flatMap((t) => t.tool_calls.map((c) => c.status))).toEqual(['ok', 'ok', 'error']);
    expect(result.turns.map((t) => t.rewards.tool)).toEqual([1, 1, 0, 1]);
    expect(fake.requests).toHaveLength(4);
    expect(svc.status().live_sandboxes).toBe(0);
  });

  it('runs rollouts in parallel, each in a sandbox of its own', async () => {
    const { svc } = await setup((request) => {
      const calls = (request.messages as Array<{ role: string }>).filter((m) => m.role === 'tool').length;
      if (calls === 0) return { toolCalls: [{ name: 'bash', arguments: { command: 'mkdir -p out; echo $RANDOM$RANDOM > out/greeting.txt; cat out/greeting.txt' } }] };
      return 'done';
    });
    const tasks = Array.from({ length: 8 }, (_, i) => task(`p${i}`, 'never-matches'));
    await svc.submit(tasks);
    const results = await Promise.all(tasks.map((t) => svc.wait(t.id!)));
    const seen = results.map((r) => r.verify_extras.found);
    expect(results.every((r) => r.critical_error === null)).toBe(true);
    // Each sandbox read back its own file: no sharing between rollouts.
    results.forEach((r) => expect(r.turns[0]!.tool_calls[0]!.output.trim()).toBe(r.verify_extras.found));
    expect(new Set(seen).size).toBe(8);
    expect(svc.status().live_sandboxes).toBe(0);
  });

  it('creates each row\'s own sandbox in INIT when the environment asks per row', async () => {
    const perRow = defineEnvironment({
      name: 'per-row',
      domain: 'agent',
      row: z.object({ tag: z.string() }),
      tools: { bash: bashTool },
      sandbox: { spec: (row) => ({ files: { '/workspace/tag.txt': String(row.tag) } }) },
      verify: (row, response) => ({ reward: JSON.stringify(response.output).includes(`tag=${row.tag}`) ? 1 : 0 }),
    });
    const fake = await startFakePolicy({
      script: (request) =>
        (request.messages as Array<{ role: string }>).some((m) => m.role === 'tool') ? 'done' : { toolCalls: [{ name: 'bash', arguments: { command: 'echo tag=$(cat tag.txt)' } }] },
    });
    const { service: svc, close } = await startTestRolloutService({ environments: [perRow], backends: [fake.url] });
    cleanups.push(async () => {
      await close();
      await fake.close();
    });
    const tasks = ['alpha', 'beta', 'gamma'].map((tag): RolloutTaskInput => ({ id: tag, env: 'per-row', row: { responses_create_params: { input: `tag ${tag}` }, tag }, policy: { model: 'fake-policy' } }));
    await svc.submit(tasks);
    const results = await Promise.all(tasks.map((t) => svc.wait(t.id!)));
    expect(results.map((r) => r.turns[0]!.tool_calls[0]!.output.trim())).toEqual(['tag=alpha', 'tag=beta', 'tag=gamma']);
    expect(results.every((r) => r.reward === 1)).toBe(true);
  });

  it('frees the sandbox and its processes when cancelled during a running command', async () => {
    const { svc } = await setup([{ toolCalls: [{ name: 'bash', arguments: { command: 'sleep 60' } }] }, 'never reached']);
    const before = descendants(process.pid).length;
    await svc.submit([task('cancel-me')]);
    while (svc.status().live_sandboxes === 0 || (await svc.get('cancel-me'))?.state !== 'run') await new Promise((r) => setTimeout(r, 10));
    await new Promise((r) => setTimeout(r, 200)); // the command is running
    expect(descendants(process.pid).length).toBeGreaterThan(before);
    await svc.cancel('cancel-me');
    const result = await svc.wait('cancel-me');
    expect(result.state).toBe('cancelled');
    expect(svc.status().live_sandboxes).toBe(0);
    const deadline = Date.now() + 5_000;
    while (descendants(process.pid).length > before && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(descendants(process.pid).length).toBeLessThanOrEqual(before);
  });
});
