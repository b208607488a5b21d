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
import { LlmBackendPool } from './backend-pool.ts';
import { TokenConversation } from './token-conversation.ts';
import type { ChatResult, LlmChatMessage, LlmTool } from './types.ts';

const policies: FakePolicy[] = [];
const pools: LlmBackendPool[] = [];

afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.close()));
  await Promise.all(policies.splice(0).map((p) => p.close()));
});

const tools: LlmTool[] = [{ type: 'function', function: { name: 'add', parameters: { type: 'object' } } }];
const add = (count: number) => ({ toolCalls: [{ name: 'add', arguments: { count } }] });

async function setup(options: FakePolicyOptions) {
  const policy = await startFakePolicy(options);
  policies.push(policy);
  const pool = new LlmBackendPool({ backends: [{ id: 'b1', baseUrl: policy.url }] });
  pools.push(pool);
  const conversation = new TokenConversation();
  const messages: LlmChatMessage[] = [
    { role: 'system', content: 'Use tools.' },
    { role: 'user', content: 'Add 2, then 3.' },
  ];
  /** One turn as the agent loop runs it: the call, then the assistant reply and a tool output appended. */
  const turn = async (output?: string, sampling: Record<string, unknown> = { temperature: 0 }): Promise<ChatResult> => {
    const result = await conversation.turn((call) => pool.send('r1', call), { messages: [...messages], tools, model: 'fake-policy', sampling });
    const calls = result.message.toolCalls;
    messages.push({
      role: 'assistant',
      content: result.message.content,
      ...(calls.length > 0 ? { tool_calls: calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })) } : {}),
    });
    for (const call of calls) messages.push({ role: 'tool', tool_call_id: call.id, content: output ?? 'ok' });
    return result;
  };
  return { policy, messages, turn };
}

