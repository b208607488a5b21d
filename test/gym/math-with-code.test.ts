import math from '@rollserve/env-math';
import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import { call, cookieHeader, describeContract, nemoGymFixture, readJsonl, replayRollout, startFakePolicy, startTestRolloutService, type VerifyCase } from '@rollserve/testing';
import { readdirSync, readFileSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

// Tool-integrated math: the math environment as NeMo Gym's math_with_code, on real bwrap
// sandboxes with the persistent Python kernel.

type Row = Record<string, unknown> & { id: number; expected_result: string; responses_create_params: { input: Array<{ content: string }> } };
type Recorded = Record<string, unknown> & {
  responses_create_params: { input: Array<{ content: string }> };
  response: { output: Array<Record<string, unknown>> };
  reward: number;
  extracted_answer: string | null;
  accuracy: boolean;
};

const rows = readJsonl<Row>(nemoGymFixture('math_with_code', 'example.jsonl'));
const recorded = readJsonl<Recorded>(nemoGymFixture('math_with_code', 'example_rollouts.jsonl'));
const userPrompt = (params: { input: Array<{ content: string }> }) => params.input[params.input.length - 1]!.content;

/** Each recorded rollout with its dataset row (the rollouts do not echo expected_result). */
const cases = recorded.map((rollout, index) => {
  const row = rows.find((r) => userPrompt(r.responses_create_params) === userPrompt(rollout.responses_create_params));
  if (!row) throw new Error(`no example row for rollout ${index}`);
  // The row as the collector materialises it: the recorded (fully dumped) params, the row's fields.
  const { responses_create_params: _params, ...fields } = row;
  return { index, row: { ...fields, responses_create_params: rollout.responses_create_params, _ng_task_index: index, _ng_rollout_index: 0 }, rollout };
});

const EXTRAS = ['extracted_answer', 'accuracy'];

/** Python kernels (rollserve_kernel copies, `py-<hex>.py`) running below this process. */
function liveKernels(): number {
  const parents = new Map<number, number>();
  const commands = new Map<number, string>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      // a spawned kernel's command line names its file; a forked one (the fork server's) is named so
      const comm = readFileSync(`/proc/${entry}/comm`, 'utf8').trim();
      commands.set(Number(entry), /^py-[0-9a-f]+$/.test(comm) ? `/${comm}.py\0` : readFileSync(`/proc/${entry}/cmdline`, 'utf8'));
    } catch {
      // gone meanwhile
    }
  }
  const below = new Set<number>([process.pid]);
  let grew = true;
  while (grew) {
    grew = false;
    for (const [pid, parent] of parents) if (below.has(parent) && !below.has(pid)) (below.add(pid), (grew = true));
  }
  // bwrap and the interpreter both carry the kernel's file name: count names, not processes
  const names = [...below].map((pid) => /\/(py-[0-9a-f]+)\.py\0/.exec(commands.get(pid) ?? '')?.[1]).filter((n) => n !== undefined);
  return new Set(names).size;
}

async function settles(check: () => boolean, ms = 5_000): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
  return true;
}

const verifyCases: VerifyCase[] = cases.map(({ index, row, rollout }) => ({
  name: `math_with_code rollout ${index}`,
  request: { ...row, response: rollout.response },
  expectedReward: rollout.reward,
  expectedExtras: { extracted_answer: rollout.extracted_answer, accuracy: rollout.accuracy },
}));

// The recorded rollouts come from the version of math_with_code with the `\boxed\{([^}]+)\}`
// regex and plain string equality: 'recorded' reproduces them exactly, reward and extras.
describeContract({
  env: math,
  config: { math_with_code_verifier: 'recorded' },
  extraKeys: EXTRAS,
  sampleRow: { ...cases[0]!.row, expected_result: '8' },
  verifyCases,
});

async function startServer(config: Record<string, unknown> = {}): Promise<{ app: ResourcesServer; running: RunningServer; url: string }> {
  const app = createResourcesServer(math, { config });
  const running = await serveFetch(app);
  return { app, running, url: running.url };
}

