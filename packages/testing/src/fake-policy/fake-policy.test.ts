import { Agent, request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { fakeEmbedding, renderCompletion, renderPrompt, renderToolCall, startFakePolicy, toyLogprob, toyTokenizer, type FakePolicy, type FakePolicyOptions } from './index.ts';

const open: FakePolicy[] = [];
const agents: Agent[] = [];

async function start(options: FakePolicyOptions = {}): Promise<FakePolicy> {
  const policy = await startFakePolicy(options);
  open.push(policy);
  return policy;
}

afterEach(async () => {
  await Promise.all(open.splice(0).map((p) => p.close()));
  await Promise.all(agents.splice(0).map((a) => a.close()));
});

function client(): Agent {
  const agent = new Agent();
  agents.push(agent);
  return agent;
}

async function post(policy: FakePolicy, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) {
  const response = await request(`${policy.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    dispatcher: client(),
    ...(signal ? { signal } : {}),
  });
  const text = await response.body.text();
  return { status: response.statusCode, headers: response.headers, text, json: JSON.parse(text.startsWith('data:') ? 'null' : text) as any };
}

const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'What is 2 + 2?' },
];

describe('fake policy: JSON chat completions', () => {
  it('answers text with token ids and logprobs computed by the toy tokenizer', async () => {
    const policy = await start({ script: ['The answer is 4.'] });
    const { status, json } = await post(policy, { model: 'fake-policy', messages, logprobs: true, top_logprobs: 0, return_token_ids: true });
    expect(status).toBe(200);
    const pieces = ['The', ' ', 'answer', ' ', 'is', ' ', '4', '.'];
    expect(toyTokenizer.pieces('The answer is 4.')).toEqual(pieces);
    const ids = pieces.map(toyTokenizer.tokenId);
    const promptIds = toyTokenizer.encode('<|system|>You are terse.<|end|><|user|>What is 2 + 2?<|end|><|assistant|>');
    expect(json.object).toBe('chat.completion');
    expect(json.prompt_token_ids).toEqual(promptIds);
    const [choice] = json.choices;
    expect(choice.message).toMatchObject({ role: 'assistant', content: 'The answer is 4.', tool_calls: [], reasoning_content: null });
    expect(choice.finish_reason).toBe('stop');
    expect(choice.token_ids).toEqual(ids);
    expect(choice.logprobs.content).toEqual(
      pieces.map((piece, i) => ({ token: piece, logprob: toyLogprob(ids[i]!), bytes: [...Buffer.from(piece)], top_logprobs: [] })),
    );
    expect(json.usage).toMatchObject({ prompt_tokens: promptIds.length, completion_tokens: 8, total_tokens: promptIds.length + 8 });
    expect(policy.requests).toHaveLength(1);
    expect(policy.requests[0]!.messages).toEqual(messages);
  });

  it('leaves token ids and logprobs out unless asked, and names tokens by id when asked', async () => {
    const policy = await start();
    const plain = await post(policy, { messages });
    expect(plain.json.choices[0].message.content).toBe('Hello from the fake policy.');
    expect(plain.json.choices[0].logprobs).toBeNull();
    expect(plain.json.choices[0]).not.toHaveProperty('token_ids');
    expect(plain.json).not.toHaveProperty('prompt_token_ids');

    const byId = await post(policy, { messages, logprobs: true, top_logprobs: 2, return_tokens_as_token_ids: true });
    const entries = byId.json.choices[0].logprobs.content as Array<{ token: string; top_logprobs: unknown[] }>;
    expect(entries.map((e) => e.token)).toEqual(toyTokenizer.encode('Hello from the fake policy.').map((id) => `token_id:${id}`));
    expect(entries[0]!.top_logprobs).toHaveLength(2);
  });

  it('returns tool calls with finish_reason tool_calls and counts their tokens', async () => {
    const policy = await start({
      script: [{ content: 'Let me run it.', toolCalls: [{ name: 'bash', arguments: { command: 'ls' }, id: 'call_1' }, { name: 'python', arguments: '{"code": "1+1"' }] }],
    });
    const { json } = await post(policy, { messages, tools: [{ type: 'function', function: { name: 'bash' } }], return_token_ids: true });
    const [choice] = json.choices;
    expect(choice.finish_reason).toBe('tool_calls');
    expect(choice.message.content).toBe('Let me run it.');
    expect(choice.message.tool_calls).toEqual([
      { id: 'call_1', type: 'function', function: { name: 'bash', arguments: '{"command":"ls"}' } },
      { id: 'chatcmpl-tool-0-0-1', type: 'function', function: { name: 'python', arguments: '{"code": "1+1"' } },
    ]);
    const generated = `Let me run it.${renderToolCall('bash', '{"command":"ls"}')}${renderToolCall('python', '{"code": "1+1"')}`;
    expect(choice.token_ids).toEqual(toyTokenizer.encode(generated));
    expect(json.prompt_token_ids).toEqual(toyTokenizer.encode(renderPrompt(messages, [{ type: 'function', function: { name: 'bash' } }])));
  });

  it('renders earlier tool calls and tool results into the prompt', async () => {
    const policy = await start();
    const history = [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'bash', arguments: '{"command":"ls"}' } }] },
      { role: 'tool', tool_call_id: 'c', content: 'a.txt' },
    ];
    const { json } = await post(policy, { messages: history, return_token_ids: true });
    const text = `<|system|>You are terse.<|end|><|user|>What is 2 + 2?<|end|><|assistant|><tool_call>{"name":"bash","arguments":{"command":"ls"}}</tool_call><|end|><|tool|>a.txt<|end|><|assistant|>`;
    expect(renderPrompt(history)).toBe(text);
    expect(json.prompt_token_ids).toEqual(toyTokenizer.encode(text));
  });

  it('returns reasoning as reasoning_content, generated inside <think>', async () => {
    const policy = await start({ script: [{ reasoning: 'two and two', content: '4' }] });
    const { json } = await post(policy, { messages, return_token_ids: true, logprobs: true });
    const [choice] = json.choices;
    expect(choice.message.reasoning_content).toBe('two and two');
    expect(choice.message.content).toBe('4');
    expect(choice.token_ids).toEqual(toyTokenizer.encode('<think>two and two</think>4'));
    expect(choice.logprobs.content).toHaveLength(choice.token_ids.length);
  });

  it('cuts the reply at max_tokens with finish_reason length, and honours a scripted length', async () => {
    const policy = await start({
      script: [
        { content: 'one two three four', toolCalls: [{ name: 'bash', arguments: {} }] },
        { reasoning: 'long thoughts here', content: 'x' },
        { content: 'complete text', finishReason: 'length' },
      ],
      scriptScope: 'global',
    });
    const cut = await post(policy, { messages, max_tokens: 3, return_token_ids: true });
    expect(cut.json.choices[0]).toMatchObject({ finish_reason: 'length', message: { content: 'one two', tool_calls: [] } });
    expect(cut.json.choices[0].token_ids).toEqual(toyTokenizer.encode('one two'));
    expect(cut.json.usage.completion_tokens).toBe(3);

    const inThink = await post(policy, { messages, max_completion_tokens: 3 });
    expect(inThink.json.choices[0]).toMatchObject({ finish_reason: 'length', message: { content: null, reasoning_content: 'long ' } });

    const scripted = await post(policy, { messages });
    expect(scripted.json.choices[0]).toMatchObject({ finish_reason: 'length', message: { content: 'complete text' } });
  });

  it('answers n choices, one per scripted choice or the reply repeated', async () => {
    const policy = await start({ script: [{ content: 'a', choices: [{ content: 'first' }, { content: 'second' }] }, 'same'], scriptScope: 'global' });
    const two = await post(policy, { messages, n: 2 });
    expect(two.json.choices.map((c: any) => [c.index, c.message.content])).toEqual([
      [0, 'first'],
      [1, 'second'],
    ]);
    const three = await post(policy, { messages, n: 3, return_token_ids: true });
    expect(three.json.choices.map((c: any) => c.message.content)).toEqual(['same', 'same', 'same']);
    expect(three.json.usage.completion_tokens).toBe(3);
  });

  it('acts like vLLM before 0.10.2 when told to: return_token_ids is ignored', async () => {
    const policy = await start({ supportsReturnTokenIds: false });
    const { json } = await post(policy, { messages, return_token_ids: true, logprobs: true, return_tokens_as_token_ids: true });
    expect(json).not.toHaveProperty('prompt_token_ids');
    expect(json.choices[0]).not.toHaveProperty('token_ids');
    expect(json.choices[0].logprobs.content[0].token).toMatch(/^token_id:\d+$/);
  });
});

describe('fake policy: SSE streaming', () => {
  function parseEvents(text: string): Array<any> {
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
    return text
      .split('\n\n')
      .filter((block) => block.startsWith('data: ') && block !== 'data: [DONE]')
      .map((block) => JSON.parse(block.slice('data: '.length)));
  }

  it('streams content, reasoning and tool calls token by token, then usage and [DONE]', async () => {
    const reply = { reasoning: 'think a bit', content: 'Running ls.', toolCalls: [{ name: 'bash', arguments: '{"command":"ls"}' }] };
    const policy = await start({ script: [reply] });
    const response = await post(policy, {
      messages,
      stream: true,
      stream_options: { include_usage: true },
      logprobs: true,
      return_token_ids: true,
    });
    expect(response.status).toBe(200);
    expect(response.headers['content-type']).toMatch(/^text\/event-stream/);
    const events = parseEvents(response.text);
    expect(events.every((e) => e.object === 'chat.completion.chunk')).toBe(true);
    expect(events[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
    expect(events[0].prompt_token_ids).toEqual(toyTokenizer.encode(renderPrompt(messages)));

    const choiceEvents = events.filter((e) => e.choices.length > 0).map((e) => e.choices[0]);
    const content = choiceEvents.map((c) => c.delta.content ?? '').join('');
    const reasoning = choiceEvents.map((c) => c.delta.reasoning_content ?? '').join('');
    const toolCalls = choiceEvents.flatMap((c) => c.delta.tool_calls ?? []);
    const tokenIds = choiceEvents.flatMap((c) => c.token_ids ?? []);
    const logprobs = choiceEvents.flatMap((c) => c.logprobs?.content ?? []);
    expect(content).toBe('Running ls.');
    expect(reasoning).toBe('think a bit');
    expect(toolCalls).toEqual([{ index: 0, id: 'chatcmpl-tool-0-0-0', type: 'function', function: { name: 'bash', arguments: '{"command":"ls"}' } }]);
    const expectedIds = toyTokenizer.encode(renderCompletion(reply));
    expect(tokenIds).toEqual(expectedIds);
    expect(logprobs.map((l: any) => l.logprob)).toEqual(expectedIds.map(toyLogprob));
    expect(choiceEvents.at(-1).finish_reason).toBe('tool_calls');

    const usage = events.at(-1);
    expect(usage.choices).toEqual([]);
    expect(usage.usage.completion_tokens).toBe(expectedIds.length);
  });

  it('sends no usage chunk unless asked', async () => {
    const policy = await start();
    const events = parseEvents((await post(policy, { messages, stream: true })).text);
    expect(events.some((e) => e.usage)).toBe(false);
    expect(events.at(-1).choices[0].finish_reason).toBe('stop');
  });
});

describe('fake policy: scripting', () => {
  it('consumes an array per conversation, keyed by header or by the first user message', async () => {
    const policy = await start({ script: ['first', 'second'] });
    const ask = async (headers: Record<string, string>, user = 'hi') =>
      (await post(policy, { messages: [{ role: 'user', content: user }] }, headers)).json.choices[0].message.content;
    expect(await ask({ 'x-rollout-id': 'a' })).toBe('first');
    expect(await ask({ 'x-rollout-id': 'b' })).toBe('first');
    expect(await ask({ 'x-rollout-id': 'a' })).toBe('second');
    expect(await ask({}, 'question one')).toBe('first');
    expect(await ask({}, 'question one')).toBe('second');
    const exhausted = await post(policy, { messages: [{ role: 'user', content: 'hi' }] }, { 'x-rollout-id': 'a' });
    expect(exhausted.status).toBe(500);
    expect(exhausted.json.error.message).toMatch(/no reply for call 2 of a/);
    expect(policy.calls.map((c) => [c.conversation, c.conversationCallIndex])).toEqual([
      ['a', 0],
      ['b', 0],
      ['a', 1],
      ['question one', 0],
      ['question one', 1],
      ['a', 2],
    ]);
  });

  it('consumes an array globally when told to', async () => {
    const policy = await start({ script: ['first', 'second'], scriptScope: 'global' });
    expect((await post(policy, { messages }, { 'x-rollout-id': 'a' })).json.choices[0].message.content).toBe('first');
    expect((await post(policy, { messages }, { 'x-rollout-id': 'b' })).json.choices[0].message.content).toBe('second');
  });

  it('asks a script function, with the call indexes and the turn', async () => {
    const seen: unknown[] = [];
    const policy = await start({
      script: async (request, ctx) => {
        seen.push({ ...ctx, headers: undefined, n: request.messages.length });
        return `turn ${ctx.turn}`;
      },
    });
    await post(policy, { messages }, { 'x-rollout-id': 'r1' });
    const second = await post(policy, { messages: [...messages, { role: 'assistant', content: 'x' }, { role: 'user', content: 'y' }] }, { 'x-rollout-id': 'r1' });
    expect(second.json.choices[0].message.content).toBe('turn 1');
    expect(seen).toEqual([
      { callIndex: 0, conversationCallIndex: 0, conversation: 'r1', turn: 0, headers: undefined, n: 2 },
      { callIndex: 1, conversationCallIndex: 1, conversation: 'r1', turn: 1, headers: undefined, n: 4 },
    ]);
  });
});

describe('fake policy: faults and lifecycle', () => {
  it('answers an injected status with an OpenAI error body, per reply or globally', async () => {
    const policy = await start({ script: [{ status: 503, errorMessage: 'overloaded' }, 'fine', 'fine'], scriptScope: 'global' });
    const failed = await post(policy, { messages });
    expect(failed.status).toBe(503);
    expect(failed.json).toEqual({ error: { message: 'overloaded', type: 'ServiceUnavailableError', param: null, code: 503 } });
    expect((await post(policy, { messages })).status).toBe(200);
    policy.setFaults({ status: 500 });
    expect((await post(policy, { messages })).status).toBe(500);
    expect((await request(`${policy.url}/models`, { dispatcher: client() })).statusCode).toBe(500);
    policy.setFaults({});
    expect((await post(policy, { messages })).status).toBe(200);
  });

  it('adds latency', async () => {
    const policy = await start({ script: [{ content: 'slow', latencyMs: 150 }] });
    const started = performance.now();
    await post(policy, { messages });
    expect(performance.now() - started).toBeGreaterThanOrEqual(140);
  });

  it('drops the connection mid-request', async () => {
    const policy = await start({ script: [{ dropConnection: true }] });
    await expect(post(policy, { messages })).rejects.toMatchObject({ code: 'UND_ERR_SOCKET' });
    expect(policy.requests).toHaveLength(1);
  });

  it('hangs until the caller gives up, and close() ends the hang', async () => {
    const policy = await start({ hang: true });
    await expect(post(policy, { messages }, {}, AbortSignal.timeout(200))).rejects.toThrow();
    const pending = post(policy, { messages }).catch((error: unknown) => error);
    await new Promise((resolve) => setTimeout(resolve, 50));
    await policy.close();
    expect(await pending).toMatchObject({ code: 'UND_ERR_SOCKET' });
  });

  it('dies with kill() and comes back on the same port with restart()', async () => {
    const policy = await start();
    const url = policy.url;
    expect((await post(policy, { messages })).status).toBe(200);
    await policy.kill();
    expect(policy.running).toBe(false);
    await expect(post(policy, { messages })).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    await policy.restart();
    expect(policy.url).toBe(url);
    expect((await post(policy, { messages })).status).toBe(200);
  });

  it('kill() drops requests in flight', async () => {
    const policy = await start({ latencyMs: 5_000 });
    const pending = post(policy, { messages }).catch((error: unknown) => error);
    await new Promise((resolve) => setTimeout(resolve, 50));
    await policy.kill();
    expect(await pending).toMatchObject({ code: 'UND_ERR_SOCKET' });
  });

  it('serves /v1/models and /health, checks the api key and the model name', async () => {
    const policy = await start({ apiKey: 'secret', model: 'qwen' });
    const models = await request(`${policy.url}/models`, { headers: { authorization: 'Bearer secret' }, dispatcher: client() });
    expect(await models.body.json()).toMatchObject({ object: 'list', data: [{ id: 'qwen', object: 'model' }] });
    expect(policy.modelListCalls).toBe(1);
    const health = await request(policy.url.replace(/\/v1$/, '/health'), { dispatcher: client() });
    expect(health.statusCode).toBe(200);
    await health.body.dump();
    expect((await post(policy, { messages })).status).toBe(401);
    expect((await post(policy, { messages, model: 'other' }, { authorization: 'Bearer secret' })).status).toBe(404);
    expect((await post(policy, { messages: [] }, { authorization: 'Bearer secret' })).status).toBe(400);
    expect((await post(policy, { messages, model: 'qwen' }, { authorization: 'Bearer secret' })).status).toBe(200);
  });

  it('refuses prompts longer than the model length with 400, as vLLM does', async () => {
    const policy = await start({ maxModelLen: 20 });
    const response = await post(policy, { messages, max_tokens: 10 });
    expect(response.status).toBe(400);
    expect(response.json.error.message).toMatch(/maximum context length is 20 tokens/);
  });
});

describe('embeddings', () => {
  const embed = async (policy: FakePolicy, body: unknown) => {
    const response = await fetch(`${policy.url}/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: response.status, json: (await response.json()) as any };
  };

  it('answers in OpenAI\'s shape with a deterministic hashed bag of words', async () => {
    const policy = await start({ embeddingDims: 16 });
    const { status, json } = await embed(policy, { model: 'fake-policy', input: ['x = 1', 'x = 1', ''] });
    expect(status).toBe(200);
    expect(json).toMatchObject({ object: 'list', model: 'fake-policy', usage: { prompt_tokens: 10, total_tokens: 10 } });
    expect(json.data.map((d: { index: number }) => d.index)).toEqual([0, 1, 2]);
    const [a, b, empty] = json.data.map((d: { embedding: number[] }) => d.embedding);
    expect(a).toHaveLength(16);
    expect(a).toEqual(b);
    expect(a).toEqual(fakeEmbedding('x = 1', 16));
    // three pieces of weight 1, normalised: squares sum to 1
    expect(a.reduce((s: number, v: number) => s + v * v, 0)).toBeCloseTo(1, 10);
    expect(empty.every((v: number) => v === 0)).toBe(true);
    expect(policy.embeddingRequests).toHaveLength(1);
    expect((await embed(policy, { model: 'other', input: 'x' })).status).toBe(404);
  });

  it('can be down on its own', async () => {
    const policy = await start({ embeddingFaults: { status: 503 } });
    expect((await embed(policy, { model: 'fake-policy', input: 'x' })).status).toBe(503);
    expect((await post(policy, { model: 'fake-policy', messages })).status).toBe(200);
    policy.setEmbeddingFaults({});
    expect((await embed(policy, { model: 'fake-policy', input: 'x' })).status).toBe(200);
  });
});

