import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import { call, counterEnvironment, renderPrompt, startFakePolicy, toyLogprob, toyTokenizer, type ChatCompletionBody, type FakePolicy } from '@rollserve/testing';
import { defineEnvironment } from '@rollserve/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ProcessRequest, ProRLResult, prorlApi } from '../../packages/core/src/api/prorl.ts';

// ProRL Agent's API as its clients use it (NVIDIA-NeMo/ProRL-Agent-Server scripts/start_server.py and
// its batch processor): /start, /process per instance, /stop; /add_llm_server, /clear_llm_server.

/** A SWE result's shape (environments/swe's verify extras) without a repository: the patch it "made". */
const PATCH = 'diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n';
const patchEnvironment = defineEnvironment({
  name: 'patch',
  domain: 'other',
  description: 'Answers a SWE-shaped verify (resolved, model_patch)',
  row: z.object({}),
  verify: () => ({ reward: 1, resolved: true, evaluation_completed: true, model_patch: PATCH }),
});

let fake: FakePolicy;
let other: FakePolicy;
let server: RolloutServer;

const NOT_RUNNING = 'Server is not running. Please start the server first.';

function question(request: ChatCompletionBody): string {
  return String((request.messages[0] as { content: unknown }).content);
}

const policyScript = (request: ChatCompletionBody, ctx: { turn: number }) => {
  const q = question(request);
  if (q.startsWith('hang')) return { content: 'x', hang: true };
  if (q.startsWith('count')) {
    return ctx.turn === 0 ? { content: null, toolCalls: [{ name: 'increment_counter', arguments: '{"count":3}' }] } : 'done counting';
  }
  const n = /(\d+)\+(\d+)/.exec(q);
  return n ? `\\boxed{${Number(n[1]) + Number(n[2])}}` : 'no idea';
};

/** ProRL's sampling params as its verl batch processor sends them by default. */
const SAMPLING = {
  model: 'hosted_vllm/fake-policy',
  api_key: 'mykey',
  modify_params: false,
  log_completions: false,
  native_tool_calling: true,
  temperature: 0.6,
  top_p: 0.95,
  max_iterations: 5,
  max_output_tokens: 256,
};

const mathInstance = (id: string, q: string, expected: string) => ({
  instance_id: id,
  trajectory_id: 0,
  data_source: 'math',
  responses_create_params: { input: [{ role: 'user', content: q }] },
  question: q,
  expected_answer: expected,
});

const post = (path: string, body?: unknown) => call(server.url, 'POST', path, body);
type Result = {
  messages: Array<{ role: string; content: string; tool_calls?: unknown; token_ids: number[] | null; input_ids: number[] | null; logprobs: number[] | null }>;
  timing: Record<string, number | boolean>;
} & Record<string, unknown>;

async function until(check: () => Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((resolve) => setTimeout(resolve, 10));
}

beforeAll(async () => {
  fake = await startFakePolicy({ script: policyScript });
  other = await startFakePolicy({ script: () => '\\boxed{7}' });
  server = await startRolloutServer({ environments: [math, counterEnvironment, patchEnvironment], llmBackends: [fake.url], defaultModel: 'fake-policy' });
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
  await other?.close();
});