describe('math_with_code verify as NeMo Gym does today (the default)', () => {
  let server: Awaited<ReturnType<typeof startServer>>;
  beforeAll(async () => {
    server = await startServer();
  });
  afterAll(async () => {
    await server.running.close();
    await server.app.close();
  });

  it('agrees with the recordings except where the old regex cut a nested box', async () => {
    const got = [];
    for (const { row, rollout } of cases) {
      const verify = await call(server.url, 'POST', '/verify', { ...row, response: rollout.response });
      expect(verify.status).toBe(200);
      const answer = verify.json as Record<string, unknown>;
      expect(Object.keys(answer)).toEqual(['responses_create_params', 'response', 'reward', ...EXTRAS]);
      got.push({ reward: answer.reward, extracted_answer: answer.extracted_answer, accuracy: answer.accuracy });
    }
    expect(got).toEqual([
      { reward: 1, extracted_answer: '-3', accuracy: true },
      { reward: 0, extracted_answer: '0', accuracy: false },
      // The balanced extraction reads the whole fraction (recorded: '\dfrac{83'); still wrong.
      { reward: 0, extracted_answer: '\\dfrac{83}{499}', accuracy: false },
      { reward: 0, extracted_answer: 'x_{2016} \\approx \\frac{1 + \\sqrt{3}}{2\\sqrt{3}} (2 + \\sqrt{3})^{2016}', accuracy: false },
      // '\sqrt{2}' against '\(\sqrt{2}\)': correct today; the recording's regex gave '\sqrt{2' and 0.
      { reward: 1, extracted_answer: '\\sqrt{2}', accuracy: true },
    ]);
  });

  it('aggregates math_with_code answers with NeMo Gym\'s default metrics', async () => {
    const entries = cases.map(({ row, rollout }) => ({ ...row, reward: rollout.reward, extracted_answer: rollout.extracted_answer, accuracy: rollout.accuracy, response: { usage: { input_tokens: 10, output_tokens: 5, total_tokens: 15 } } }));
    const metrics = await call(server.url, 'POST', '/aggregate_metrics', { verify_responses: entries });
    const answer = metrics.json as { agent_metrics: Record<string, unknown>; key_metrics: Record<string, unknown> };
    expect(answer.agent_metrics['mean/reward']).toBe(0.2);
    expect(answer.agent_metrics['mean/accuracy']).toBe(0.2);
    expect(Object.keys(answer.agent_metrics).some((k) => k.startsWith('pass@'))).toBe(false);
    expect(Object.keys(answer.key_metrics).every((k) => k.startsWith('mean/'))).toBe(true);
    expect(answer.key_metrics['mean/accuracy']).toBe(0.2);
  });
});

const RESPONSE_KEYS = ['success', 'stdout', 'stderr', 'error_message', 'result'];
const approx = (text: string) => text.replace(/-?\d+\.\d+(?:e[+-]?\d+)?/g, (n) => Number(n).toPrecision(10));

