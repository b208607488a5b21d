import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { computeAggregateMetrics, SessionTools } from '@rollserve/core';
import type { EnvironmentContext, NeMoGymResponse, VerifyEntry } from '@rollserve/core';
import { expectDeepClose, pythonReference, referenceCases, unhashReference } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lastBoxedAnswer, MathConfig, mathEnvironment, type MathResources } from './environment.ts';
import mathDefault from './index.ts';
import { JUDGE_SYSTEM_MESSAGE, JudgeError, judgeEquivalence, judgePrompt } from './judge.ts';

// the environment's own setup and close, as a server runs them
let resources: MathResources;
beforeAll(async () => {
  resources = await mathEnvironment.setup!(MathConfig.parse({}));
});
afterAll(async () => {
  await mathEnvironment.close!(resources);
});

function context(config: Record<string, unknown> = {}): EnvironmentContext<MathConfig> {
  const logger = { info() {}, warn() {}, error() {}, debug() {}, child: () => logger };
  return {
    session: { id: 'test', state: {}, onClose() {} },
    config: MathConfig.parse(config),
    logger: logger as never,
    signal: new AbortController().signal,
    tools: new SessionTools(),
    resources,
  };
}

function response(text: string): NeMoGymResponse {
  return {
    id: 'resp_1',
    output: [
      { id: 'rs_1', type: 'reasoning', summary: [{ type: 'summary_text', text: 'thinking \\boxed{999}' }] },
      { id: 'msg_1', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] },
    ],
    usage: { input_tokens: 10, output_tokens: 20, total_tokens: 30 },
  };
}

const row = (expected_answer: string, question = 'What is it?') => ({ question, expected_answer });

describe('the environment definition', () => {
  it('is the default export, named math, in the math domain', () => {
    expect(mathDefault).toBe(mathEnvironment);
    expect(mathEnvironment.name).toBe('math');
    expect(mathEnvironment.domain).toBe('math');
    expect(mathEnvironment.reverifyMode).toBe('unknown');
    // math_with_code's tools, offered on the rollout service only to rows that declare them.
    expect(Object.keys(mathEnvironment.tools)).toEqual(['execute_python', 'end_session']);
    expect(mathEnvironment.offerTools).toBe('declared');
  });

  it('needs a \\boxed{} unless format-tolerant extraction is on', async () => {
    const unboxed = response('Adding them up, the final answer is 8.');
    expect(await mathEnvironment.verify(row('8'), unboxed, context())).toMatchObject({ reward: 0, extracted_answer: null });
    const tolerant = await mathEnvironment.verify(row('8'), unboxed, context({ format_tolerant_answer_extraction: true }));
    expect(tolerant).toMatchObject({ reward: 1, library_reward: 1, extracted_answer: '8' });
    const wrong = await mathEnvironment.verify(row('8'), response('The final answer is 9.'), context({ format_tolerant_answer_extraction: true }));
    expect(wrong).toMatchObject({ reward: 0, extracted_answer: '9' });
  });

  it('has math_with_judge config defaults', () => {
    expect(MathConfig.parse({})).toEqual({
      should_use_judge: false,
      library_verifier_timeout_seconds: 10,
      library_verifier_max_concurrency: 32,
      format_tolerant_answer_extraction: false,
      max_execution_time: 10,
      math_with_code_verifier: 'current',
      math_verify_mode: 'corrected',
    });
    expect(MathConfig.parse({ judge_base_url: 'http://x', name: 'math_with_judge', port: 1 })).toMatchObject({ judge_base_url: 'http://x' });
  });

  it('validates rows', () => {
    expect(mathEnvironment.row.safeParse({ question: 'q', expected_answer: '1', extra: 1 }).success).toBe(true);
    expect(mathEnvironment.row.safeParse({ question: 'q' }).success).toBe(false);
    // math_with_code rows
    expect(mathEnvironment.row.safeParse({ expected_result: '32', expected_code_contains: '', id: 0 }).success).toBe(true);
    expect(mathEnvironment.row.safeParse({ expected_result: 32 }).success).toBe(false);
    const neither = mathEnvironment.row.safeParse({ id: 1 });
    expect(neither.success).toBe(false);
    expect(neither.error!.issues.map((i) => i.path)).toEqual([['question'], ['expected_answer']]);
  });
});