describe("ProRL Agent's server API", { timeout: 120_000 }, () => {
  it('starts accepting jobs; /start is a no-op then, /status counts jobs per stage', async () => {
    const started = await post('/start');
    expect(started.status).toBe(200);
    expect(started.json).toEqual({ status: 'Server is already running' });
    const status = await call(server.url, 'GET', '/status');
    expect(status.status).toBe(200);
    expect(status.json).toEqual({ status: 'running', pending_jobs: 0, running: true, jobs: 0, init: 0, run: 0, eval: 0 });
  });

  it("answers /process with ProRL's result: messages with token ids, reward, filter, timing", async () => {
    const before = fake.requests.length;
    const processed = await post('/process', { instance: mathInstance('m-1', '20+22?', '42'), sampling_params: SAMPLING, job_id: 'job-1' });
    expect(processed.status).toBe(200);
    const result = processed.json as Result;
    expect(ProRLResult.safeParse(result).success).toBe(true);
    expect(result).toMatchObject({
      instance_id: 'm-1',
      trajectory_id: 0,
      job_id: 'job-1',
      resolved: true,
      reward: 1,
      critical_error: null,
      filter: false,
      success: true,
      error: null,
      finish: true,
      end_properly: true,
      tools: [],
    });

    // What reached the policy: ProRL's sampling mapped, the OpenHands-only knobs dropped.
    expect(fake.requests.length).toBe(before + 1);
    const sent = fake.requests.at(-1)!;
    expect(sent).toMatchObject({ model: 'fake-policy', temperature: 0.6, top_p: 0.95, max_tokens: 256 });
    for (const key of ['api_key', 'modify_params', 'native_tool_calling', 'max_iterations', 'max_output_tokens']) expect(sent).not.toHaveProperty(key);

    // The token ids are the scripted policy's (its toy tokenizer computes them independently).
    const promptIds = toyTokenizer.encode(renderPrompt(sent.messages, sent.tools as unknown[] | undefined));
    const generated = toyTokenizer.encode('\\boxed{42}');
    expect(result.messages).toEqual([
      { role: 'user', content: '20+22?', token_ids: promptIds, input_ids: null, logprobs: null },
      { role: 'assistant', content: '\\boxed{42}', token_ids: generated, input_ids: promptIds, logprobs: generated.map(toyLogprob) },
    ]);

    const timing = result.timing as { init_time: number; run_time: number; eval_time: number; counted_elapsed: number; timeout_triggered: boolean } & Record<string, number>;
    expect(timing.timeout_triggered).toBe(false);
    for (const key of ['init_time', 'run_time', 'eval_time', 'others_time', 'counted_elapsed']) expect(timing[key]).toBeGreaterThanOrEqual(0);
    expect(timing.run_time).toBeGreaterThan(0);
    expect(timing.counted_elapsed).toBeCloseTo(timing.init_time + timing.run_time + timing.eval_time, 9);

    const wrong = await post('/process', { instance: mathInstance('m-2', '2+2?', '5'), sampling_params: SAMPLING });
    expect(wrong.json).toMatchObject({ instance_id: 'm-2', resolved: false, reward: 0, filter: false, critical_error: null });
    expect(typeof (wrong.json as Result).job_id).toBe('string');
  });

  it('gives every message the tokens it adds, so that they concatenate to the whole sequence', async () => {
    const instance = {
      env: 'counter',
      instance_id: 'c-1',
      responses_create_params: {
        input: 'count from 2 to 5',
        tools: [{ type: 'function', name: 'increment_counter', parameters: { type: 'object', properties: { count: { type: 'integer' } } }, strict: true }],
      },
      initial_count: 2,
      expected_count: 5,
    };
    const processed = await post('/process', { instance, sampling_params: { temperature: 0 } });
    expect(processed.status).toBe(200);
    const result = processed.json as Result;
    expect(result).toMatchObject({ reward: 1, resolved: true, filter: false, finish: true });
    expect(result.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'tool', 'assistant']);
    expect(result.messages[1]).toMatchObject({ content: '', tool_calls: [{ name: 'increment_counter', arguments: '{"count":3}' }] });
    expect(result.messages[2]).toMatchObject({ content: '{"success":true}', input_ids: null, logprobs: null });
    const last = result.messages[3]!;
    expect(last.token_ids).toEqual(toyTokenizer.encode('done counting'));
    // ProRL's trainer view: all token_ids in order = the last prompt + the last generation.
    expect(result.messages.flatMap((m) => m.token_ids!)).toEqual([...last.input_ids!, ...last.token_ids!]);
    expect(result.messages[2]!.token_ids!.length).toBeGreaterThan(0);
    expect(result.tools).toEqual([
      { type: 'function', function: { name: 'increment_counter', parameters: { type: 'object', properties: { count: { type: 'integer' } } } } },
    ]);
  });

  it('cancels a running job: its /process answers critical_error "cancelled", filtered', async () => {
    const pending = post('/process', { instance: mathInstance('h-1', 'hang 1+1?', '2'), sampling_params: SAMPLING, job_id: 'job-hang' });
    await until(async () => ((await call(server.url, 'GET', '/status')).json as { run: number }).run === 1);
    expect((await call(server.url, 'GET', '/status')).json).toMatchObject({ pending_jobs: 1, jobs: 1, run: 1 });
    const cancelled = await post('/cancel', { job_id: 'job-hang' });
    expect(cancelled.status).toBe(200);
    expect(cancelled.json).toEqual({ status: 'Cancel requested for job job-hang' });
    const processed = await pending;
    expect(processed.status).toBe(200);
    expect(processed.json).toMatchObject({ instance_id: 'h-1', job_id: 'job-hang', critical_error: 'cancelled', filter: true, resolved: false, success: false });
    // ProRL's exception results carry git_patch and traceback (utils.py initialize_exception/run_exception).
    expect(processed.json).toMatchObject({ git_patch: null, traceback: expect.stringContaining('') });
    expect(typeof (processed.json as Result).traceback).toBe('string');
    expect((await call(server.url, 'GET', '/status')).json).toMatchObject({ pending_jobs: 0, run: 0 });

    const unknown = await post('/cancel', { job_id: 'nope' });
    expect(unknown.status).toBe(404);
    expect(unknown.json).toEqual({ detail: 'Job nope not found' });
  });

  it('swaps LLM servers: /clear_llm_server makes /process fail loudly, /add_llm_server brings one in', async () => {
    const cleared = await post('/clear_llm_server');
    expect(cleared.json).toEqual({ status: 'Cleared all LLM server addresses' });
    expect((await call(server.url, 'GET', '/v1/llm-backends')).json).toEqual({ backends: [] });
    const refused = await post('/process', { instance: mathInstance('x-1', '3+4?', '7'), sampling_params: SAMPLING });
    expect(refused.status).toBe(503);
    expect(refused.json).toEqual({ detail: 'No LLM server addresses configured. Please add at least one LLM server address.' });

    const added = await post('/add_llm_server', { address: other.url });
    expect(added.status).toBe(200);
    expect(added.json).toEqual({ status: `Added LLM server address: ${other.url}` });
    expect((await post('/add_llm_server', { address: other.url })).status).toBe(200); // once per address, as ProRL
    const backends = (await call(server.url, 'GET', '/v1/llm-backends')).json as { backends: Array<{ baseUrl?: string; base_url?: string }> };
    expect(backends.backends.map((b) => b.baseUrl ?? b.base_url)).toEqual([other.url]);

    const before = { fake: fake.requests.length, other: other.requests.length };
    const processed = await post('/process', { instance: mathInstance('x-2', '3+4?', '7'), sampling_params: SAMPLING });
    expect(processed.json).toMatchObject({ reward: 1, resolved: true });
    expect(other.requests.length).toBe(before.other + 1);
    expect(fake.requests.length).toBe(before.fake);

    await post('/clear_llm_server');
    expect((await post('/add_llm_server', { address: fake.url })).status).toBe(200);
  });

  it('refuses /process after /stop (in-flight jobs cancelled) and takes it again after /start', async () => {
    const pending = post('/process', { instance: mathInstance('h-2', 'hang 2+2?', '4'), sampling_params: SAMPLING, job_id: 'job-hang-2' });
    await until(async () => ((await call(server.url, 'GET', '/status')).json as { run: number }).run === 1);
    const stopped = await post('/stop');
    expect(stopped.status).toBe(200);
    expect(stopped.json).toEqual({ status: 'Server stopped successfully' });
    expect((await pending).json).toMatchObject({ job_id: 'job-hang-2', critical_error: 'cancelled', filter: true });

    const refused = await post('/process', { instance: mathInstance('s-1', '1+1?', '2'), sampling_params: SAMPLING });
    expect(refused.status).toBe(503);
    expect(refused.json).toEqual({ detail: NOT_RUNNING });
    expect((await call(server.url, 'GET', '/status')).status).toBe(503);
    expect((await post('/stop')).status).toBe(503);
    expect((await post('/cancel', { job_id: 'job-1' })).status).toBe(503);
    // LLM servers can be set up while stopped, as ProRL buffers them.
    expect((await post('/add_llm_server', { address: fake.url })).json).toEqual({ status: `Buffered LLM server address: ${fake.url}` });
    // The rest of the service is not ProRL's to stop.
    expect((await call(server.url, 'GET', '/v1/status')).status).toBe(200);

    const started = await post('/start');
    expect(started.json).toEqual({ status: 'Server started successfully' });
    const processed = await post('/process', { instance: mathInstance('s-2', '1+1?', '2'), sampling_params: SAMPLING });
    expect(processed.status).toBe(200);
    expect(processed.json).toMatchObject({ instance_id: 's-2', reward: 1 });
  });

  it("rejects bad bodies with FastAPI's 422 and names the field", async () => {
    const notJson = await post('/process', '{nope');
    expect(notJson.status).toBe(422);
    expect(notJson.json).toMatchObject({ detail: [{ type: 'json_invalid', msg: 'JSON decode error' }] });
    const empty = await post('/process', {});
    expect(empty.status).toBe(422);
    expect(empty.json).toMatchObject({ detail: [{ type: 'missing', loc: ['body', 'instance'], msg: 'Field required' }] });
    const noParams = await post('/process', { instance: { env: 'math', question: '1+1' }, sampling_params: {} });
    expect(noParams.json).toMatchObject({ detail: [{ type: 'missing', loc: ['body', 'instance', 'responses_create_params'] }] });
    const badTemp = await post('/process', { instance: mathInstance('b-1', '1+1', '2'), sampling_params: { temperature: 'hot' } });
    expect(badTemp.status).toBe(422);
    expect(badTemp.json).toMatchObject({ detail: [{ loc: ['body', 'sampling_params', 'temperature'] }] });
    const noEnv = await post('/process', { instance: { responses_create_params: { input: '1+1' } }, sampling_params: {} });
    expect(noEnv.status).toBe(422);
    expect(JSON.stringify(noEnv.json)).toContain('served: math, counter');
    const badJob = await post('/process', { instance: mathInstance('b-2', '1+1', '2'), sampling_params: {}, job_id: 7 });
    expect(badJob.json).toMatchObject({ detail: [{ type: 'string_type', loc: ['body', 'job_id'] }] });
    expect((await post('/cancel', {})).json).toMatchObject({ detail: [{ type: 'missing', loc: ['body', 'job_id'] }] });
    const badAddress = await post('/add_llm_server', { address: 'not a url' });
    expect(badAddress.status).toBe(422);
    expect(badAddress.json).toMatchObject({ detail: [{ loc: ['body', 'address'] }] });
    expect((await call(server.url, 'GET', '/health')).status).toBe(200);
  });

  it('declares every route with its request and response schemas', () => {
    const doc = prorlApi({ service: server.service, options: {} }).getOpenAPI31Document({ openapi: '3.1.0', info: { title: 't', version: '1' } });
    const paths = doc.paths as Record<string, Record<string, { requestBody?: unknown; responses: Record<string, unknown> }>>;
    expect(Object.keys(paths).sort()).toEqual(['/add_llm_server', '/cancel', '/clear_llm_server', '/process', '/start', '/status', '/stop']);
    expect(paths['/process']!.post!.requestBody).toBeDefined();
    expect(paths['/process']!.post!.responses['200']).toBeDefined();
    const schemas = doc.components!.schemas as Record<string, { properties?: Record<string, unknown> }>;
    expect(Object.keys(schemas.ProRLResult!.properties!)).toEqual(expect.arrayContaining(['messages', 'resolved', 'reward', 'filter', 'critical_error', 'timing']));
    expect(Object.keys(schemas.ProRLProcessRequest!.properties!).sort()).toEqual(Object.keys(ProcessRequest.shape).sort());
  });
});

