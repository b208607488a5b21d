import { createServer, type Server } from 'node:http';
import { Agent } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import {
  renderCompletion,
  renderPrompt,
  startFakePolicy,
  toyLogprob,
  toyTokenizer,
  type FakePolicy,
  type FakePolicyOptions,
} from '../../../testing/src/fake-policy/index.ts';
import { RolloutError } from '../errors.ts';
import { chatCompletion } from './chat-completion.ts';
import { LlmBackendError } from './llm-error.ts';
import type { LlmBackendConfig, LlmChatMessage } from './types.ts';

const policies: FakePolicy[] = [];
const agents: Agent[] = [];
const servers: Server[] = [];

afterEach(async () => {
  await Promise.all(policies.splice(0).map((p) => p.close()));
  await Promise.all(agents.splice(0).map((a) => a.destroy()));
  await Promise.all(servers.splice(0).map((s) => new Promise((resolve) => s.close(resolve))));
});

async function setup(options: FakePolicyOptions = {}, backend: Partial<LlmBackendConfig> = {}) {
  const policy = await startFakePolicy(options);
  policies.push(policy);
  const dispatcher = new Agent();
  agents.push(dispatcher);
  return { policy, dispatcher, backend: { id: 'b1', baseUrl: policy.url, ...backend } };
}

const messages: LlmChatMessage[] = [
  { role: 'system', content: 'Use tools.' },
  { role: 'user', content: 'List the files.' },
];

async function failure(promise: Promise<unknown>): Promise<RolloutError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(RolloutError.isInstance(error)).toBe(true);
  return error as RolloutError;
}

