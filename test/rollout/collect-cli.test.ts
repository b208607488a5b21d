import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { startFakePolicy, workspaceRoot, type FakePolicy } from '@rollserve/testing';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

// `rollserve rollout`, NeMo Gym's ng_collect_rollouts for rollserve: the built CLI against a
// scripted policy, in its own service or against a running one over HTTP.

const bin = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');
const TOKEN = 'collect-token-1';
let fake: FakePolicy;
let dir: string;
let inFlight = 0;
let peak = 0;
const children = new Set<ChildProcess>();

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rollserve-collect-'));
  // Right for "1+1", wrong for "2+2", and never an answer for "3+3" (the time limit ends it: an
  // infrastructure failure); each answer takes a moment, so that rollouts overlap when allowed to.
  fake = await startFakePolicy({
    script: async (request) => {
      const question = JSON.stringify(request.messages);
      if (question.includes('3+3')) return { content: 'never', hang: true };
      inFlight++;
      peak = Math.max(peak, inFlight);
      await new Promise((resolve) => setTimeout(resolve, 30));
      inFlight--;
      return question.includes('1+1') ? 'So \\boxed{2}.' : 'So \\boxed{5}.';
    },
  });
});
afterEach(() => {
  for (const child of children) child.kill('SIGKILL');
  children.clear();
});
afterAll(async () => {
  await fake?.close();
  await rm(dir, { recursive: true, force: true });
});