/**
 * What ProRL's own scripts read from the answers (NVIDIA-NeMo/ProRL-Agent-Server
 * scripts/tests/test_server.py, test_server_token.py, scripts/run_math.py), replayed over HTTP.
 */
describe("ProRL's own client scripts, unchanged", { timeout: 120_000 }, () => {
  /** test_server_token.py's process_request: every message's lengths, token_ids read with len(). */
  function readAsTestServerToken(result: Result): void {
    for (const message of result.messages) {
      expect(typeof message.content).toBe('string');
      if ('tool_calls' in message && message.tool_calls !== null) expect(Array.isArray(message.tool_calls)).toBe(true);
      if ('input_ids' in message && message.input_ids !== null) expect(Array.isArray(message.input_ids)).toBe(true);
      expect(Array.isArray(message.token_ids)).toBe(true); // len(message['token_ids'])
    }
    expect(Array.isArray(result.tools)).toBe(true);
    expect(result.critical_error).toBeNull();
  }

  /** test_server_token.py's sampling_params, verbatim but the model. */
  const TOKEN_SAMPLING = {
    model: 'hosted_vllm/fake-policy',
    api_key: 'mykey',
    modify_params: false,
    log_completions: false,
    native_tool_calling: true,
    temperature: 0.6,
    top_p: 0.9,
    max_iterations: 35,
    token_level_generation: true,
    custom_tokenizer: 'Qwen/Qwen3-8B',
    max_output_tokens: 4096,
    max_model_len: 32768,
  };

  const counterInstance = (trajectoryId: number) => ({
    env: 'counter',
    instance_id: 'c-token',
    trajectory_id: trajectoryId,
    responses_create_params: {
      input: 'count from 2 to 5',
      tools: [{ type: 'function', name: 'increment_counter', parameters: { type: 'object', properties: { count: { type: 'integer' } } }, strict: true }],
    },
    initial_count: 2,
    expected_count: 5,
  });

  it('test_server_token.py: /start, /status, concurrent /process, /stop; every message has a token_ids list', async () => {
    expect((await post('/start')).status).toBe(200);
    expect((await call(server.url, 'GET', '/status')).status).toBe(200);
    const answers = await Promise.all([0, 1, 2].map((i) => post('/process', { instance: counterInstance(i), sampling_params: TOKEN_SAMPLING })));
    for (const [i, answer] of answers.entries()) {
      expect(answer.status).toBe(200);
      const result = answer.json as Result;
      readAsTestServerToken(result);
      expect(result).toMatchObject({ trajectory_id: i, reward: 1, resolved: true });
      expect(result.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'tool', 'assistant']);
    }
    // Only sampling reaches the policy: ProRL's OpenHands and tokenizer knobs stay here.
    const sent = fake.requests.at(-1)!;
    expect(sent).toMatchObject({ temperature: 0.6, top_p: 0.9, max_tokens: 4096 });
    for (const key of ['max_model_len', 'custom_tokenizer', 'token_level_generation', 'max_iterations']) expect(sent).not.toHaveProperty(key);
    expect((await post('/stop')).status).toBe(200);
    expect((await post('/start')).json).toEqual({ status: 'Server started successfully' });
  });

  it('drops trailing non-assistant messages as process_messages_from_agent_state does', async () => {
    // One turn allowed: the policy calls the tool, its output is the last message, and ProRL leaves it out.
    const answer = await post('/process', { instance: counterInstance(9), sampling_params: { ...TOKEN_SAMPLING, max_iterations: 1 } });
    expect(answer.status).toBe(200);
    const result = answer.json as Result;
    readAsTestServerToken(result);
    expect(result.messages.map((m) => m.role)).toEqual(['user', 'assistant']);
    expect(result.messages.at(-1)!.tool_calls).toEqual([{ name: 'increment_counter', arguments: '{"count":3}' }]);
    expect(result.messages.flatMap((m) => m.token_ids!)).toEqual([...result.messages[1]!.input_ids!, ...result.messages[1]!.token_ids!]);
  });

  it('leaves the token keys out when the policy gives no token ids, as ProRL does outside token mode', async () => {
    const plain = await startFakePolicy({ script: policyScript, supportsReturnTokenIds: false });
    try {
      const answer = await post('/process', { instance: counterInstance(0), sampling_params: SAMPLING, base_url: plain.url });
      expect(answer.status).toBe(200);
      const result = answer.json as Result;
      expect(result).toMatchObject({ reward: 1 });
      for (const message of result.messages) {
        for (const key of ['token_ids', 'input_ids', 'logprobs']) expect(message).not.toHaveProperty(key);
      }
    } finally {
      await plain.close();
    }
  });

  it('keeps a token_ids list on every message through a re-tokenisation drift', async () => {
    const drifting = await startFakePolicy({ script: policyScript, drifting: true });
    try {
      const answer = await post('/process', { instance: counterInstance(0), sampling_params: SAMPLING, base_url: drifting.url });
      expect(answer.status).toBe(200);
      const result = answer.json as Result;
      readAsTestServerToken(result);
      // The drift is there: the last prompt is not the earlier messages' tokens.
      const last = result.messages.at(-1)!;
      expect(result.messages.slice(0, -1).flatMap((m) => m.token_ids!)).not.toEqual(last.input_ids);
    } finally {
      await drifting.close();
    }
  });

  it("run_math.py: a DeepScaleR row (data_source, prompt, reward_model) goes to math; results as it writes them", async () => {
    const row = (index: number, a: number, b: number) => ({
      data_source: 'deepscaler',
      prompt: [{ role: 'user', content: `${a}+${b}? Let's think step by step and output the final answer within \\boxed{}.` }],
      ability: 'math',
      reward_model: { ground_truth: String(a + b), style: 'rule' },
      extra_info: { index, split: 'train' },
      trajectory_id: index,
    });
    // run_math.py's DEFAULT_SAMPLING_PARAMS, verbatim but the model.
    const params = { model: 'hosted_vllm/fake-policy', api_key: 'mykey', modify_params: false, log_completions: false, native_tool_calling: true, temperature: 0.6, top_p: 0.9, max_iterations: 35 };
    const answers = await Promise.all([row(0, 20, 22), row(1, 1, 2)].map((inst) => post('/process', { instance: inst, sampling_params: params })));
    const results = answers.map((a) => {
      expect(a.status).toBe(200); // _post: resp.raise_for_status()
      return a.json as Result;
    });
    expect(results.map((r) => r.resolved)).toEqual([true, true]); // sum(r.get("resolved") for r in results)
    expect(results.map((r) => r.trajectory_id)).toEqual([0, 1]);
    expect(results[0]).toMatchObject({ reward: 1, critical_error: null, expected_answer: '42' });
    // Its prompt as the conversation's first message.
    expect(results[0]!.messages[0]!.content).toContain('20+22?');

    // A prompt as JSON text: ProRL's math handler takes both.
    const asText = await post('/process', { instance: { ...row(2, 3, 4), prompt: JSON.stringify(row(2, 3, 4).prompt) }, sampling_params: params });
    expect(asText.json).toMatchObject({ reward: 1, resolved: true });
  });

  it('takes any string job_id and cancels by it', async () => {
    const jobId = 'step-1/traj-0';
    const pending = post('/process', { instance: mathInstance('h-3', 'hang 3+3?', '6'), sampling_params: SAMPLING, job_id: jobId });
    await until(async () => ((await call(server.url, 'GET', '/status')).json as { run: number }).run === 1);
    expect((await post('/cancel', { job_id: jobId })).json).toEqual({ status: `Cancel requested for job ${jobId}` });
    expect((await pending).json).toMatchObject({ job_id: jobId, critical_error: 'cancelled', filter: true, git_patch: null });

    // The same label again (a trainer's next step) is a new job, not the stored one.
    const again = await post('/process', { instance: mathInstance('m-9', '2+5?', '7'), sampling_params: SAMPLING, job_id: jobId });
    expect(again.json).toMatchObject({ job_id: jobId, instance_id: 'm-9', reward: 1, critical_error: null });
  });

  it("carries a SWE result's patch as ProRL's git_patch (and the environment's model_patch)", async () => {
    const answer = await post('/process', { instance: { env: 'patch', instance_id: 'repo__calc-1', responses_create_params: { input: 'fix calc.py' } }, sampling_params: SAMPLING });
    expect(answer.status).toBe(200);
    expect(answer.json).toMatchObject({ instance_id: 'repo__calc-1', resolved: true, git_patch: PATCH, model_patch: PATCH, critical_error: null });
    expect(answer.json).not.toHaveProperty('traceback');
    // A successful math result has neither, as ProRL's math results have none.
    const plain = await post('/process', { instance: mathInstance('m-10', '1+1?', '2'), sampling_params: SAMPLING });
    for (const key of ['git_patch', 'traceback']) expect(plain.json).not.toHaveProperty(key);
  });

  it("answers a wrong method on a ProRL route with FastAPI's 405", async () => {
    for (const [method, path, allow] of [
      ['GET', '/process', 'POST'],
      ['POST', '/status', 'GET'],
      ['GET', '/start', 'POST'],
      ['PUT', '/cancel', 'POST'],
    ] as const) {
      const response = await fetch(`${server.url}${path}`, { method });
      expect(response.status).toBe(405);
      expect(response.headers.get('allow')).toBe(allow);
      expect(await response.text()).toBe('{"detail":"Method Not Allowed"}');
    }
  });
});