describe('chatCompletion', () => {
  it('asks for token ids and logprobs, passes sampling params through, and parses them', async () => {
    const { policy, dispatcher, backend } = await setup({ model: 'qwen', apiKey: 'k' }, { model: 'qwen', apiKey: 'k' });
    const sampling = { temperature: 0.7, top_p: 0.9, top_k: 20, max_tokens: 64, stop: ['</answer>'], seed: 3, repetition_penalty: 1.05, min_p: 0.01 };
    const result = await chatCompletion(backend, { messages, sampling }, { dispatcher, headers: { 'x-rollout-id': 'r1' } });

    expect(policy.requests[0]).toMatchObject({
      model: 'qwen',
      messages,
      ...sampling,
      logprobs: true,
      top_logprobs: 0,
      return_token_ids: true,
      stream: false,
    });
    expect(policy.calls[0]!.headers).toMatchObject({ authorization: 'Bearer k', 'x-rollout-id': 'r1' });

    const text = 'Hello from the fake policy.';
    const ids = toyTokenizer.encode(text);
    expect(result.message).toEqual({ role: 'assistant', content: text, toolCalls: [] });
    expect(result.finishReason).toBe('stop');
    expect(result.promptTokenIds).toEqual(toyTokenizer.encode(renderPrompt(messages)));
    expect(result.generationTokenIds).toEqual(ids);
    expect(result.generationLogprobs).toEqual(ids.map(toyLogprob));
    expect(result.usage).toEqual({
      promptTokens: result.promptTokenIds!.length,
      completionTokens: ids.length,
      totalTokens: result.promptTokenIds!.length + ids.length,
    });
    expect(result.backendId).toBe('b1');
    expect(result.model).toBe('qwen');
    expect(result.latencyMs).toBeGreaterThan(0);
    expect(result.choices).toHaveLength(1);
  });

  it('parses tool calls and reasoning, and the generation ids cover all of them', async () => {
    const reply = {
      reasoning: 'I should list them.',
      content: null,
      toolCalls: [
        { name: 'bash', arguments: { command: 'ls -la' }, id: 'call_a' },
        { name: 'python', arguments: '{"code": broken' },
      ],
    };
    const tools = [{ type: 'function' as const, function: { name: 'bash', parameters: { type: 'object' } } }];
    const { policy, dispatcher, backend } = await setup({ script: [reply] });
    const result = await chatCompletion(backend, { messages, tools, tool_choice: 'auto' }, { dispatcher });
    expect(policy.requests[0]).toMatchObject({ tools, tool_choice: 'auto' });
    expect(result.finishReason).toBe('tool_calls');
    expect(result.message).toEqual({
      role: 'assistant',
      content: null,
      reasoning: 'I should list them.',
      toolCalls: [
        { id: 'call_a', name: 'bash', arguments: '{"command":"ls -la"}' },
        { id: 'chatcmpl-tool-0-0-1', name: 'python', arguments: '{"code": broken' },
      ],
    });
    const expected = toyTokenizer.encode(
      renderCompletion({ ...reply, toolCalls: [{ name: 'bash', arguments: '{"command":"ls -la"}' }, { name: 'python', arguments: '{"code": broken' }] }),
    );
    expect(result.generationTokenIds).toEqual(expected);
    expect(result.generationLogprobs).toHaveLength(expected.length);
    expect(result.promptTokenIds).toEqual(toyTokenizer.encode(renderPrompt(messages, tools)));
  });

  it('gives prompt ids of the next turn that extend the previous prompt and generation', async () => {
    const { dispatcher, backend } = await setup({
      script: [{ content: 'Checking.', toolCalls: [{ name: 'bash', arguments: { command: 'ls' } }] }, 'Two files.'],
    });
    const first = await chatCompletion(backend, { messages }, { dispatcher });
    const call = first.message.toolCalls[0]!;
    const second = await chatCompletion(
      backend,
      {
        messages: [
          ...messages,
          { role: 'assistant', content: first.message.content, tool_calls: [{ id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
          { role: 'tool', tool_call_id: call.id, content: 'a b' },
        ],
      },
      { dispatcher },
    );
    const prefix = [...first.promptTokenIds!, ...first.generationTokenIds!];
    expect(second.promptTokenIds!.slice(0, prefix.length)).toEqual(prefix);
    expect(second.message.content).toBe('Two files.');
  });

  it('reads generation ids from token_id:N logprob tokens when the server ignores return_token_ids', async () => {
    const { dispatcher, backend } = await setup({ supportsReturnTokenIds: false, script: ['old vLLM'] });
    const result = await chatCompletion(backend, { messages }, { dispatcher });
    expect(result.promptTokenIds).toBeNull();
    expect(result.generationTokenIds).toEqual(toyTokenizer.encode('old vLLM'));
    expect(result.generationLogprobs).toEqual(toyTokenizer.encode('old vLLM').map(toyLogprob));
  });

  it('returns every choice when n > 1, the first one flattened', async () => {
    const { dispatcher, backend } = await setup({ script: [{ choices: [{ content: 'a' }, { content: 'b c', finishReason: 'length' }] }] });
    const result = await chatCompletion(backend, { messages, sampling: { n: 2 } }, { dispatcher });
    expect(result.message.content).toBe('a');
    expect(result.choices.map((c) => [c.index, c.message.content, c.finishReason, c.generationTokenIds])).toEqual([
      [0, 'a', 'stop', toyTokenizer.encode('a')],
      [1, 'b c', 'length', toyTokenizer.encode('b c')],
    ]);
  });

  it('reports finish_reason length when max_tokens cuts the reply', async () => {
    const { dispatcher, backend } = await setup({ script: ['a b c d e f'] });
    const result = await chatCompletion(backend, { messages, sampling: { max_tokens: 4 } }, { dispatcher });
    expect(result.finishReason).toBe('length');
    expect(result.message.content).toBe('a b ');
    expect(result.generationTokenIds).toHaveLength(4);
  });

  it('fails on HTTP errors with kind http: 400 not retryable, 503 retryable', async () => {
    const { dispatcher, backend } = await setup({ script: [{ status: 400, errorMessage: 'bad sampling' }, { status: 503 }], scriptScope: 'global' });
    const bad = await failure(chatCompletion(backend, { messages }, { dispatcher }));
    expect(bad).toBeInstanceOf(LlmBackendError);
    expect(bad).toMatchObject({ code: 'LLM_BACKEND', kind: 'http', httpStatus: 400, retryable: false, backendId: 'b1' });
    expect(bad.message).toContain('bad sampling');
    expect(LlmBackendError.isConnectFailure(bad)).toBe(false);
    const busy = await failure(chatCompletion(backend, { messages }, { dispatcher }));
    expect(busy).toMatchObject({ kind: 'http', httpStatus: 503, retryable: true });
  });

  it('fails with kind connect when nothing listens or the connection drops before an answer', async () => {
    const { policy, dispatcher, backend } = await setup({ script: [{ dropConnection: true }] });
    const dropped = await failure(chatCompletion(backend, { messages }, { dispatcher }));
    expect(dropped).toMatchObject({ code: 'LLM_BACKEND', kind: 'connect', retryable: true });
    expect(LlmBackendError.isConnectFailure(dropped)).toBe(true);
    await policy.kill();
    const refused = await failure(chatCompletion(backend, { messages }, { dispatcher }));
    expect(refused).toMatchObject({ kind: 'connect', retryable: true });
    expect(refused.message).toContain('ECONNREFUSED');
  });

  it('fails with kind timeout after timeoutMs', async () => {
    const { dispatcher, backend } = await setup({ hang: true });
    const error = await failure(chatCompletion(backend, { messages }, { dispatcher, timeoutMs: 100 }));
    expect(error).toMatchObject({ code: 'LLM_BACKEND', kind: 'timeout', retryable: true });
  });

  it("turns the caller's abort into CANCELLED, and an AbortSignal.timeout into TIMEOUT", async () => {
    const { dispatcher, backend } = await setup({ hang: true });
    const controller = new AbortController();
    const pending = failure(chatCompletion(backend, { messages }, { dispatcher, signal: controller.signal }));
    setTimeout(() => controller.abort(), 50);
    expect(await pending).toMatchObject({ code: 'CANCELLED', retryable: false });
    expect(await failure(chatCompletion(backend, { messages }, { dispatcher, signal: AbortSignal.timeout(50) }))).toMatchObject({ code: 'TIMEOUT' });
    expect(await failure(chatCompletion(backend, { messages }, { dispatcher, signal: AbortSignal.abort() }))).toMatchObject({ code: 'CANCELLED' });
  });

  it('fails with kind protocol on a body that is not a chat completion', async () => {
    const server = createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices": []}'));
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    const dispatcher = new Agent();
    agents.push(dispatcher);
    const error = await failure(chatCompletion({ id: 'odd', baseUrl: `http://127.0.0.1:${port}/v1` }, { messages }, { dispatcher }));
    expect(error).toMatchObject({ code: 'LLM_BACKEND', kind: 'protocol', retryable: false });
  });

  it('checks token ids and logprobs item by item, naming the first bad one and where it is', async () => {
    const message = { role: 'assistant', content: 'hi' };
    const bodies: Array<[string, Record<string, unknown>, RegExp | null]> = [
      ['fine', { prompt_token_ids: [1, 2, 3], choices: [{ message, token_ids: [4], logprobs: { content: [{ token: 'hi', logprob: -0.5, bytes: [104, 105] }] } }] }, null],
      ['a fractional prompt id', { prompt_token_ids: [1, 2.5, 3], choices: [{ message }] }, /item 1 is 2\.5\n.*at prompt_token_ids/],
      ['a string generation id', { choices: [{ message, token_ids: [4, '5'] }] }, /item 1 is "5"\n.*at choices\[0\]\.token_ids/],
      ['ids that are not an array', { prompt_token_ids: { 0: 1 }, choices: [{ message }] }, /expected an array of integers, received object\n.*at prompt_token_ids/],
      ['a logprob entry without its logprob', { choices: [{ message, logprobs: { content: [{ token: 'hi', logprob: -1 }, { token: '!' }] } }] }, /item 1 is \{"token":"!"\}\n.*at choices\[0\]\.logprobs\.content/],
    ];
    const server = createServer((req, res) => {
      const body = bodies.find(([name]) => name === req.headers['x-case'])![1];
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    const dispatcher = new Agent();
    agents.push(dispatcher);
    const backend = { id: 'odd', baseUrl: `http://127.0.0.1:${port}/v1` };
    for (const [name, , expected] of bodies) {
      const call = chatCompletion(backend, { messages }, { dispatcher, headers: { 'x-case': name } });
      if (expected === null) {
        expect((await call).promptTokenIds, name).toEqual([1, 2, 3]);
        continue;
      }
      const error = await failure(call);
      expect(error, name).toMatchObject({ code: 'LLM_BACKEND', kind: 'protocol' });
      expect((error as Error).message, name).toMatch(expected);
    }
  });
});