describe('lastBoxedAnswer (math_with_judge gate)', () => {
  it.each([
    ['\\boxed{1} then \\boxed{2}', '2'],
    ['\\boxed{\\frac{1}{2}}', '\\frac{1}{2}'],
    ['no box', undefined],
    ['\\boxed{unclosed', undefined],
    ['\\boxed{}', ''],
  ])('%s → %s', (text, boxed) => {
    expect(lastBoxedAnswer(text)).toBe(boxed);
  });
});

describe('verify', () => {
  it('returns the math_with_judge extras', async () => {
    const result = await mathEnvironment.verify(row('\\(\\frac{1}{2}\\)'), response('So \\boxed{0.5}.'), context());
    expect(result).toEqual({
      reward: 1,
      expected_answer: '\\(\\frac{1}{2}\\)',
      extracted_answer: '1/2',
      library_reward: 1,
      judge_evaluations: null,
    });
  });

  it('gives 0 and no extracted answer without a \\boxed{} answer, as math_with_judge does', async () => {
    for (const text of ['The answer is 5.', '\\boxed{}', '\\boxed{ }', '']) {
      expect(await mathEnvironment.verify(row('5'), response(text), context())).toEqual({
        reward: 0,
        expected_answer: '5',
        extracted_answer: null,
        library_reward: 0,
        judge_evaluations: null,
      });
    }
  });

  it('reads only the message text (not the reasoning)', async () => {
    const result = await mathEnvironment.verify(row('999'), response('\\boxed{998}'), context());
    expect(result).toMatchObject({ reward: 0, extracted_answer: '998' });
  });

  it('never gives a wrong 1 for ±: both roots must match', async () => {
    expect(await mathEnvironment.verify(row('1 \\pm \\sqrt{19}'), response('\\boxed{1 \\pm \\sqrt{29}}'), context())).toMatchObject({ reward: 0 });
    expect(await mathEnvironment.verify(row('1 \\pm \\sqrt{19}'), response('\\boxed{1 \\pm \\sqrt{19}}'), context())).toMatchObject({ reward: 1 });
  });

  it('tells apart exact values that Math-Verify takes as equal, unless math_verify_mode is strict', async () => {
    // Math-Verify compares evalf(chop=True) values: 1/2004! and 1/2006! both chop to 0
    const corrected = await mathEnvironment.verify(row('\\frac{1}{2004!}'), response('\\boxed{\\frac{1}{2006!}}'), context());
    const strict = await mathEnvironment.verify(row('\\frac{1}{2004!}'), response('\\boxed{\\frac{1}{2006!}}'), context({ math_verify_mode: 'strict' }));
    expect(corrected).toMatchObject({ reward: 0 });
    expect(strict).toMatchObject({ reward: 1 });
    expect(await mathEnvironment.verify(row('\\frac{1}{2004!}'), response('\\boxed{\\frac{1}{2004!}}'), context())).toMatchObject({ reward: 1 });
  });

  it('does not call the judge when it is off', async () => {
    const result = await mathEnvironment.verify(row('7'), response('\\boxed{8}'), context({ judge_base_url: 'http://127.0.0.1:1' }));
    expect(result).toMatchObject({ reward: 0, library_reward: 0, judge_evaluations: null });
  });
});

