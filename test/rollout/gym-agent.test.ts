import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import math from '@rollserve/env-math';
import {
  call,
  counterEnvironment,
  expectDeepClose,
  pythonReference,
  referenceCases,
  startFakePolicy,
  toyTokenizer,
  unhashReference,
  type ChatCompletionBody,
  type FakePolicy,
} from '@rollserve/testing';
import { readFileSync } from 'node:fs';
import { outputText, type NeMoGymResponse } from '@rollserve/core';
import stem from '@rollserve/env-stem';
import { nemoGymFixture } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GymRunResponse, gymAgentApi } from '../../packages/core/src/api/gym-agent.ts';
import { parsePythonTyped, pythonTypeDifferences, type PyNumber } from '../gym/python-json.ts';

// The rollout service as a NeMo Gym responses_api_agents server: rollout collection (and NeMo-RL)
// POST each materialized row to /run and, at the end, the verify responses to /aggregate_metrics.

let fake: FakePolicy;
let server: RolloutServer;
let mathServer: ResourcesServer;
let mathRunning: RunningServer;

const AGENT_REF = { type: 'responses_api_agents', name: 'math_with_judge_simple_agent' };

/** A materialized row as NeMo Gym's rollout collection sends it (params dumped with their defaults). */
const row = (q: string, expected: string, task: number, rollout: number, agentRef: Record<string, unknown> = AGENT_REF) => ({
  responses_create_params: {
    background: null,
    include: null,
    input: [{ role: 'user', content: `${q} Put the answer in \\boxed{}.`, type: 'message' }],
    instructions: null,
    max_output_tokens: null,
    max_tool_calls: null,
    metadata: null,
    model: null,
    parallel_tool_calls: true,
    previous_response_id: null,
    prompt: null,
    reasoning: null,
    service_tier: null,
    store: null,
    temperature: null,
    text: null,
    tool_choice: 'auto',
    tools: [],
    top_logprobs: null,
    top_p: null,
    truncation: null,
    user: null,
    stream: null,
  },
  question: q,
  expected_answer: expected,
  agent_ref: agentRef,
  _ng_task_index: task,
  _ng_rollout_index: rollout,
});

type RunAnswer = { responses_create_params: unknown; response: { output: Array<Record<string, unknown>>; usage: Record<string, unknown> }; reward: number } & Record<string, unknown>;

/** What the collector passes to /aggregate_metrics for a /run answer (rollout_collection.py). */
function verifyEntry(answer: RunAnswer, sent: ReturnType<typeof row>): Record<string, unknown> {
  const { responses_create_params: _params, response, ...rest } = answer;
  return { ...rest, response: { usage: response.usage }, _ng_task_index: sent._ng_task_index, _ng_rollout_index: sent._ng_rollout_index, agent_ref: sent.agent_ref };
}

beforeAll(async () => {
  fake = await startFakePolicy({
    script: (request: ChatCompletionBody, ctx) => {
      const q = String((request.messages[0] as { content: unknown }).content);
      if (q.startsWith('broken')) return { status: 400, errorMessage: 'bad request from the policy' };
      if (q.startsWith('count')) return ctx.turn === 0 ? { content: null, toolCalls: [{ name: 'increment_counter', arguments: '{"count":3}' }] } : 'done';
      const n = /(\d+)\+(\d+)/.exec(q);
      return n ? `\\boxed{${Number(n[1]) + Number(n[2])}}` : 'no idea';
    },
  });
  server = await startRolloutServer({ environments: [math, counterEnvironment], llmBackends: [fake.url], defaultModel: 'fake-policy' });
  mathServer = createResourcesServer(math, { instanceName: 'math_with_judge' });
  mathRunning = await serveFetch(mathServer);
});
afterAll(async () => {
  await mathRunning?.close();
  await mathServer?.close();
  await server?.close();
  await fake?.close();
});