describe('execute_python and end_session over HTTP (persistent kernel in a bwrap sandbox)', () => {
  let server: Awaited<ReturnType<typeof startServer>>;
  beforeAll(async () => {
    server = await startServer({ max_execution_time: 2 });
  });
  afterAll(async () => {
    await server.running.close();
    await server.app.close();
  });

  const run = async (code: string, cookies: readonly string[] = []) => {
    const answer = await call(server.url, 'POST', '/execute_python', { code }, cookies.length ? { cookie: cookieHeader(cookies) } : {});
    expect(answer.status).toBe(200);
    expect(Object.keys(answer.json as object)).toEqual(RESPONSE_KEYS);
    return answer;
  };

  it('replays the recorded tool calls as simple_agent does, with math_with_code\'s response shape', async () => {
    for (const { index, row, rollout } of cases) {
      const replay = await replayRollout(server.url, row, rollout.response);
      const calls = rollout.response.output.filter((item) => item.type === 'function_call');
      expect(replay.tools).toHaveLength(calls.length);
      const recordedOutputs = rollout.response.output.filter((item) => item.type === 'function_call_output');
      replay.toolOutputs.forEach((text, i) => {
        const output = JSON.parse(text) as Record<string, unknown>;
        expect(Object.keys(output), `rollout ${index} call ${i}`).toEqual(RESPONSE_KEYS);
        expect(typeof output.success).toBe('boolean');
        expect(typeof output.stdout).toBe('string');
        expect(typeof output.stderr).toBe('string');
        expect(output.result === null || typeof output.result === 'string').toBe(true);
        if (output.success) expect(output.error_message).toBeNull();
        else expect(output).toMatchObject({ stdout: '', stderr: '', result: null, error_message: expect.any(String) });
        // Where the recording printed something, the same code prints the same here (floats to 10
        // digits: another numpy/BLAS build may differ in the last place).
        const old = JSON.parse(String(recordedOutputs[i]!.output)) as { stdout: string };
        if (old.stdout !== '') expect(approx(String(output.stdout)), `rollout ${index} call ${i}`).toBe(approx(old.stdout));
      });
      // Every call of a rollout used the one cookie session.
      const ids = new Set(replay.tools.map((t) => t.setCookies[0]));
      if (replay.tools.length) expect(ids.size).toBe(1);
      expect(replay.verify.status).toBe(200);
    }
  }, 120_000);

  it('keeps state within a session and apart between sessions', async () => {
    const first = await run('x = 41\nprint("set")');
    expect(first.json).toEqual({ success: true, stdout: 'set\n', stderr: '', error_message: null, result: null });
    const cookies = first.setCookies;
    const again = await run('y = x + 1\ny', cookies);
    expect(again.text).toBe('{"success":true,"stdout":"","stderr":"","error_message":null,"result":"42"}');
    // result is str() of the last line, evaluated a second time as math_with_code does
    expect((await run('s = "a b"\ns', cookies)).json).toMatchObject({ result: 'a b' });
    expect((await run('np.sqrt(16)', cookies)).json).toMatchObject({ success: true, result: '4.0' });
    expect((await run('import sys\nprint("err", file=sys.stderr)', cookies)).json).toMatchObject({ stdout: '', stderr: 'err\n' });
    const other = await run('x');
    expect(other.setCookies[0]).not.toBe(cookies[0]);
    expect(other.json).toEqual({ success: false, stdout: '', stderr: '', error_message: "name 'x' is not defined", result: null });
    expect((await run('print(1/0)', cookies)).json).toEqual({ success: false, stdout: '', stderr: '', error_message: 'division by zero', result: null });
    expect((await run('def f(:', cookies)).json).toMatchObject({ success: false, error_message: expect.stringMatching(/^invalid syntax|^'\(' was never closed|\(<string>, line 1\)$/) });
    // still the same kernel after errors
    expect((await run('x', cookies)).json).toMatchObject({ success: true, result: '41' });
  }, 60_000);

  it("gives each session's numpy random numbers of its own, as a new interpreter's (the kernels are forks of one that imported numpy)", async () => {
    const draw = 'print(np.random.rand(), np.random.randint(1 << 30), random.random())';
    const first = await run(`import random\n${draw}`);
    const second = await run(`import random\n${draw}`);
    for (const answer of [first, second]) expect(answer.json).toMatchObject({ success: true, stdout: expect.stringMatching(/^0\.\d+ \d+ 0\.\d+\n$/) });
    const [a, b] = [first, second].map((answer) => String((answer.json as { stdout: string }).stdout).split(' '));
    expect(a![0]).not.toBe(b![0]);
    expect(a![1]).not.toBe(b![1]);
    // and a session's stream goes on from call to call
    const again = await run(draw, first.setCookies);
    expect((again.json as { stdout: string }).stdout).not.toBe((first.json as { stdout: string }).stdout);
  }, 60_000);

  it('interrupts a call at max_execution_time and keeps the session usable', async () => {
    const first = await run('z = 7');
    const cookies = first.setCookies;
    const slow = await run('while True:\n    pass', cookies);
    expect(slow.json).toEqual({ success: false, stdout: '', stderr: '', error_message: 'code timed-out', result: null });
    expect((await run('z * 6', cookies)).json).toMatchObject({ success: true, result: '42' });
  }, 60_000);

  it('end_session stops the kernel; the next call starts a fresh one', async () => {
    const first = await run('w = 5');
    const cookies = first.setCookies;
    const before = liveKernels(); // this session's and those of the tests above, still open
    const end = await call(server.url, 'POST', '/end_session', {}, { cookie: cookieHeader(cookies) });
    expect(end.status).toBe(200);
    expect(end.text).toBe('{"success":true,"stdout":"","stderr":"","error_message":null,"result":null}');
    expect(await settles(() => liveKernels() === before - 1)).toBe(true);
    expect((await run('w', cookies)).json).toMatchObject({ success: false, error_message: "name 'w' is not defined" });
    expect((await run('w = 6\nw', cookies)).json).toMatchObject({ success: true, result: '6' });
  }, 60_000);

  it('verify ends the session and its kernel', async () => {
    const first = await run('v = 3');
    const cookies = first.setCookies;
    const { row, rollout } = cases[0]!;
    const verify = await call(server.url, 'POST', '/verify', { ...row, response: rollout.response }, { cookie: cookieHeader(cookies) });
    expect(verify.status).toBe(200);
    expect((await run('v', cookies)).json).toMatchObject({ success: false, error_message: "name 'v' is not defined" });
  }, 60_000);
});

