import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFakePolicy, workspaceRoot, type FakePolicy } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// `rollserve rollout`, NeMo Gym's ng_collect_rollouts for rollserve: the built CLI against a
// scripted policy, then again on the same output to show it resumes.

const bin = join(workspaceRoot(), 'packages', 'core', 'bin', 'rollserve.js');
let fake: FakePolicy;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rollserve-collect-'));
  // Right for "1+1", wrong for "2+2", and a time-out (an infrastructure failure) for "3+3": the
  // policy never answers it; the others have ample time even on a loaded machine.
  fake = await startFakePolicy({
    script: (request) => {
      const question = JSON.stringify(request.messages);
      if (question.includes('3+3')) return { content: 'never', hang: true };
      return question.includes('1+1') ? 'So \\boxed{2}.' : 'So \\boxed{5}.';
    },
  });
});
afterAll(async () => {
  await fake?.close();
  await rm(dir, { recursive: true, force: true });
});

function run(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [bin, 'rollout', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' } });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => (stdout += c));
  child.stderr!.on('data', (c: Buffer) => (stderr += c));
  return once(child, 'exit').then(([code]) => ({ code: code as number | null, stdout, stderr }));
}

describe('rollserve rollout', () => {
  it('writes sorted results, failures and aggregate metrics, and resumes without re-running', async () => {
    const input = join(dir, 'rows.jsonl');
    const output = join(dir, 'out.jsonl');
    const row = (q: string, a: string) => JSON.stringify({ responses_create_params: { input: [{ role: 'user', content: `What is ${q}?` }] }, question: `What is ${q}?`, expected_answer: a });
    writeFileSync(input, `${row('1+1', '2')}\n${row('2+2', '4')}\n${row('3+3', '6')}\n`);
    const args = ['--env', 'math', '--input', input, '--output', output, '--policy', fake.url, '--model', 'fake-policy', '--n', '2', '--time-limit', '10'];
    const first = await run(args);
    expect(first.code, first.stderr).toBe(0);
    expect(first.stdout).toContain('4 rollouts written');
    expect(first.stdout).toMatch(/\[\d\/6\] task-0:0 reward=1/);
    const lines = readFileSync(output, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.map((l) => [l._ng_task_index, l._ng_rollout_index, l.reward])).toEqual([
      [0, 0, 1],
      [0, 1, 1],
      [1, 0, 0],
      [1, 1, 0],
    ]);
    expect(lines[2]).toMatchObject({ question: 'What is 2+2?', expected_answer: '4', extracted_answer: '5', library_reward: 0 });
    expect((lines[0]!.rollserve as { turns: unknown[] }).turns).toHaveLength(1);
    const failures = readFileSync(join(dir, 'out_failures.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { _ng_task_index: number; rollserve: { critical_error: string } });
    expect(failures.map((f) => [f._ng_task_index, f.rollserve.critical_error])).toEqual([
      [2, 'timeout'],
      [2, 'timeout'],
    ]);
    const [metrics] = JSON.parse(readFileSync(join(dir, 'out_aggregate_metrics.json'), 'utf8')) as Array<{ agent_metrics: Record<string, number>; group_level_metrics: unknown[]; key_metrics: Record<string, number> }>;
    expect(metrics!.agent_metrics['mean/reward']).toBe(0.5);
    expect(metrics!.group_level_metrics).toHaveLength(2);
    expect(metrics!.key_metrics['pass@2/symbolic_accuracy']).toBe(50);

    // Again on the same output: everything is known, nothing is sent to the policy.
    const calls = fake.requests.length;
    const second = await run(args);
    expect(second.code, second.stderr).toBe(0);
    expect(second.stdout).toContain('resuming: 6/6 rollouts already finished');
    expect(fake.requests.length).toBe(calls);
    expect(readFileSync(output, 'utf8').trim().split('\n')).toHaveLength(4);
  }, 60_000);
});