describe('NeMo Gym agent face', { timeout: 120_000 }, () => {
  const runs: Array<{ sent: ReturnType<typeof row>; answer: RunAnswer }> = [];

  it("answers /run with simple_agent's verify response: reward 1 for a right answer, 0 for a wrong one", async () => {
    for (const [sent, reward] of [
      [row('What is 20+22?', '42', 0, 0), 1],
      [row('What is 2+2?', '5', 1, 0), 0],
    ] as const) {
      const ran = await call(server.url, 'POST', '/run', sent);
      expect(ran.status).toBe(200);
      const answer = ran.json as RunAnswer;
      expect(GymRunResponse.safeParse(answer).success).toBe(true);
      expect(answer.reward).toBe(reward);
      expect(answer.responses_create_params).toEqual(sent.responses_create_params);
      runs.push({ sent, answer });

      // The same reward and extras as the math resources server gives this response on /verify.
      const verified = await call(mathRunning.url, 'POST', '/verify', { ...sent, response: answer.response });
      expect(verified.status).toBe(200);
      const { response: _r, responses_create_params: _p, ...extras } = verified.json as Record<string, unknown>;
      const { response: _r2, responses_create_params: _p2, ...ours } = answer;
      expect(ours).toEqual(extras);
    }
    // Token ids on the model call's last output item, as NeMo-RL reads them.
    const message = runs[0]!.answer.response.output.at(-1)!;
    expect(message).toMatchObject({ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: '\\boxed{42}' }] });
    expect(message.generation_token_ids).toEqual(toyTokenizer.encode('\\boxed{42}'));
    expect((message.prompt_token_ids as number[]).length).toBeGreaterThan(0);
  });

  it('serves the same under the /ng-rollout/<id>/ prefix', async () => {
    const sent = row('What is 3+4?', '7', 0, 1);
    const ran = await call(server.url, 'POST', '/ng-rollout/abc/run', sent);
    expect(ran.status).toBe(200);
    expect((ran.json as RunAnswer).reward).toBe(1);
    runs.push({ sent, answer: ran.json as RunAnswer });
    const items = (await server.service.list({ limit: 1_000 })).items;
    expect(items.some((item) => item.result?.metadata?.ng_rollout_id === 'abc')).toBe(true);

    const wrong = await call(server.url, 'POST', '/ng-rollout/abc-2/run', row('What is 1+1?', '3', 1, 1));
    expect((wrong.json as RunAnswer).reward).toBe(0);
    runs.push({ sent: row('What is 1+1?', '3', 1, 1), answer: wrong.json as RunAnswer });

    // An id NeMo Gym's middleware would not strip is no route.
    const bad = await call(server.url, 'POST', '/ng-rollout/.x/run', sent);
    expect(bad.status).toBe(404);
    expect(bad.json).toEqual({ detail: 'Not Found' });
  });

  it("routes a row by agent_ref to the environment it names, and says so when it names none", async () => {
    const counterRow = {
      responses_create_params: { input: 'count from 2 to 5', tools: [{ type: 'function', name: 'increment_counter', parameters: { type: 'object' }, strict: true }] },
      initial_count: 2,
      expected_count: 5,
      agent_ref: { type: 'responses_api_agents', name: 'counter_simple_agent' },
    };
    const counted = await call(server.url, 'POST', '/run', counterRow);
    expect(counted.status).toBe(200);
    expect((counted.json as RunAnswer).reward).toBe(1);
    expect((counted.json as RunAnswer).response.output.map((item) => item.type)).toEqual(['function_call', 'function_call_output', 'message']);

    const unknown = await call(server.url, 'POST', '/run', row('What is 1+1?', '2', 0, 0, { type: 'responses_api_agents', name: 'chess_agent' }));
    expect(unknown.status).toBe(422);
    expect(unknown.json).toMatchObject({ detail: [{ type: 'value_error', loc: ['body', 'agent_ref'] }] });
    expect(JSON.stringify(unknown.json)).toContain('served: math, counter');
  });

  it("answers /aggregate_metrics for math_with_judge's fixture rollouts as NeMo Gym's own server does (python_reference.json)", async () => {
    const entries = referenceCases('math_with_judge').map((c, i) => ({
      _ng_task_index: i,
      _ng_rollout_index: 0,
      agent_ref: AGENT_REF,
      ...unhashReference(c.reference.extras, [String(c.row.expected_answer)]),
      reward: c.reference.reward,
      response: { usage: (c.recorded.response as { usage: unknown }).usage },
    }));
    const ours = await call(server.url, 'POST', '/aggregate_metrics', { verify_responses: entries });
    expect(ours.status).toBe(200);
    const python = pythonReference('math_with_judge').aggregate_metrics;
    const answer = ours.json as typeof python;
    expectDeepClose(answer.agent_metrics, python.agent_metrics);
    expectDeepClose(answer.key_metrics, python.key_metrics);
    expectDeepClose(answer.group_level_metrics, python.group_level_metrics);
  });

  it("answers /aggregate_metrics as the math resources server does for the same verify responses", async () => {
    expect(runs).toHaveLength(4);
    const body = { verify_responses: runs.map(({ sent, answer }) => verifyEntry(answer, sent)) };
    const ours = await call(server.url, 'POST', '/aggregate_metrics', body);
    expect(ours.status).toBe(200);
    const theirs = await call(mathRunning.url, 'POST', '/aggregate_metrics', body);
    expect(theirs.status).toBe(200);
    expect(ours.json).toEqual(theirs.json);
    const metrics = ours.json as { agent_metrics: Record<string, number>; group_level_metrics: unknown[] };
    expect(metrics.agent_metrics['mean/reward']).toBe(0.5);
    expect(metrics.group_level_metrics).toHaveLength(2);
    expect((await call(server.url, 'POST', '/ng-rollout/abc/aggregate_metrics', body)).json).toEqual(theirs.json);
    expect((await call(server.url, 'POST', '/aggregate_metrics', { verify_responses: [] })).json).toEqual({ group_level_metrics: [], agent_metrics: {}, key_metrics: {} });
  });

  it("rejects bad bodies with FastAPI's 422, and answers a failed rollout with a 500 as simple_agent does", async () => {
    const notJson = await call(server.url, 'POST', '/run', '{nope');
    expect(notJson.status).toBe(422);
    expect(notJson.json).toMatchObject({ detail: [{ type: 'json_invalid', loc: ['body', 1], msg: 'JSON decode error' }] });
    const empty = await call(server.url, 'POST', '/run', {});
    expect(empty.status).toBe(422);
    expect(empty.json).toEqual({ detail: [{ type: 'missing', loc: ['body', 'responses_create_params'], msg: 'Field required', input: {} }] });
    const badInput = await call(server.url, 'POST', '/run', { responses_create_params: { input: 5 }, agent_ref: AGENT_REF });
    expect(badInput.status).toBe(422);
    expect(badInput.json).toMatchObject({ detail: [{ loc: ['body', 'responses_create_params', 'input'] }] });
    const noEntries = await call(server.url, 'POST', '/aggregate_metrics', {});
    expect(noEntries.json).toMatchObject({ detail: [{ type: 'missing', loc: ['body', 'verify_responses'] }] });
    const badIndex = await call(server.url, 'POST', '/aggregate_metrics', { verify_responses: [{ _ng_task_index: 'x', reward: 1 }] });
    expect(badIndex.status).toBe(422);
    expect(badIndex.json).toMatchObject({ detail: [{ type: 'int_parsing', loc: ['body', 'verify_responses', 0, '_ng_task_index'] }] });
    const duplicate = await call(server.url, 'POST', '/aggregate_metrics', { verify_responses: [{ reward: 1 }, { reward: 0 }] });
    expect(duplicate.status).toBe(422);

    const failed = await call(server.url, 'POST', '/run', row('broken 1+1', '2', 0, 0));
    expect(failed.status).toBe(500);
    expect(typeof failed.json).toBe('string');
    expect(failed.json).toMatch(/failed \(run\)/);

    // No policy backend: a 503 that says so, not a rollout waiting for one.
    const listed = (await call(server.url, 'GET', '/v1/llm-backends')).json as { backends: Array<{ id: string }> };
    for (const { id } of listed.backends) expect((await call(server.url, 'DELETE', `/v1/llm-backends/${id}`)).status).toBe(200);
    const noBackend = await call(server.url, 'POST', '/run', row('What is 1+1?', '2', 0, 0));
    expect(noBackend.status).toBe(503);
    expect(noBackend.json).toMatchObject({ detail: expect.stringContaining('no LLM backend') });
    expect((await call(server.url, 'POST', '/v1/llm-backends', { base_url: fake.url })).status).toBe(201);
    expect((await call(server.url, 'GET', '/health')).status).toBe(200);
  });

  it('declares its routes with request and response schemas', () => {
    const doc = gymAgentApi({ service: server.service, options: {} }).getOpenAPI31Document({ openapi: '3.1.0', info: { title: 't', version: '1' } });
    const paths = doc.paths as Record<string, { post?: { requestBody?: unknown; responses: Record<string, unknown> } }>;
    expect(Object.keys(paths).sort()).toEqual(['/aggregate_metrics', '/ng-rollout/{rollout_id}/aggregate_metrics', '/ng-rollout/{rollout_id}/run', '/run']);
    for (const path of Object.values(paths)) {
      expect(path.post!.requestBody).toBeDefined();
      expect(path.post!.responses['200']).toBeDefined();
    }
  });
});