async function postTo(policy: FakePolicy, path: string, body: unknown) {
  const response = await request(`${policy.url.replace(/\/v1$/, '')}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    dispatcher: client(),
  });
  const text = await response.body.text();
  return { status: response.statusCode, json: JSON.parse(text) as any };
}

describe('fake policy: token-in (vLLM /tokenize and /v1/completions with token ids)', () => {
  const tools = [{ type: 'function', function: { name: 'add', parameters: { type: 'object' } } }];

  it('tokenizes a chat with the template, with or without the generation prompt, and a text', async () => {
    const policy = await start({ maxModelLen: 4096 });
    const withPrompt = await postTo(policy, '/tokenize', { model: 'fake-policy', messages, tools, add_generation_prompt: true });
    const ids = toyTokenizer.encode(renderPrompt(messages, tools));
    expect(withPrompt).toEqual({ status: 200, json: { count: ids.length, max_model_len: 4096, tokens: ids, token_strs: null } });
    const without = await postTo(policy, '/tokenize', { messages, add_generation_prompt: false });
    expect(without.json.tokens).toEqual(toyTokenizer.encode(renderPrompt(messages, undefined, { addGenerationPrompt: false })));
    const text = await postTo(policy, '/tokenize', { prompt: 'a b', return_token_strs: true });
    expect(text.json).toMatchObject({ tokens: toyTokenizer.encode('a b'), token_strs: ['a', ' ', 'b'] });
    expect((await postTo(policy, '/tokenize', { nothing: true })).status).toBe(400);
    expect((await postTo(policy, '/tokenize', { model: 'other', messages })).status).toBe(404);
    expect(policy.tokenizeRequests).toHaveLength(5);
  });

  it('generates from a token-id prompt: the script sees the messages, the answer is vLLM\'s text_completion', async () => {
    const seen: unknown[] = [];
    const policy = await start({
      script: (request, ctx) => {
        seen.push([request.messages, request.tools, ctx.turn]);
        return { reasoning: 'hm', toolCalls: [{ name: 'add', arguments: { count: 2 } }] };
      },
    });
    const prompt = (await postTo(policy, '/tokenize', { messages, tools })).json.tokens as number[];
    const { status, json } = await postTo(policy, '/v1/completions', { model: 'fake-policy', prompt, logprobs: 1, return_token_ids: true, return_tokens_as_token_ids: true });
    expect(status).toBe(200);
    expect(seen).toEqual([[messages, tools, 0]]);
    const text = renderCompletion({ reasoning: 'hm', toolCalls: [{ name: 'add', arguments: '{"count":2}' }] });
    const ids = toyTokenizer.encode(text);
    expect(json.object).toBe('text_completion');
    const [choice] = json.choices;
    expect(choice).toMatchObject({ index: 0, text, finish_reason: 'stop', token_ids: ids, prompt_token_ids: prompt });
    expect(choice.logprobs.tokens).toEqual(ids.map((id) => `token_id:${id}`));
    expect(choice.logprobs.token_logprobs).toEqual(ids.map(toyLogprob));
    expect(json.usage).toMatchObject({ prompt_tokens: prompt.length, completion_tokens: ids.length });
    // The generation's ids can be sent back: the script then sees the assistant turn and the tool output.
    const next = [...prompt, ...ids, ...toyTokenizer.encode('<|end|>')];
    const tail = (await postTo(policy, '/tokenize', { prompt: '<|tool|>3<|end|><|assistant|>' })).json.tokens as number[];
    expect((await postTo(policy, '/v1/completions', { prompt: [...next, ...tail] })).status).toBe(200);
    expect(seen[1]).toEqual([
      [
        ...messages,
        { role: 'assistant', reasoning_content: 'hm', content: null, tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'add', arguments: '{"count":2}' } }] },
        { role: 'tool', content: '3' },
      ],
      tools,
      1,
    ]);
    expect(policy.calls.map((c) => c.endpoint)).toEqual(['completions', 'completions']);
    expect(policy.requests).toHaveLength(0);
  });

  it('refuses token ids it never gave out, batched prompts and streams with 400', async () => {
    const policy = await start();
    expect((await postTo(policy, '/v1/completions', { prompt: [1, 2, 3] })).json.error.message).toMatch(/token id 1 is not one this server gave out/);
    expect((await postTo(policy, '/v1/completions', { prompt: [[1], [2]] })).status).toBe(400);
    expect((await postTo(policy, '/v1/completions', { prompt: 'hi', stream: true })).status).toBe(400);
    expect((await postTo(policy, '/v1/completions', { prompt: 'hi' })).status).toBe(200);
  });

  it('drifts when told to: tool calls generated with spaces, returned and re-rendered compactly', async () => {
    const policy = await start({ drifting: true, script: [{ toolCalls: [{ name: 'add', arguments: { count: 2 } }] }] });
    const { json } = await post(policy, { messages, return_token_ids: true });
    const [choice] = json.choices;
    const generated = '<tool_call>{"name": "add", "arguments": {"count": 2}}</tool_call>';
    expect(choice.token_ids).toEqual(toyTokenizer.encode(generated));
    expect(choice.message.tool_calls[0].function.arguments).toBe('{"count":2}');
    // sent back, the template renders the call compactly: the prompt no longer extends prompt + generation
    const rerendered = toyTokenizer.encode(renderPrompt([...messages, { role: 'assistant', content: null, tool_calls: choice.message.tool_calls }]));
    const extended = [...json.prompt_token_ids, ...choice.token_ids];
    expect(rerendered.slice(0, extended.length)).not.toEqual(extended);
    expect(renderToolCall('add', '{"count":2}')).toBe('<tool_call>{"name":"add","arguments":{"count":2}}</tool_call>');
  });
});