function start(args: string[]): { child: ChildProcess; done: Promise<{ code: number | null; stdout: string; stderr: string }> } {
  const child = spawn(process.execPath, [bin, 'rollout', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' } });
  children.add(child);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => (stdout += c));
  child.stderr!.on('data', (c: Buffer) => (stderr += c));
  const done = once(child, 'exit').then(([code]) => {
    children.delete(child);
    return { code: code as number | null, stdout, stderr };
  });
  return { child, done };
}
const run = (args: string[]) => start(args).done;

const row = (q: string, a: string) => JSON.stringify({ responses_create_params: { input: [{ role: 'user', content: `What is ${q}?` }] }, question: `What is ${q}?`, expected_answer: a });
function rowsFile(name: string, questions: Array<[string, string]>): string {
  const path = join(dir, name);
  writeFileSync(path, questions.map(([q, a]) => `${row(q, a)}\n`).join(''));
  return path;
}
const readLines = (path: string) =>
  existsSync(path)
    ? readFileSync(path, 'utf8')
        .split('\n')
        .filter((l) => l.trim() !== '')
        .map((l) => JSON.parse(l) as Record<string, unknown> & { rollserve: Record<string, unknown> })
    : [];

/** A port nothing listens on: bound, noted, closed. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe('rollserve rollout', () => {
  it('writes sorted results, failures and aggregate metrics, exits 1 for the failures, and resumes without re-running', async () => {
    const input = rowsFile('rows.jsonl', [
      ['1+1', '2'],
      ['2+2', '4'],
      ['3+3', '6'],
    ]);
    const output = join(dir, 'out.jsonl');
    const args = ['--env', 'math', '--input', input, '--output', output, '--policy', fake.url, '--model', 'fake-policy', '--n', '2', '--time-limit', '10'];
    const first = await run(args);
    expect(first.code, first.stderr).toBe(1);
    expect(first.stdout).toMatch(/\[\d\/6\] task-0-[0-9a-f]+:0 reward=1 \(\d failed, [\d.]+ rollouts\/s\)/);
    expect(first.stdout).toMatch(/\[\d\/6\] task-2-[0-9a-f]+:1 FAILED timeout: /);
    expect(first.stdout).toContain(`6 rollouts: 4 written to ${output} (mean reward 0.500), 2 failed`);
    expect(first.stderr).toContain('rollserve rollout: 2 of 6 rollouts failed');
    const lines = readLines(output);
    expect(lines.map((l) => [l._ng_task_index, l._ng_rollout_index, l.reward])).toEqual([
      [0, 0, 1],
      [0, 1, 1],
      [1, 0, 0],
      [1, 1, 0],
    ]);
    expect(lines[2]).toMatchObject({ question: 'What is 2+2?', expected_answer: '4', extracted_answer: '5', library_reward: 0 });
    // the result in the API's wire shape (snake_case)
    expect(lines[0]!.rollserve).toMatchObject({ sample_index: 0, critical_error: null, filter: false, state: 'done' });
    expect((lines[0]!.rollserve.turns as Array<Record<string, unknown>>)[0]).toHaveProperty('generation_token_ids');
    const failures = readLines(join(dir, 'out_failures.jsonl'));
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
    expect(second.code, second.stderr).toBe(1);
    expect(second.stdout).toContain('resumed: 6/6 rollouts were already finished');
    expect(fake.requests.length).toBe(calls);
    expect(readLines(output)).toHaveLength(4);
  }, 90_000);

  it('names the missing --model and a bad number, before doing anything', async () => {
    const input = rowsFile('model.jsonl', [['1+1', '2']]);
    const output = join(dir, 'model-out.jsonl');
    const missing = await run(['--env', 'math', '--input', input, '--output', output, '--policy', fake.url]);
    expect(missing.code).toBe(2);
    expect(missing.stderr.trim()).toBe('rollserve: option --model of "rollserve rollout" is required (Served model name, as the inference servers name it)');
    const bad = await run(['--env', 'math', '--input', input, '--output', output, '--policy', fake.url, '--model', 'fake-policy', '--limit', 'two']);
    expect(bad.code).toBe(1);
    expect(bad.stderr.trim()).toBe('rollserve rollout: --limit takes an integer >= 1, not "two"');
    const noPolicy = await run(['--env', 'math', '--input', input, '--output', output, '--model', 'fake-policy']);
    expect(noPolicy.code).toBe(1);
    expect(noPolicy.stderr).toContain('--policy is required without --service');
    expect(existsSync(output)).toBe(false);
  });

  it('--generation tokens calls the policy with token-id prompts; another value is one clear line', async () => {
    const input = rowsFile('tokens.jsonl', [['1+1', '2']]);
    const output = join(dir, 'tokens-out.jsonl');
    const completionsBefore = fake.completionRequests.length;
    const chatBefore = fake.requests.length;
    const result = await run(['--env', 'math', '--input', input, '--output', output, '--policy', fake.url, '--model', 'fake-policy', '--generation', 'tokens']);
    expect(result.code, result.stderr).toBe(0);
    expect(readLines(output).map((l) => l.reward)).toEqual([1]);
    expect(fake.completionRequests.length).toBe(completionsBefore + 1);
    expect(fake.completionRequests.at(-1)!.prompt).toEqual(expect.arrayContaining([expect.any(Number)]));
    expect(fake.requests.length - chatBefore).toBe(0); // no chat completion call
    const bad = await run(['--env', 'math', '--input', input, '--output', join(dir, 'tokens-bad.jsonl'), '--policy', fake.url, '--model', 'fake-policy', '--generation', 'token']);
    expect(bad.code).toBe(1);
    expect(bad.stderr.trim()).toBe(`rollserve rollout: --generation is 'chat' or 'tokens', not "token"`);
  }, 60_000);

  it('--limit takes the first rows; --concurrency bounds the rollouts in flight', async () => {
    const input = rowsFile('limit.jsonl', [
      ['1+1', '2'],
      ['2+2', '4'],
      ['1+1', '2'],
      ['3+3', '6'],
    ]);
    const output = join(dir, 'limit-out.jsonl');
    peak = 0;
    const result = await run(['--env', 'math', '--input', input, '--output', output, '--policy', fake.url, '--model', 'fake-policy', '--limit', '3', '--concurrency', '1', '--temperature', '0.5', '--top-p', '0.9', '--max-tokens', '64']);
    expect(result.code, result.stderr).toBe(0);
    expect(readLines(output).map((l) => [l._ng_task_index, l.reward])).toEqual([
      [0, 1],
      [1, 0],
      [2, 1],
    ]);
    expect(peak).toBe(1);
    const sent = fake.requests.at(-1)!;
    expect(sent).toMatchObject({ temperature: 0.5, top_p: 0.9, max_tokens: 64 });
  }, 60_000);

  it('appends each result as it finishes: a run killed while the last task stalls keeps the earlier ones', async () => {
    const input = rowsFile('stall.jsonl', [
      ['1+1', '2'],
      ['2+2', '4'],
      ['3+3', '6'],
    ]);
    const output = join(dir, 'stall-out.jsonl');
    const { child, done } = start(['--env', 'math', '--input', input, '--output', output, '--policy', fake.url, '--model', 'fake-policy']);
    while (readLines(output).length < 2) await new Promise((resolve) => setTimeout(resolve, 50));
    expect(child.exitCode).toBeNull(); // still waiting for 3+3
    child.kill('SIGKILL'); // a crash
    await done;
    expect(
      readLines(output)
        .map((l) => l.question)
        .sort(),
    ).toEqual(['What is 1+1?', 'What is 2+2?']);
  }, 60_000);

  describe('--service: a running rollout service over HTTP', () => {
    let server: RolloutServer;
    beforeAll(async () => {
      server = await startRolloutServer({ environments: [math], llmBackends: [fake.url], token: TOKEN });
    });
    afterAll(async () => {
      await server?.close();
    });

    it('submits there and reads the results from its stream', async () => {
      const input = rowsFile('service.jsonl', [
        ['1+1', '2'],
        ['2+2', '4'],
      ]);
      const output = join(dir, 'service-out.jsonl');
      const result = await run(['--service', server.url, '--token', TOKEN, '--env', 'math', '--input', input, '--output', output, '--model', 'fake-policy', '--n', '2', '--concurrency', '2']);
      expect(result.code, result.stderr).toBe(0);
      expect(result.stdout).toContain('4 rollouts: 4 written');
      expect(result.stdout).toContain('(mean reward 0.500)');
      const lines = readLines(output);
      expect(lines.map((l) => [l._ng_task_index, l._ng_rollout_index, l.reward])).toEqual([
        [0, 0, 1],
        [0, 1, 1],
        [1, 0, 0],
        [1, 1, 0],
      ]);
      // the service ran them
      for (const line of lines) expect((await server.service.result(String(line.rollserve.id)))?.reward).toBe(line.reward);
      const [metrics] = JSON.parse(readFileSync(join(dir, 'service-out_aggregate_metrics.json'), 'utf8')) as Array<{ agent_metrics: Record<string, number> }>;
      expect(metrics!.agent_metrics['mean/reward']).toBe(0.5);
    }, 60_000);

    it('streams 1,500 tasks of one run from the service (their ids in a POST body: a query string that long is an HTTP 431)', async () => {
      const input = rowsFile('many.jsonl', Array.from({ length: 1_500 }, (_, i): [string, string] => (i % 2 === 0 ? ['1+1', '2'] : ['2+2', '4'])));
      const output = join(dir, 'many-out.jsonl');
      const result = await run(['--service', server.url, '--token', TOKEN, '--env', 'math', '--input', input, '--output', output, '--model', 'fake-policy']);
      expect(result.code, result.stderr).toBe(0);
      expect(result.stdout).toContain('1500 rollouts: 1500 written');
      const lines = readLines(output);
      expect(lines.map((l) => l._ng_task_index)).toEqual(Array.from({ length: 1_500 }, (_, i) => i));
      expect(lines.map((l) => l.reward)).toEqual(Array.from({ length: 1_500 }, (_, i) => (i % 2 === 0 ? 1 : 0)));
    }, 300_000);

    it('a wrong token is one clear line', async () => {
      const input = rowsFile('token.jsonl', [['1+1', '2']]);
      const result = await run(['--service', server.url, '--token', 'wrong-token', '--env', 'math', '--input', input, '--output', join(dir, 'token-out.jsonl'), '--model', 'fake-policy']);
      expect(result.code).toBe(1);
      expect(result.stderr.trim()).toMatch(/^rollserve rollout: .*\/v1\/rollouts: HTTP 401: /);
    });

    it('a dead policy base_url fails the rollouts with the URL and the cause, and the command exits 1', async () => {
      const port = await closedPort();
      const dead = `http://127.0.0.1:${port}/v1`;
      const input = rowsFile('dead.jsonl', [['1+1', '2']]);
      const output = join(dir, 'dead-out.jsonl');
      const result = await run(['--service', server.url, '--token', TOKEN, '--env', 'math', '--input', input, '--output', output, '--model', 'fake-policy', '--policy', dead, '--n', '2']);
      expect(result.code).toBe(1);
      const failures = readLines(join(dir, 'dead-out_failures.jsonl'));
      expect(failures).toHaveLength(2);
      for (const failure of failures) {
        expect(failure.rollserve).toMatchObject({
          filter: true,
          critical_error: 'run',
          error: { code: 'LLM_BACKEND', message: `policy backend ${dead} unreachable: connect ECONNREFUSED 127.0.0.1:${port}` },
        });
      }
      expect(result.stderr).toContain(`2 × run: policy backend ${dead} unreachable: connect ECONNREFUSED`);
      expect(readLines(output)).toEqual([]);
    }, 60_000);
  });
});
