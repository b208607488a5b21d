import { once } from 'node:events';
import { readdirSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { removeStaleSandboxDirs } from '@rollserve/core/sandbox';
import { openStore, type RolloutResult } from '@rollserve/core/service';
import { startFakePolicy } from '@rollserve/testing';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { startChildService } from './fixtures/child-service.ts';

// The 202 of POST /v1/rollouts means the batch is stored: a service killed right after it runs
// every task of the batch after its restart, each rollout once.

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

/** The service of fixtures/sandboxed-server.ts in a child process; resolves with its URL. */
function startChild(options: { store: string; llm: string }, sandboxDir: string) {
  // the service's sandbox directories go to the test's own directory, so that what a killed
  // service leaves is found and swept by this test alone
  return startChildService('sandboxed-server.ts', options, cleanups, { TMPDIR: sandboxDir });
}

/** What the store holds, read by a connection of its own. */
async function stored(url: string): Promise<{ taskIds: string[]; resultIds: string[]; counts: Record<string, number> }> {
  const store = await openStore(url);
  try {
    const rollouts = (await store.listRollouts({ limit: 10_000 })).items;
    const results = (await store.listResults({ limit: 10_000 })).items;
    return { taskIds: [...new Set(rollouts.map((r) => r.taskId))], resultIds: results.map((r) => r.id), counts: await store.counts() };
  } finally {
    await store.close();
  }
}

describe('submitting to a sandboxed environment', () => {
  it('loses nothing when the service is killed right after the 202: every rollout runs once after the restart', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-submit-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const store = `sqlite://${join(dir, 'store.db')}`;
    const sandboxDir = join(dir, 'sandboxes');
    await mkdir(sandboxDir);
    // the sandbox uid (nobody, under a root service) makes its mounts from there
    await chmod(dir, 0o755);
    await chmod(sandboxDir, 0o755);
    const fake = await startFakePolicy({
      script: (req) => {
        const messages = req.messages as Array<{ role: string; content?: unknown }>;
        if (messages.some((m) => m.role === 'tool')) return 'done';
        const tag = JSON.stringify(messages).match(/tag (\w+)/)![1]!;
        return { toolCalls: [{ name: 'bash', arguments: { command: `echo tag-${tag}` } }] };
      },
    });
    cleanups.push(() => fake.close());
    const ids = Array.from({ length: 64 }, (_, i) => `k${i}`);
    const tasks = ids.map((id) => ({ id, env: 'shell', row: { responses_create_params: { input: `print tag ${id}` }, tag: id }, policy: { model: 'fake-policy' } }));

    const first = await startChild({ store, llm: fake.url }, sandboxDir);
    const response = await request(`${first.url}/v1/rollouts`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ tasks }) });
    first.child.kill('SIGKILL'); // right after the 202, before the batch has done anything much
    expect(response.statusCode).toBe(202);
    const accepted = (await response.body.json()) as { tasks: Array<{ task_id: string; existing: boolean }> };
    expect(accepted.tasks.map((t) => t.task_id)).toEqual(ids);
    await once(first.child, 'exit');
    expect((await stored(store)).taskIds).toEqual(ids);

    // The restart runs what the first process had accepted, by itself.
    const second = await startChild({ store, llm: fake.url }, sandboxDir);
    const stream = await request(`${second.url}/v1/rollouts/stream?ids=${ids.join(',')}`);
    const results = (await stream.body.text()).split('\n').filter((l) => l.trim() !== '').map((line) => JSON.parse(line) as RolloutResult);
    expect(results.map((r) => r.id).sort()).toEqual([...ids].sort());
    for (const result of results) expect({ id: result.id, state: result.state, reward: result.reward, error: result.error }).toEqual({ id: result.id, state: 'done', reward: 1, error: null });
    // Resubmitting the batch starts nothing new.
    const again = await request(`${second.url}/v1/rollouts`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ tasks }) });
    expect(again.statusCode).toBe(202);
    expect(((await again.body.json()) as { tasks: Array<{ existing: boolean }> }).tasks.every((t) => t.existing)).toBe(true);
    second.child.kill('SIGTERM');
    await once(second.child, 'exit');

    const after = await stored(store);
    expect(after.taskIds).toHaveLength(ids.length);
    expect(after.resultIds.sort()).toEqual([...ids].sort()); // each rollout finished exactly once
    expect(after.counts).toMatchObject({ queued: 0, leased: 0, done: ids.length });

    // What the killed service left (its sandboxes died with it): the start-up sweep removes it
    const left = (await readdir(sandboxDir)).filter((name) => name.startsWith('rollserve-rs-')).map((name) => name.slice('rollserve-'.length));
    await removeStaleSandboxDirs({ tmpDir: sandboxDir, minAgeMs: 0, ids: left });
    expect((await readdir(sandboxDir)).filter((name) => name.startsWith('rollserve-'))).toEqual([]);
    const cgroups = readdirSync('/sys/fs/cgroup', { recursive: true }).map(String);
    expect(cgroups.filter((path) => left.some((id) => path.endsWith(`rollserve-${id}`)))).toEqual([]);
  }, 120_000);
});