describe('tool-integrated math through the rollout service', () => {
  const cleanups: Array<() => Promise<void>> = [];
  afterEach(async () => {
    while (cleanups.length) await cleanups.pop()!();
  });

  it('records per turn the code run and whether it ran cleanly, and rewards the boxed answer', async () => {
    const fake = await startFakePolicy({
      script: [
        { toolCalls: [{ name: 'execute_python', arguments: { code: 'raise ValueError("bad start")' } }] },
        { toolCalls: [{ name: 'execute_python', arguments: { code: 'roots = [x for x in range(-10, 21) if x*x - 2*x - 14 == abs(x*x - x) - 11]\nprint(roots)' } }] },
        'The only solution is \\boxed{-3}.',
      ],
    });
    const { service: svc, close } = await startTestRolloutService({ environments: [math], backends: [fake.url] });
    cleanups.push(async () => {
      await close();
      await fake.close();
    });
    const row = rows.find((r) => r.expected_result === '-3')!;
    const kernelsBefore = liveKernels();
    const [submitted] = await svc.submit([{ id: 'tim-1', env: 'math', row, policy: { model: 'fake-policy' } }]);
    const result = await svc.wait(submitted!.rolloutIds[0]!);
    expect(result.error?.message ?? null).toBeNull();
    expect(result.critical_error).toBeNull();
    expect(result.reward).toBe(1);
    expect(result.verify_extras).toEqual({ extracted_answer: '-3', accuracy: true });
    const calls = result.turns.flatMap((t) => t.tool_calls);
    expect(calls.map((c) => c.status)).toEqual(['error', 'ok']);
    expect(calls.map((c) => (JSON.parse(c.arguments) as { code: string }).code)).toEqual([
      'raise ValueError("bad start")',
      expect.stringContaining('roots = '),
    ]);
    expect(JSON.parse(calls[0]!.output)).toEqual({ success: false, stdout: '', stderr: '', error_message: 'bad start', result: null });
    expect(JSON.parse(calls[1]!.output)).toMatchObject({ success: true, stdout: '[-3]\n' });
    expect(result.turns.map((t) => t.rewards.tool)).toEqual([0, 1, 1]);
    // The row declares only execute_python, and that is what the policy was offered.
    const offered = (fake.requests[0]!.tools as Array<{ function: { name: string } }>).map((t) => t.function.name);
    expect(offered).toEqual(['execute_python']);
    // The rollout's kernel and sandbox end with it.
    expect(await settles(() => liveKernels() <= kernelsBefore)).toBe(true);
  }, 60_000);

  it('offers no tools to a math_with_judge row', async () => {
    const fake = await startFakePolicy({ script: ['\\boxed{8}'] });
    const { service: svc, close } = await startTestRolloutService({ environments: [math], backends: [fake.url] });
    cleanups.push(async () => {
      await close();
      await fake.close();
    });
    const [submitted] = await svc.submit([
      { id: 'judge-1', env: 'math', row: { responses_create_params: { input: 'What is 3+5?' }, question: 'What is 3+5?', expected_answer: '8' }, policy: { model: 'fake-policy' } },
    ]);
    const result = await svc.wait(submitted!.rolloutIds[0]!);
    expect(result.reward).toBe(1);
    expect(result.verify_extras).toMatchObject({ extracted_answer: '8', library_reward: 1 });
    expect(fake.requests[0]!.tools ?? []).toEqual([]);
  }, 60_000);
});