/** A JSON answer with Python's number types kept (see test/gym/python-json.ts). */
const typed = (text: string) => parsePythonTyped(text) as Record<string, any>;
const typedReference = (server: string) => typed(readFileSync(nemoGymFixture(server, 'python_reference.json'), 'utf8'));

describe("NeMo Gym's JSON types and names on the agent face", { timeout: 120_000 }, () => {
  it('writes the verify response as simple_agent does: "reward": 1.0, library_reward 1.0, ids ints', async () => {
    const sent = row('What is 5+6?', '11', 0, 0);
    const ran = await call(server.url, 'POST', '/run', sent);
    expect(ran.status).toBe(200);
    expect(ran.text).toContain('"reward":1.0');
    const answer = typed(ran.text);
    expect(answer.reward).toEqual({ py: 'float', raw: '1.0', value: 1 });
    expect(answer.library_reward).toEqual({ py: 'float', raw: '1.0', value: 1 });
    expect(answer.response.usage.input_tokens.py).toBe('int');
    expect(answer.response.created_at.py).toBe('float'); // NeMoGymResponse.created_at: float
    const last = answer.response.output.at(-1);
    expect(last.generation_token_ids.length).toBeGreaterThan(0);
    expect(last.generation_token_ids.every((id: PyNumber) => id.py === 'int')).toBe(true);
    expect(last.generation_log_probs.every((p: PyNumber) => p.py === 'float')).toBe(true);

    // The math resources server writes the same types for the same response on /verify.
    const verified = await call(mathRunning.url, 'POST', '/verify', { ...sent, response: (ran.json as RunAnswer).response });
    const theirs = typed(verified.text);
    for (const key of ['reward', 'library_reward', 'expected_answer', 'extracted_answer']) expect(answer[key]).toEqual(theirs[key]);

    const wrong = await call(server.url, 'POST', '/run', row('What is 5+6?', '12', 0, 1));
    expect(typed(wrong.text)).toMatchObject({ reward: { py: 'float', raw: '0.0' }, library_reward: { py: 'float', raw: '0.0' } });
  });

  it("answers /aggregate_metrics with python_reference.json's types and values, byte for byte", async () => {
    const entries = referenceCases('math_with_judge').map((c, i) => ({
      _ng_task_index: i,
      _ng_rollout_index: 0,
      agent_ref: AGENT_REF,
      ...unhashReference(c.reference.extras, [String(c.row.expected_answer)]),
      reward: c.reference.reward,
      response: { usage: (c.recorded.response as { usage: unknown }).usage },
    }));
    const ours = await call(server.url, 'POST', '/aggregate_metrics', { verify_responses: entries });
    expect(ours.status).toBe(200);
    expect(ours.text).toContain('"mean/reward":0.4');
    const python = typedReference('math_with_judge').aggregate_metrics;
    expect(pythonTypeDifferences(typed(ours.text), python)).toEqual([]);
  });

  it("runs rows carrying NeMo Gym's own agent names (mcqa_simple_agent) on the environment replacing that server, on a service with a token", async () => {
    // The policy answers each mcqa fixture row with its recorded output, so rewards and extras are Python's.
    const cases = referenceCases('mcqa');
    const question = (c: (typeof cases)[number]) => ((c.row.responses_create_params as { input: Array<{ content: string }> }).input[0]!.content);
    const replay = await startFakePolicy({
      script: (request: ChatCompletionBody) => {
        const asked = String((request.messages[0] as { content: unknown }).content);
        const hit = cases.find((c) => question(c) === asked);
        return hit ? outputText(hit.recorded.response as NeMoGymResponse) : 'no idea';
      },
    });
    const token = 'nemo-gym-token-1';
    const gym = await startRolloutServer({ environments: [math, stem], llmBackends: [replay.url], defaultModel: 'fake-policy', token });
    try {
      // NeMo Gym's ServerClient calls http://{host}:{port}/run with no header of its own; a host
      // configured as `rollserve:<token>@host` makes aiohttp send the URL's credentials as Basic.
      const basic = { authorization: `Basic ${Buffer.from(`rollserve:${token}`).toString('base64')}` };
      const reference = typedReference('mcqa').rows as Array<Record<string, any>>;
      for (const [i, c] of cases.entries()) {
        const sent = { ...c.row, agent_ref: { type: 'responses_api_agents', name: 'mcqa_simple_agent' }, _ng_task_index: i, _ng_rollout_index: 0 };
        const ran = await call(gym.url, 'POST', '/run', sent, basic);
        expect(ran.status).toBe(200);
        const ours = typed(ran.text);
        const theirs = reference.find((r) => r.recorded_rollout_index.value === c.reference.recorded_rollout_index)!;
        expect(ours.reward).toEqual(theirs.reward); // 1.0 or 0.0, as mcqa writes it
        for (const [key, value] of Object.entries(theirs.extras as Record<string, unknown>)) expect(ours[key]).toEqual(value);
      }
      const bearer = await call(gym.url, 'POST', '/run', { ...cases[0]!.row, agent_ref: { name: 'mcqa_simple_agent' } }, { authorization: `Bearer ${token}` });
      expect(bearer.status).toBe(200);

      // without or with a wrong token: FastAPI's 401, as NeMo Gym's client reads any error (`detail`)
      for (const path of ['/run', '/aggregate_metrics', '/ng-rollout/r-1/run']) {
        const noToken = await call(gym.url, 'POST', path, { ...cases[0]!.row, agent_ref: { name: 'mcqa_simple_agent' } });
        expect({ status: noToken.status, json: noToken.json }, path).toEqual({ status: 401, json: { detail: 'Not authenticated' } });
        for (const wrongToken of [`Basic ${Buffer.from('rollserve:nope').toString('base64')}`, 'Bearer nope']) {
          const refused = await call(gym.url, 'POST', path, { ...cases[0]!.row, agent_ref: { name: 'mcqa_simple_agent' } }, { authorization: wrongToken });
          expect({ status: refused.status, json: refused.json }, `${path} ${wrongToken}`).toEqual({ status: 401, json: { detail: 'Invalid authentication credentials' } });
        }
      }
      // Basic is the NeMo Gym and ProRL faces' only: the service's own API takes its bearer token.
      expect((await call(gym.url, 'GET', '/v1/status', undefined, basic)).status).toBe(401);

      // Its other names: the server's own (mcqa), its config's instance name with any suffix.
      for (const name of ['mcqa', 'mcqa_agent', 'stem_simple_agent', 'math_with_judge_simple_agent']) {
        const named = await call(gym.url, 'POST', '/aggregate_metrics', { verify_responses: [{ reward: 1, agent_ref: { name } }] }, basic);
        expect(named.status).toBe(200);
      }
      const unknown = await call(gym.url, 'POST', '/run', { ...cases[0]!.row, agent_ref: { name: 'chess_simple_agent' } }, basic);
      expect(unknown.status).toBe(422);
    } finally {
      await gym.close();
      await replay.close();
    }
  });

  it("answers a wrong method on the agent routes with FastAPI's 405", async () => {
    for (const path of ['/run', '/aggregate_metrics', '/ng-rollout/abc/run']) {
      const response = await fetch(`${server.url}${path}`);
      expect(response.status).toBe(405);
      expect(response.headers.get('allow')).toBe('POST');
      expect(await response.text()).toBe('{"detail":"Method Not Allowed"}');
    }
  });
});
