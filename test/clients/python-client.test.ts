// The Python client (clients/python, importable as `rollserve`) against a real rollout service:
// this file starts the service (token required) and a scripted policy, then runs the client's
// pytest suite with Debian's python3, pointing it at them through the environment.
import { spawn } from 'node:child_process';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { defineEnvironment } from '@rollserve/core';
import { createResourcesServer, serveFetch, type RunningServer } from '@rollserve/core/gym';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { counterEnvironment, startFakePolicy, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PYTHON = '/usr/bin/python3';
const TOKEN = 'py-client-token';

/**
 * Reward 1 when the policy's output contains `expected`; `expected: "!judge-down"` is verify saying
 * it could not score (NeMo Gym's `_ng_failure_class`): a filtered sample that keeps its tokens.
 */
const echo = defineEnvironment({
  name: 'pyclient',
  domain: 'other',
  row: z.object({ expected: z.string() }),
  verify: (row, response) =>
    row.expected === '!judge-down'
      ? { reward: 0, _ng_failure_class: 'JudgeUnavailable', _ng_failure_message: 'the judge is down' }
      : { reward: JSON.stringify(response.output).includes(row.expected) ? 1 : 0 },
});

/** The policy's script, keyed on the first user message: see clients/python/tests/conftest.py. */
function script(request: { messages: unknown[] }, ctx: { turn: number; callIndex: number }): FakeReply {
  const user = request.messages.find((m) => (m as { role?: string }).role === 'user') as { content?: unknown } | undefined;
  const text = typeof user?.content === 'string' ? user.content : JSON.stringify(user?.content ?? '');
  if (text.startsWith('hang')) return { content: 'x', hang: true };
  const slow = /^slow (\d+)/.exec(text);
  if (slow) return { content: `answer: ${text}`, latencyMs: Number(slow[1]) };
  if (text.startsWith('count')) return ctx.turn === 0 ? { toolCalls: [{ name: 'increment_counter', arguments: { count: 2 } }] } : 'done';
  if (text.startsWith('coin')) return ctx.callIndex % 2 === 0 ? 'heads' : 'tails';
  // a tool call, then a policy that refuses the next prompt: a filtered sample with one turn of tokens
  if (text.startsWith('broken')) return ctx.turn === 0 ? { toolCalls: [{ name: 'increment_counter', arguments: { count: 1 } }] } : { status: 400, errorMessage: 'the prompt is too long' };
  return `answer: ${text}`;
}

/**
 * A TCP proxy to the service that cuts the first `maxDrops` result streams in the middle of
 * their second result line (mid-chunk), as a dying load balancer would.
 */
async function startDroppingProxy(target: URL, maxDrops: number): Promise<{ url: string; drops: () => number; close: () => Promise<void> }> {
  let drops = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    sockets.add(client);
    const upstream = createConnection({ host: target.hostname, port: Number(target.port) });
    sockets.add(upstream);
    let kind: 'unknown' | 'stream' | 'plain' = 'unknown';
    let seen = '';
    let relayed = 0;
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('data', (data: Buffer) => {
      if (kind === 'unknown') kind = data.toString('latin1').startsWith('GET /v1/rollouts/stream') && drops < maxDrops ? 'stream' : 'plain';
      upstream.write(data);
    });
    upstream.on('data', (data: Buffer) => {
      if (kind !== 'stream') return void client.write(data);
      seen += data.toString('latin1');
      const first = seen.indexOf('"task_id"');
      const second = first < 0 ? -1 : seen.indexOf('"task_id"', first + 1);
      if (second < 0) {
        relayed += data.length;
        return void client.write(data);
      }
      drops++;
      client.write(data.subarray(0, second + 10 - relayed), end);
    });
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    drops: () => drops,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

function run(command: string, args: string[], env: Record<string, string>): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    // Asynchronous: the service answering the client lives in this process.
    const child = spawn(command, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, output }));
  });
}

let fake: FakePolicy;
/** The same script, writing tool calls as Python's json.dumps does: chat rollouts with a tool call drift (test_training.py, test_user_paths.py). */
let drifting: FakePolicy;
let server: RolloutServer;
let proxy: Awaited<ReturnType<typeof startDroppingProxy>>;
/** A service with no LLM backend: its submits are warned (test_warnings.py). */
let bare: RolloutServer;
/** An environment's resources server, where a user may point the client by mistake. */
let environment: RunningServer;

beforeAll(async () => {
  fake = await startFakePolicy({ script });
  drifting = await startFakePolicy({ script, drifting: true });
  server = await startRolloutServer({ environments: [echo, counterEnvironment], token: TOKEN, llmBackends: [fake.url], defaultModel: 'fake-policy' });
  proxy = await startDroppingProxy(new URL(server.url), 3);
  bare = await startRolloutServer({ environments: [echo], token: TOKEN });
  environment = await serveFetch(createResourcesServer(echo));
});
afterAll(async () => {
  await environment?.close();
  await bare?.close();
  await proxy?.close();
  await server?.close();
  await drifting?.close();
  await fake?.close();
});

describe('the Python client (clients/python)', () => {
  it('passes its pytest suite against a running service', { timeout: 600_000 }, async () => {
    // -rs: each skip's reason in the output, which must name torch (the only part allowed to skip).
    const { code, output } = await run(PYTHON, ['-m', 'pytest', '-q', '-rs', '-p', 'no:cacheprovider', 'clients/python/tests'], {
      ROLLSERVE_URL: server.url,
      ROLLSERVE_TOKEN: TOKEN,
      ROLLSERVE_POLICY_URL: fake.url,
      ROLLSERVE_DRIFTING_POLICY_URL: drifting.url,
      ROLLSERVE_FLAKY_URL: proxy.url,
      ROLLSERVE_BARE_URL: bare.url,
      ROLLSERVE_ENV_URL: environment.url,
      PYTHONPATH: `${ROOT}clients/python/src`,
      PYTHONDONTWRITEBYTECODE: '1',
    });
    if (code !== 0) console.error(output);
    else console.log(`pytest: ${output.trim().split('\n').at(-1)}; streams cut by the proxy: ${proxy.drops()}`);
    expect(code, output).toBe(0);
    expect(output).toMatch(/\d+ passed/);
    expect(output).not.toMatch(/xfail/);
    // Only the torch tensors may be skipped, and only where torch is not installed (Debian's python3 has none).
    for (const line of output.split('\n').filter((l) => l.startsWith('SKIPPED'))) expect(line).toMatch(/torch is not installed/);
    // The reconnect test went through the proxy, which did cut streams.
    expect(proxy.drops()).toBeGreaterThan(0);
  });
});