describe('TokenConversation (token-in generation)', () => {
  it('tokenizes the first prompt, generates from its ids by /v1/completions, and parses the Hermes tool call', async () => {
    const { policy, turn } = await setup({ script: [add(2)] });
    const first = await turn();
    expect(policy.tokenizeRequests[0]).toEqual({
      model: 'fake-policy',
      messages: [
        { role: 'system', content: 'Use tools.' },
        { role: 'user', content: 'Add 2, then 3.' },
      ],
      tools,
      add_generation_prompt: true,
    });
    const prompt = toyTokenizer.encode(renderPrompt([{ role: 'system', content: 'Use tools.' }, { role: 'user', content: 'Add 2, then 3.' }], tools));
    expect(policy.completionRequests[0]).toMatchObject({ model: 'fake-policy', prompt, logprobs: 1, return_token_ids: true, temperature: 0 });
    expect(policy.requests).toHaveLength(0);
    const generated = toyTokenizer.encode(renderCompletion({ toolCalls: [{ name: 'add', arguments: '{"count":2}' }] }));
    expect(first.promptTokenIds).toEqual(prompt);
    expect(first.generationTokenIds).toEqual(generated);
    expect(first.generationLogprobs).toEqual(generated.map(toyLogprob));
    expect(first.message).toEqual({ role: 'assistant', content: null, toolCalls: [{ id: 'call_0_0', name: 'add', arguments: '{"count":2}' }] });
    expect(first.finishReason).toBe('tool_calls');
    expect(first.usage).toEqual({ promptTokens: prompt.length, completionTokens: generated.length, totalTokens: prompt.length + generated.length });
  });

  it('extends the previous prompt and generation by the end of the turn and the new messages, without drift the same ids as chat', async () => {
    const { messages, turn } = await setup({ script: [add(2), add(3), 'Done: 5.'] });
    const turns = [await turn('2'), await turn('5'), await turn()];
    for (let t = 1; t < turns.length; t++) {
      const previous = [...turns[t - 1]!.promptTokenIds!, ...turns[t - 1]!.generationTokenIds!];
      const prompt = turns[t]!.promptTokenIds!;
      expect(prompt.slice(0, previous.length)).toEqual(previous);
      // the turn's end (<|end|>), then the tool output and the generation prompt
      expect(toyTokenizer.encode('<|end|><|tool|>')).toEqual(prompt.slice(previous.length, previous.length + 2));
    }
    // Without drift, what a chat server renders is the same sequence.
    expect(turns[2]!.promptTokenIds).toEqual(toyTokenizer.encode(renderPrompt(messages.slice(0, -1), tools)));
    expect(turns[2]!.message.content).toBe('Done: 5.');
    expect(turns[2]!.finishReason).toBe('stop');
  });

  it('keeps the generated tokens of a drifting policy that a re-rendered conversation would change', async () => {
    const { policy, messages, turn } = await setup({ drifting: true, script: [add(2), 'Done.'] });
    const first = await turn('2');
    // The model wrote the call with spaces; the parsed call (and the template) are compact.
    expect(first.generationTokenIds).toEqual(toyTokenizer.encode('<tool_call>{"name": "add", "arguments": {"count": 2}}</tool_call>'));
    expect(first.message.toolCalls[0]!.arguments).toBe('{"count":2}');
    const second = await turn();
    const previous = [...first.promptTokenIds!, ...first.generationTokenIds!];
    expect(second.promptTokenIds!.slice(0, previous.length)).toEqual(previous);
    const rerendered = toyTokenizer.encode(renderPrompt(messages.slice(0, -1), tools));
    expect(rerendered.slice(0, previous.length)).not.toEqual(previous);
    // The script saw the conversation read back from the ids: the tool output, one assistant turn.
    expect(policy.calls.map((c) => [c.endpoint, c.body.messages.length])).toEqual([
      ['completions', 2],
      ['completions', 4],
    ]);
  });

  it('does not add the end of a turn twice when the model generated it', async () => {
    const { turn } = await setup({ script: [{ content: 'Adding.<|end|>' }, 'Done.'] });
    // A reply without calls before the last turn: the loop goes on with the next generation prompt.
    const first = await turn();
    const second = await turn();
    const end = toyTokenizer.encode('<|end|>')[0]!;
    expect(first.generationTokenIds!.at(-1)).toBe(end);
    expect(second.promptTokenIds).toEqual([...first.promptTokenIds!, ...first.generationTokenIds!, ...toyTokenizer.encode('<|assistant|>')]);
  });

  it('adds the end of a turn the template renders without the generation (reasoning it drops)', async () => {
    const { policy, turn } = await setup({ script: [{ reasoning: 'Think first.' }, 'Done.'] });
    const first = await turn();
    expect(first.message).toEqual({ role: 'assistant', content: '', reasoning: 'Think first.', toolCalls: [] });
    const second = await turn();
    expect(second.promptTokenIds).toEqual([...first.promptTokenIds!, ...first.generationTokenIds!, ...toyTokenizer.encode('<|end|><|assistant|>')]);
    // learnt from the first prompt with an empty reply
    expect(policy.tokenizeRequests.at(-1)).toMatchObject({ messages: [{ role: 'system' }, { role: 'user' }, { role: 'assistant', content: '' }], add_generation_prompt: false });
  });

  it('reads generated ids from token_id:N logprob tokens on a vLLM without return_token_ids', async () => {
    const { turn } = await setup({ supportsReturnTokenIds: false, script: ['old vLLM'] });
    const result = await turn();
    expect(result.generationTokenIds).toEqual(toyTokenizer.encode('old vLLM'));
    expect(result.generationLogprobs).toEqual(toyTokenizer.encode('old vLLM').map(toyLogprob));
  });

  it('reports a length stop with an unfinished call as text', async () => {
    const { policy, turn } = await setup({ script: [{ ...add(2), content: 'Adding' }] });
    const cut = await turn(undefined, { max_tokens: 3 });
    expect(cut.finishReason).toBe('length');
    expect(cut.generationTokenIds).toHaveLength(3);
    expect(cut.message).toEqual({ role: 'assistant', content: 'Adding<tool_call>{', toolCalls: [] });
    expect(policy.completionRequests[0]).toMatchObject({ max_tokens: 3 });
  });
});