describe("ProRL's clients against a service with a token", { timeout: 120_000 }, () => {
  it("answer FastAPI's 401 ({detail}) without or with a wrong token; URL credentials (Basic) or the bearer token pass", async () => {
    const token = 'prorl-token-1';
    const guarded = await startRolloutServer({ environments: [math], llmBackends: [fake.url], defaultModel: 'fake-policy', token });
    try {
      const instance = mathInstance('m-401', '2+3?', '5');
      // ProRL's clients post with aiohttp and read the body's `detail` on an error, as from its FastAPI server.
      for (const [method, path, body] of [
        ['POST', '/process', { instance, sampling_params: SAMPLING }],
        ['POST', '/start', undefined],
        ['GET', '/status', undefined],
        ['POST', '/add_llm_server', { address: fake.url }],
      ] as const) {
        const missing = await fetch(`${guarded.url}${path}`, { method, ...(body ? { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } } : {}) });
        expect(missing.status, path).toBe(401);
        expect(missing.headers.get('www-authenticate'), path).toBe('Bearer');
        expect(await missing.text(), path).toBe('{"detail":"Not authenticated"}');
        for (const authorization of [`Bearer nope`, `Basic ${Buffer.from('rollserve:nope').toString('base64')}`, 'Bearer']) {
          const wrong = await call(guarded.url, method, path, body, { authorization });
          expect({ status: wrong.status, json: wrong.json }, `${path} ${authorization}`).toEqual({ status: 401, json: { detail: 'Invalid authentication credentials' } });
        }
      }
      // a host configured as rollserve:<token>@host: aiohttp sends the URL's credentials as Basic
      const basic = { authorization: `Basic ${Buffer.from(`rollserve:${token}`).toString('base64')}` };
      const processed = await call(guarded.url, 'POST', '/process', { instance, sampling_params: SAMPLING }, basic);
      expect(processed.status).toBe(200);
      expect(processed.json).toMatchObject({ instance_id: 'm-401', reward: 1 });
      expect((await call(guarded.url, 'GET', '/status', undefined, { authorization: `Bearer ${token}` })).status).toBe(200);
      // the service's own API keeps its own error shape
      const own = await call(guarded.url, 'GET', '/v1/status');
      expect(own).toMatchObject({ status: 401, json: { error: { code: 'UNAUTHORIZED' } } });
    } finally {
      await guarded.close();
    }
  });
});
