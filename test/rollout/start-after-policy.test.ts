import { createPythonTool, defineEnvironment, defineTool } from '@rollserve/core';
import { createBwrapProvider, type Sandbox, type SandboxProvider } from '@rollserve/core/sandbox';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { startFakePolicy, startTestRolloutService, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { liveSandboxes, submitAndWait, type HttpService } from './http-rollout.ts';

// A start that fails is infrastructure (filtered, critical_error "init") only while nothing the
// policy did can have caused it. Once the policy has acted in its sandbox it can break the next
// start on purpose: plant a hook where the kernel's interpreter reads, fill the directory the
// kernel's socket goes to, then end its kernel (end_session) or kill it. Were that failure
// filtered, a policy that learnt to do it would turn every bad sample into one that is never
// trained on. So after the policy acted a failed start is the call's error, and the sample is
// scored. Everything here is real: bwrap sandboxes, the kernel, the service over HTTP.

/** The operator puts a hooks directory on the kernel's PYTHONPATH (the sandbox spec's env); the row gives its sitecustomize. */
const Row = z.object({ hook: z.string().default('') });

const hooked = (row: { hook: string }) => ({
  files: { '/workspace/.hooks/sitecustomize.py': row.hook },
  env: { PYTHONPATH: '/workspace/.hooks' },
});

/** Reward 1 when a tool printed 42. */
const verify = (_row: unknown, response: { output: unknown[] }) => {
  const outputs = response.output.filter((item) => (item as { type?: string }).type === 'function_call_output');
  return { reward: outputs.some((item) => String((item as { output?: unknown }).output).includes('42')) ? 1 : 0 };
};

/** The core Python tool (its kernel starts in INIT) and an end_session that stops the kernel, as math_with_code's does. */
const resettable = defineEnvironment({
  name: 'resettable_python',
  domain: 'other',
  row: Row,
  tools: {
    execute_python: createPythonTool(),
    end_session: defineTool({
      description: 'Stop the Python session',
      parameters: z.object({}),
      handler: async (_args, ctx) => {
        await ctx.tools.resetPython();
        return 'session ended';
      },
    }),
  },
  sandbox: { spec: hooked },
  verify,
});

/**
 * A tool that reaches the sandbox without `ctx.tools` (one seedSession kept in the session's
 * state) beside a Python tool that starts its kernel at first use.
 */
const bypassing = defineEnvironment({
  name: 'bypassing_python',
  domain: 'other',
  row: Row,
  tools: {
    run: defineTool({
      description: 'Run a shell command',
      parameters: z.object({ command: z.string() }),
      handler: async ({ command }, ctx) => {
        const ran = await (ctx.session.state.box as Sandbox).exec(command);
        return `${ran.stdout}${ran.stderr}`;
      },
    }),
    execute_python: defineTool({
      description: 'Run Python code',
      parameters: z.object({ code: z.string() }),
      handler: async ({ code }, ctx) => (await (await ctx.tools.python()).run(code)).stdout,
    }),
  },
  sandbox: { spec: hooked },
  async seedSession(_row, ctx) {
    ctx.session.state.box = await ctx.tools.sandbox();
  },
  verify,
});

/** The policy runs the steps the task's first message lists (JSON after `steps|`), one a turn, then answers. */
function script(req: { messages: unknown[] }, ctx: { turn: number }): FakeReply {
  const user = req.messages.find((m) => (m as { role?: string }).role === 'user') as { content: string };
  const steps = JSON.parse(user.content.slice(user.content.indexOf('|') + 1)) as Array<{ name: string; arguments: Record<string, unknown> }>;
  const step = steps[ctx.turn];
  return step === undefined ? 'Done.' : { toolCalls: [step] };
}

const python = (code: string) => ({ name: 'execute_python', arguments: { code } });
const endSession = { name: 'end_session', arguments: {} };
/** Cell code that writes `text` to `path`. */
const plant = (path: string, text: string) => python(`open(${JSON.stringify(path)}, 'w').write(${JSON.stringify(text)})`);

let fake: FakePolicy;
let server: RolloutServer;
const TOKEN = 'start-after-policy-token';

beforeAll(async () => {
  fake = await startFakePolicy({ script: script as never });
  server = await startRolloutServer({ environments: [resettable, bypassing], token: TOKEN, llmBackends: [fake.url] });
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
  turns: Array<{ tool_calls: Array<{ name: string; status: string; output: string }> }>;
}

/** Submits one task whose policy runs `steps`, over HTTP, and waits for its result. */
const rollout = (id: string, steps: unknown[], limits: Record<string, unknown>, hook = '', env = 'resettable_python') =>
  submitAndWait<WireResult>(service(), { id, env, row: { responses_create_params: { input: `steps|${JSON.stringify(steps)}` }, hook }, policy: { model: 'fake-policy' }, limits });

const service = (): HttpService => ({ url: server.url, token: TOKEN });

/** The rollout was scored as the policy's: not failed, not filtered, and the policy had its turn after the broken call. */
function expectScored(result: WireResult, turns: number): void {
  expect(result.state, JSON.stringify(result.error)).toBe('done');
  expect(result.critical_error).toBeNull();
  expect(result.filter).toBe(false);
  expect(result.error).toBeNull();
  expect(result.turns).toHaveLength(turns);
}

const print42 = python('print(6*7)');

describe('a start the policy can have broken is its own', { timeout: 180_000 }, () => {
  it('times out a kernel restart after end_session when the policy planted a slow hook: the call\'s error, scored', async () => {
    const result = await rollout('slow-hook', [plant('/workspace/.hooks/sitecustomize.py', 'import time\ntime.sleep(600)\n'), endSession, print42], {
      init_timeout_s: 8,
      tool_timeout_s: 600,
    });
    expectScored(result, 4);
    const call = result.turns[2]!.tool_calls[0]!;
    expect(call.status).toBe('error');
    expect(call.output).toMatch(/did not start/);
    expect(result.reward).toBe(0);
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('fails a restart whose hook exits, and a start the policy cannot make a socket for: the call\'s error, scored', async () => {
    const exiting = await rollout('exit-hook', [plant('/workspace/.hooks/sitecustomize.py', 'raise SystemExit(3)\n'), endSession, print42], { tool_timeout_s: 600 });
    expectScored(exiting, 4);
    expect(exiting.turns[2]!.tool_calls[0]!.status).toBe('error');
    expect(exiting.reward).toBe(0);

    // no hook at all: the directory of the kernel's socket is full of the policy's files
    const fill = python(
      ['import os', 'n = 0', 'while True:', '    try:', "        open('/run/rollserve/f%d' % n, 'w').close()", '    except OSError:', '        break', '    n += 1', 'print(n > 0)'].join('\n'),
    );
    const full = await rollout('full-socket-dir', [fill, endSession, print42], { tool_timeout_s: 600 });
    expectScored(full, 4);
    expect(full.turns[0]!.tool_calls[0]!.output).toContain('True');
    expect(full.turns[2]!.tool_calls[0]!.status).toBe('error');
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('keeps a kernel the policy killed, and could not restart, the call\'s error', async () => {
    const killed = await rollout(
      'kill-kernel',
      [plant('/workspace/.hooks/sitecustomize.py', 'raise SystemExit(3)\n'), python('import os; os.kill(os.getpid(), 9)'), print42],
      { tool_timeout_s: 600 },
    );
    expectScored(killed, 4);
    expect(killed.turns[1]!.tool_calls[0]!.status).toBe('error');
    expect(killed.turns[2]!.tool_calls[0]!.status).toBe('error');
    expect(killed.reward).toBe(0);
  });

  it('does not read hooks from the user site (python -s): a planted usercustomize or .pth cannot break the next start', async () => {
    const plantUserSite = python(
      [
        'import os, site',
        'd = site.getusersitepackages()',
        'os.makedirs(d, exist_ok=True)',
        "open(os.path.join(d, 'usercustomize.py'), 'w').write('raise SystemExit(3)\\n')",
        "open(os.path.join(d, 'zz-hook.pth'), 'w').write('import os; os._exit(4)\\n')",
        'print(d)',
      ].join('\n'),
    );
    const result = await rollout('user-site', [plantUserSite, endSession, print42], { tool_timeout_s: 600 });
    expectScored(result, 4);
    expect(result.turns[0]!.tool_calls[0]!.output).toContain('site-packages');
    expect(result.turns[2]!.tool_calls[0]!.status).toBe('ok');
    expect(result.reward).toBe(1);
  });

  it('counts a call that reached the sandbox without ctx.tools as acting: a first-use start after it is the call\'s error', async () => {
    const steps = [{ name: 'run', arguments: { command: "echo 'raise SystemExit(3)' > /workspace/.hooks/sitecustomize.py" } }, print42];
    const result = await rollout('bypass', steps, { tool_timeout_s: 600 }, '', 'bypassing_python');
    expectScored(result, 3);
    expect(result.turns[1]!.tool_calls[0]!.status).toBe('error');
    expect(result.turns[1]!.tool_calls[0]!.output).toMatch(/did not start/);
    // the same first use with nothing done before it is infrastructure's
    const first = await rollout('bypass-first', [print42], { tool_timeout_s: 600 }, 'raise SystemExit(3)\n', 'bypassing_python');
    expect(first.critical_error).toBe('init');
    expect(first.filter).toBe(true);
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('counts the policy\'s own restarts against time_limit_s, so they cannot stretch a rollout past it', async () => {
    // each restart takes 3 s (the policy's hook) and is left out of each call's tool_timeout_s, not of the rollout's 5 s
    const steps = [plant('/workspace/.hooks/sitecustomize.py', 'import time\ntime.sleep(3)\n'), endSession, print42, endSession, print42, endSession, print42];
    const result = await rollout('slow-restarts', steps, { time_limit_s: 5, init_timeout_s: 60, tool_timeout_s: 600 });
    expect(result.critical_error).toBe('timeout');
    // its restarts are its own time: the time-out is the policy's, scored, not filtered
    expect(result.filter).toBe(false);
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('still filters a start that fails before the policy acted (the operator\'s hook breaks the kernel in INIT)', async () => {
    const before = fake.requests.length;
    const result = await rollout('init-hook', [print42], { tool_timeout_s: 600 }, 'raise SystemExit(3)\n');
    expect(result.state).toBe('failed');
    expect(result.critical_error).toBe('init');
    expect(result.filter).toBe(true);
    expect(result.turns).toEqual([]);
    expect(fake.requests.length).toBe(before);
    expect(await liveSandboxes(service())).toBe(0);
  });
});

describe('math_with_code: end_session, then a kernel that cannot start', { timeout: 120_000 }, () => {
  /** bwrap with the operator's hooks directory on PYTHONPATH (math_with_code has no sandbox spec of its own). */
  function hooksProvider(): SandboxProvider {
    const inner = createBwrapProvider();
    return {
      name: 'hooks-python',
      create: (spec = {}) =>
        inner.create({ ...spec, files: { ...spec.files, '/workspace/.hooks/sitecustomize.py': '' }, env: { ...spec.env, PYTHONPATH: '/workspace/.hooks' } }),
      close: async () => inner.close?.(),
    };
  }

  const steps = [plant('/workspace/.hooks/sitecustomize.py', 'raise SystemExit(3)\n'), endSession, print42];
  const mathPolicy = (_req: unknown, ctx: { turn: number }): FakeReply => {
    const step = steps[ctx.turn];
    return step === undefined ? 'The answer is \\boxed{42}.' : { toolCalls: [step] };
  };

  it('scores the sample (its tool swallows the error into success: false) instead of filtering it', async () => {
    const policy = await startFakePolicy({ script: mathPolicy as never });
    const provider = hooksProvider();
    const { service, close } = await startTestRolloutService({ environments: [math], backends: [policy.url], sandboxProvider: provider });
    try {
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
      const [submitted] = await service.submit([{ id: 'mwc-broken-restart', env: 'math', row, policy: { model: 'fake-policy' }, limits: { tool_timeout_s: 600 } }]);
      const result = await service.wait(submitted!.rolloutIds[0]!);
      expect(result.state, JSON.stringify(result.error)).toBe('done');
      expect(result.critical_error).toBeNull();
      expect(result.filter).toBe(false);
      expect(result.turns).toHaveLength(4);
      const broken = result.turns[2]!.tool_calls[0]!;
      expect(broken.status).toBe('error');
      expect(JSON.parse(broken.output)).toMatchObject({ success: false });
      expect(service.status().live_sandboxes).toBe(0);
    } finally {
      await close();
      await provider.close?.();
      await policy.close();
    }
  });
});
