import { createPythonTool, defineEnvironment, defineTool } from '@rollserve/core';
import { createBwrapProvider, type SandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { call, cookieHeader, startFakePolicy, startTestRolloutService, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { liveSandboxes, submitAndWait, type HttpService } from './http-rollout.ts';

// Machine load must not change rewards: starting the sandbox, the shell and the Python kernel is
// infrastructure work. It belongs to INIT under the task's `init_timeout_s`, never to the policy's
// `tool_timeout_s`; a start that does not finish in time is a filtered infrastructure failure, not
// a tool error the policy is scored on. The slow start here is real: every Python in the sandbox
// imports a sitecustomize that sleeps `delay` seconds before the kernel can listen.

const Row = z.object({ delay: z.number() });

/** The sandbox of a row: a Python that takes `delay` s to start. */
const slowPython = (row: { delay: number }) => ({
  files: { '/workspace/.slow/sitecustomize.py': `import time\ntime.sleep(${row.delay})\n` },
  env: { PYTHONPATH: '/workspace/.slow' },
});

/** Reward 1 when a tool printed the product the policy asks for (`6*7`). */
const verify = (_row: unknown, response: { output: unknown[] }) => {
  const outputs = response.output.filter((item) => (item as { type?: string }).type === 'function_call_output');
  return { reward: outputs.some((item) => String((item as { output?: unknown }).output).includes('42')) ? 1 : 0 };
};

/** The core `execute_python` tool: its kernel starts in INIT. */
const eager = defineEnvironment({
  name: 'eager_python',
  domain: 'other',
  row: Row,
  tools: { execute_python: createPythonTool() },
  sandbox: { spec: slowPython },
  verify,
});

/** A tool that starts the kernel itself, at its first call (no `prepare`), limited to 1 s a call on the NeMo Gym face. */
const lazy = defineEnvironment({
  name: 'lazy_python',
  domain: 'other',
  row: Row,
  tools: {
    execute_python: defineTool({
      description: 'Run Python code',
      parameters: z.object({ code: z.string() }),
      timeoutMs: 1_000,
      handler: async ({ code }, ctx) => (await (await ctx.tools.python()).run(code, { timeoutMs: 60_000 })).stdout,
    }),
  },
  sandbox: { spec: slowPython },
  verify,
});

/** Like math_with_code's tool: a kernel that does not start becomes a `success: false` answer. */
const swallowing = defineEnvironment({
  name: 'swallowing_python',
  domain: 'other',
  row: Row,
  tools: {
    execute_python: defineTool({
      description: 'Run Python code',
      parameters: z.object({ code: z.string() }),
      succeeded: (output: { success: boolean }) => output.success,
      handler: async ({ code }, ctx) => {
        try {
          const ran = await (await ctx.tools.python()).run(code, { timeoutMs: 60_000 });
          return { success: ran.status === 'ok', stdout: ran.stdout };
        } catch (error) {
          return { success: false, stdout: '', error: String(error) };
        }
      },
    }),
  },
  sandbox: { spec: slowPython },
  verify,
});

/** The policy: one Python call with the code the task's first message names, then an answer. */
function script(req: { messages: unknown[] }, ctx: { turn: number }): FakeReply {
  const user = req.messages.find((m) => (m as { role?: string }).role === 'user') as { content: string };
  if (ctx.turn === 0) return { toolCalls: [{ name: 'execute_python', arguments: { code: user.content.split('|')[1]! } }] };
  return 'I ran it.';
}

let fake: FakePolicy;
let server: RolloutServer;
const TOKEN = 'startup-token';
const auth = { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' };

beforeAll(async () => {
  fake = await startFakePolicy({ script: script as never });
  server = await startRolloutServer({ environments: [eager, lazy, swallowing], token: TOKEN, llmBackends: [fake.url] });
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

interface WireResult {
  state: string;
  reward: number;
  filter: boolean;
  critical_error: string | null;
  error: { code: string; message: string } | null;
  turns: Array<{ tool_calls: Array<{ status: string; output: string }> }>;
  timing: { init: { active_ms: number } };
}

/** Submits one task over HTTP and waits for its result. */
const rollout = (id: string, env: string, delay: number, code: string, limits: Record<string, unknown>) =>
  submitAndWait<WireResult>(service(), { id, env, row: { responses_create_params: { input: `run|${code}` }, delay }, policy: { model: 'fake-policy' }, limits });

const service = (): HttpService => ({ url: server.url, token: TOKEN });

describe('start-up is not charged to the policy', { timeout: 120_000 }, () => {
  it('starts the kernel in INIT: a first call shorter than the start succeeds and the reward is the policy\'s', async () => {
    const result = await rollout('eager-slow', 'eager_python', 3, 'print(6*7)', { tool_timeout_s: 1 });
    expect(result.error).toBeNull();
    expect(result.turns[0]!.tool_calls[0]!.status).toBe('ok');
    expect(result.reward).toBe(1);
    expect(result.filter).toBe(false);
    // the kernel's start (its 3 s sleep included) is INIT's time now, not the call's
    expect(result.timing.init.active_ms).toBeGreaterThanOrEqual(3_000);
  });

  it('charges INIT to init_timeout_s, not to the rollout\'s time limit', async () => {
    const result = await rollout('eager-slow-run', 'eager_python', 3, 'print(6*7)', { tool_timeout_s: 1, time_limit_s: 2 });
    expect(result.critical_error).toBeNull();
    expect(result.reward).toBe(1);
  });

  it('leaves a start at first use out of the tool time limit', async () => {
    const result = await rollout('lazy-slow', 'lazy_python', 3, 'print(6*7)', { tool_timeout_s: 1 });
    expect(result.error).toBeNull();
    expect(result.turns[0]!.tool_calls[0]!.status).toBe('ok');
    expect(result.reward).toBe(1);
    expect(result.filter).toBe(false);
  });

  it('leaves a start at first use out of the rollout\'s time limit too', async () => {
    const result = await rollout('lazy-slow-run', 'lazy_python', 3, 'print(6*7)', { tool_timeout_s: 1, time_limit_s: 2 });
    expect(result.critical_error).toBeNull();
    expect(result.turns[0]!.tool_calls[0]!.status).toBe('ok');
    expect(result.reward).toBe(1);
  });

  it('still holds the policy\'s own code to the tool time limit', async () => {
    const result = await rollout('eager-own', 'eager_python', 0, 'import time; time.sleep(30)', { tool_timeout_s: 1 });
    expect(result.turns[0]!.tool_calls[0]!.status).toBe('timeout');
    expect(result.critical_error).toBeNull();
    expect(result.filter).toBe(false);
    expect(result.reward).toBe(0);
  });

  it('ends a rollout whose kernel misses the INIT limit as a filtered infrastructure failure', async () => {
    const before = fake.requests.length;
    const result = await rollout('eager-late', 'eager_python', 60, 'print(6*7)', { init_timeout_s: 1, tool_timeout_s: 600 });
    expect(result.state).toBe('failed');
    expect(result.critical_error).toBe('init');
    expect(result.filter).toBe(true);
    expect(result.turns).toEqual([]);
    // the policy was never asked: nothing of this sample is the policy's
    expect(fake.requests.length).toBe(before);
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('ends a rollout whose kernel misses the start limit at first use as a filtered infrastructure failure', async () => {
    for (const env of ['lazy_python', 'swallowing_python']) {
      const result = await rollout(`${env}-late`, env, 60, 'print(6*7)', { init_timeout_s: 1, tool_timeout_s: 600 });
      expect(result.state, env).toBe('failed');
      expect(result.critical_error, env).toBe('init');
      expect(result.filter, env).toBe(true);
      expect(result.error?.message, env).toMatch(/did not start/);
    }
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('refuses a bad init_timeout_s with a 422 naming it', async () => {
    const submitted = await request(`${server.url}/v1/rollouts`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({ env: 'eager_python', row: { responses_create_params: { input: 'x' }, delay: 0 }, policy: { model: 'fake-policy' }, limits: { init_timeout_s: -1 } }),
    });
    const body = (await submitted.body.json()) as { error: { details: Array<{ code: string; path: unknown[] }> } };
    expect(submitted.statusCode).toBe(422);
    expect(body.error.details).toContainEqual(expect.objectContaining({ code: 'too_small', path: ['limits', 'init_timeout_s'] }));
  });

  it('leaves a start out of a tool\'s time limit on the NeMo Gym face too', async () => {
    const app = createResourcesServer(lazy);
    const gym = await serveFetch(app);
    try {
      const seed = await call(gym.url, 'POST', '/seed_session', { delay: 3 });
      const cookie = cookieHeader(seed.setCookies);
      const ran = await call(gym.url, 'POST', '/execute_python', { code: 'print(6*7)' }, { cookie });
      expect(ran.status).toBe(200);
      expect(ran.text).toContain('42');
      // the call's own work is still held to the limit
      const slow = await call(gym.url, 'POST', '/execute_python', { code: 'import time; time.sleep(30)' }, { cookie });
      expect(slow.status).toBe(504);
    } finally {
      await gym.close();
      await app.close();
    }
  });
});

describe('math_with_code on a loaded machine', { timeout: 120_000 }, () => {
  /** bwrap, where every Python takes `delay` s to start: the kernel's start under load, for an environment without a sandbox spec. */
  function slowProvider(delay: number): SandboxProvider {
    const inner = createBwrapProvider();
    return {
      name: 'slow-python',
      create: (spec = {}) =>
        inner.create({
          ...spec,
          files: { ...spec.files, '/workspace/.slow/sitecustomize.py': `import time\ntime.sleep(${delay})\n` },
          env: { ...spec.env, PYTHONPATH: '/workspace/.slow' },
        }),
      close: async () => inner.close?.(),
    };
  }

  /** Computes with the tool, then answers what the tool printed. */
  function mathPolicy(req: { messages: unknown[] }, ctx: { turn: number }): FakeReply {
    if (ctx.turn === 0) return { toolCalls: [{ name: 'execute_python', arguments: { code: 'print(6*7)' } }] };
    const tool = req.messages.findLast((m) => (m as { role?: string }).role === 'tool') as { content: string };
    let printed = '';
    try {
      printed = String((JSON.parse(tool.content) as { stdout?: unknown }).stdout ?? '').trim();
    } catch {
      // not the tool's answer: nothing printed
    }
    return `The answer is \\boxed{${printed}}.`;
  }

  const row = {
    responses_create_params: {
      input: [{ role: 'user', content: 'What is 6*7? Use execute_python.' }],
      tools: [
        { type: 'function', name: 'execute_python', description: 'Execute Python code', parameters: { type: 'object', properties: { code: { type: 'string' } }, required: ['code'] } },
        { type: 'function', name: 'end_session', description: 'Clean up', parameters: { type: 'object', properties: {} } },
      ],
    },
    expected_result: '42',
  };

  it('scores the policy, not the kernel\'s start: a 3 s start under a 1 s tool limit', async () => {
    const policy = await startFakePolicy({ script: mathPolicy as never });
    const provider = slowProvider(3);
    const { service, close } = await startTestRolloutService({ environments: [math], backends: [policy.url], sandboxProvider: provider });
    try {
      const [submitted] = await service.submit([{ id: 'mwc-slow', env: 'math', n: 2, row, policy: { model: 'fake-policy' }, limits: { tool_timeout_s: 1 } }]);
      const results = await Promise.all(submitted!.rolloutIds.map((id) => service.wait(id)));
      for (const result of results) {
        expect(result.error).toBeNull();
        expect(result.turns[0]!.tool_calls[0]!.status).toBe('ok');
        expect(result.reward).toBe(1);
        expect(result.filter).toBe(false);
      }
      expect(service.status().live_sandboxes).toBe(0);
    } finally {
      await close();
      await provider.close?.();
      await policy.close();
    }
  });
});

describe('a verify that cannot score', { timeout: 60_000 }, () => {
  it('filters a sample whose judge is down (NeMo Gym\'s _ng_failure_class) instead of training on reward 0', async () => {
    const probe = createServer().listen(0, '127.0.0.1');
    await once(probe, 'listening');
    const { port } = probe.address() as { port: number };
    await new Promise((resolve) => probe.close(resolve)); // nothing listens there now
    const policy = await startFakePolicy({ script: ((req: { messages: Array<{ content?: unknown }> }) => `\\boxed{${String(req.messages.at(-1)?.content).includes('right') ? 8 : 9}}`) as never });
    const { service, close } = await startTestRolloutService({
      environments: [math],
      environmentConfigs: { math: { should_use_judge: true, judge_base_url: `http://127.0.0.1:${port}/v1`, judge_model: 'judge' } },
      backends: [policy.url],
    });
    try {
      const task = (id: string, text: string) => ({
        id,
        env: 'math',
        row: { responses_create_params: { input: text }, question: 'What is 3+5?', expected_answer: '8' },
        policy: { model: 'fake-policy' },
      });
      const submitted = await service.submit([task('judged-wrong', 'What is 3+5? wrong'), task('judged-right', 'What is 3+5? right')]);
      const [wrong, right] = await Promise.all(submitted.map((t) => service.wait(t.rolloutIds[0]!)));
      expect(wrong!.verify_extras._ng_failure_class).toBe('judge_failed');
      expect(wrong!.critical_error).toBe('eval');
      expect(wrong!.filter).toBe(true);
      expect(wrong!.error?.message).toMatch(/judge_failed/);
      // an answer the library grades right needs no judge: the policy's reward
      expect(right!.reward).toBe(1);
      expect(right!.filter).toBe(false);
    } finally {
      await close();
      await policy.close();
    }
  });
});