describe('NeMo Gym fixtures (math_with_judge)', () => {
  const cases = referenceCases('math_with_judge');

  it.each(cases.map((c, i) => [i, c] as const))('row %i gives the recorded reward and the reference extras', async (_i, c) => {
    const expectedAnswer = String(c.row.expected_answer);
    const result = await mathEnvironment.verify(
      { question: String(c.row.question), expected_answer: expectedAnswer },
      c.recorded.response as NeMoGymResponse,
      context(),
    );
    const reference = unhashReference(c.reference.extras, [expectedAnswer]);
    // The recorded reward; python_reference differs from it only where math-verify's own time limit
    // cut a proof short (README: rollout 1); there library_reward follows the reward.
    const recordedReward = c.recorded.reward as number;
    expect(result.reward).toBe(recordedReward);
    expect(result).toEqual({
      ...reference,
      reward: recordedReward,
      library_reward: recordedReward,
    });
    expect(result.extracted_answer).toBe(c.recorded.extracted_answer);
  }, 30_000);

  it('metrics and key metrics match /aggregate_metrics of the Python server', () => {
    const entries: VerifyEntry[] = cases.map((c, i) => ({
      _ng_task_index: i,
      _ng_rollout_index: 0,
      agent_ref: { type: 'responses_api_agents', name: 'math_with_judge_simple_agent' },
      ...unhashReference(c.reference.extras, [String(c.row.expected_answer)]),
      reward: c.reference.reward,
      response: { usage: (c.recorded.response as { usage: unknown }).usage },
    }));
    const ours = computeAggregateMetrics(entries, mathEnvironment);
    const python = pythonReference('math_with_judge').aggregate_metrics as unknown as typeof ours;
    expectDeepClose(ours.agent_metrics, python.agent_metrics);
    expectDeepClose(ours.key_metrics, python.key_metrics);
    expectDeepClose(ours.group_level_metrics, python.group_level_metrics);
  });

  it('metrics with several rollouts and a judge: pass@k, majority@k and judge_accuracy', () => {
    const entries = (task: number, rollouts: Array<[number, number, string | null, boolean]>): VerifyEntry[] =>
      rollouts.map(([reward, library, answer, judged], r) => ({
        _ng_task_index: task,
        _ng_rollout_index: r,
        reward,
        library_reward: library,
        extracted_answer: answer,
        judge_evaluations: judged ? [] : null,
      }));
    const tasks = [
      entries(0, [[1, 1, '2', false], [0, 0, '3', false]]),
      entries(1, [[1, 0, 'x', true], [0, 0, null, true]]),
    ];
    const metrics = mathEnvironment.metrics!(tasks);
    expect(metrics['pass@2/symbolic_accuracy']).toBe(50);
    expect(metrics['pass@1[avg-of-2]/symbolic_accuracy']).toBe(25);
    expect(metrics['pass@1[avg-of-2]/no_answer']).toBe(25);
    expect(metrics['pass@2/judge_accuracy']).toBe(100);
    expect(metrics).toHaveProperty('majority@2/symbolic_accuracy');
    const key = mathEnvironment.keyMetrics!({ ...metrics, 'mean/input_tokens': 5, 'mean/output_tokens': 6, 'mean/reward': 1 });
    expect(Object.keys(key).sort()).toEqual(
      [
        'mean/input_tokens',
        'mean/output_tokens',
        'pass@1[avg-of-2]/symbolic_accuracy',
        'pass@1[avg-of-2]/judge_accuracy',
        'pass@1[avg-of-2]/no_answer',
        'pass@2/symbolic_accuracy',
        'pass@2/judge_accuracy',
        'majority@2/symbolic_accuracy',
        'majority@2/judge_accuracy',
      ].sort(),
    );
  });
});

// ---- the judge ------------------------------------------------------------------------------

type Behaviour = 'equal' | 'not-equal' | 'equal-then-not' | 'http-500' | 'not-json' | 'no-label' | 'hang';

describe('the LLM judge fallback', () => {
  let server: Server;
  let baseUrl: string;
  let behaviour: Behaviour = 'equal';
  const received: Array<Record<string, unknown>> = [];

  function judgeReply(text: string): Record<string, unknown> {
    return {
      id: 'resp_judge',
      object: 'response',
      model: 'judge',
      output: [{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] }],
    };
  }

  beforeAll(async () => {
    server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      received.push({ path: req.url, body });
      const send = (status: number, payload: string) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(payload);
      };
      if (req.url !== '/v1/responses') return send(404, '{"detail":"Not Found"}');
      switch (behaviour) {
        case 'equal':
          return send(200, JSON.stringify(judgeReply('They agree. My final verdict is [[A=B]]')));
        case 'not-equal':
          return send(200, JSON.stringify(judgeReply('My final verdict is different [[A!=B]], not [[A=B]]')));
        case 'equal-then-not':
          return send(200, JSON.stringify(judgeReply(received.length % 2 === 1 ? '[[A=B]]' : '[[A!=B]]')));
        case 'no-label':
          return send(200, JSON.stringify(judgeReply('I cannot decide.')));
        case 'not-json':
          return send(200, 'this is not json');
        case 'http-500':
          return send(500, '{"error":"boom"}');
        case 'hang':
          return; // never answers; the test's time limit has to end the call
      }
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const judged = (overrides: Record<string, unknown> = {}) =>
    context({
      should_use_judge: true,
      judge_base_url: baseUrl,
      judge_responses_create_params: { input: [], model: 'judge-model', temperature: 0 },
      ...overrides,
    });

  it('a judge that says equal (both orders) gives reward 1 and keeps library_reward', async () => {
    behaviour = 'equal';
    received.length = 0;
    const result = await mathEnvironment.verify(row('two thirds', 'What fraction?'), response('So \\boxed{\\frac{2}{3}}'), judged());
    expect(result).toMatchObject({ reward: 1, library_reward: 0, extracted_answer: '2/3', expected_answer: 'two thirds' });
    const evaluations = result.judge_evaluations as Array<{ responses_create_params: Record<string, unknown>; response: unknown }>;
    expect(evaluations).toHaveLength(2);
    expect(received).toHaveLength(2);
    const [first, second] = received.map((r) => r.body as { input: Array<{ role: string; content: string }>; model: string });
    expect(first!.model).toBe('judge-model');
    expect(first!.input[0]).toMatchObject({ role: 'system', content: JUDGE_SYSTEM_MESSAGE });
    // Expected answer first, then the boxed answer; the second call swaps them.
    expect(first!.input[1]!.content).toBe(judgePrompt('What fraction?', 'two thirds', '\\frac{2}{3}'));
    expect(second!.input[1]!.content).toBe(judgePrompt('What fraction?', '\\frac{2}{3}', 'two thirds'));
    expect(evaluations[0]!.responses_create_params).toEqual(first);
    expect(evaluations[1]!.response).toMatchObject({ id: 'resp_judge' });
  });

  it('a judge that says not equal gives reward 0 after one call', async () => {
    behaviour = 'not-equal';
    received.length = 0;
    const result = await mathEnvironment.verify(row('7'), response('\\boxed{8}'), judged());
    expect(result).toMatchObject({ reward: 0, library_reward: 0, extracted_answer: '8' });
    expect(result.judge_evaluations).toHaveLength(1);
    expect(received).toHaveLength(1);
  });

  it('equal one way and not the other gives reward 0', async () => {
    behaviour = 'equal-then-not';
    received.length = 0;
    const result = await mathEnvironment.verify(row('7'), response('\\boxed{8}'), judged());
    expect(result).toMatchObject({ reward: 0 });
    expect(result.judge_evaluations).toHaveLength(2);
  });

  it('a reply with no verdict counts as not equal', async () => {
    behaviour = 'no-label';
    const result = await mathEnvironment.verify(row('7'), response('\\boxed{8}'), judged());
    expect(result).toMatchObject({ reward: 0 });
    expect(result.judge_evaluations).toHaveLength(1);
  });

  it('is not called when the library already says correct', async () => {
    behaviour = 'not-equal';
    received.length = 0;
    const result = await mathEnvironment.verify(row('8'), response('\\boxed{8}'), judged());
    expect(result).toMatchObject({ reward: 1, library_reward: 1, judge_evaluations: null });
    expect(received).toHaveLength(0);
  });

  it.each([
    ['answers HTTP 500', 'http-500' as const, /HTTP 500/],
    ['does not answer JSON', 'not-json' as const, /JSON/],
  ])('a judge that %s is a judge failure', async (_name, how, message) => {
    behaviour = how;
    const result = await mathEnvironment.verify(row('7'), response('\\boxed{8}'), judged());
    expect(result.reward).toBe(0);
    expect(result._ng_failure_class).toBe('judge_failed');
    expect(String(result._ng_failure_judge_error)).toMatch(message);
  });

  it('a judge that does not answer in time is a judge failure', async () => {
    behaviour = 'hang';
    const call = judgeEquivalence({ baseUrl, timeoutMs: 300 }, 'q', '7', '8');
    await expect(call).rejects.toBeInstanceOf(JudgeError);
    await expect(call).rejects.toThrow(/failed/);
  });

  it('a judge that is down is a judge failure, not a throw', async () => {
    const down = createServer();
    down.listen(0, '127.0.0.1');
    await once(down, 'listening');
    const port = (down.address() as AddressInfo).port;
    await new Promise((resolve) => down.close(resolve));
    const result = await mathEnvironment.verify(row('7'), response('\\boxed{8}'), judged({ judge_base_url: `http://127.0.0.1:${port}` }));
    expect(result).toEqual({ reward: 0, _ng_failure_class: 'judge_failed', _ng_failure_judge_error: expect.stringMatching(/failed/) });
  });
});
