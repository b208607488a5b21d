import { describe, expect, it } from 'vitest';
import { buildResponse, inputToMessages, responsesToolsToChat } from './messages.ts';
import type { TurnRecord } from '../protocol/rollout.ts';

describe('Responses input to chat messages', () => {
  it('maps a string, instructions, easy messages, function calls and their outputs', () => {
    expect(inputToMessages({ input: 'hi' })).toEqual([{ role: 'user', content: 'hi' }]);
    const messages = inputToMessages({
      instructions: 'be brief',
      input: [
        { role: 'system', content: 'sys' },
        { role: 'user', content: [{ type: 'input_text', text: 'a' }, { type: 'input_text', text: 'b' }], type: 'message' },
        { type: 'function_call', call_id: 'c1', name: 'bash', arguments: '{"command":"ls"}' },
        { type: 'function_call', call_id: 'c2', name: 'bash', arguments: '{}' },
        { type: 'function_call_output', call_id: 'c1', output: 'x' },
      ],
    });
    expect(messages).toEqual([
      { role: 'system', content: 'be brief' },
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'ab' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          { id: 'c1', type: 'function', function: { name: 'bash', arguments: '{"command":"ls"}' } },
          { id: 'c2', type: 'function', function: { name: 'bash', arguments: '{}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'c1', content: 'x' },
    ]);
  });

  it('converts Responses function tools to chat tools and skips other kinds', () => {
    expect(responsesToolsToChat([{ type: 'function', name: 'f', parameters: { type: 'object' } }, { type: 'web_search' }])).toEqual([
      { type: 'function', function: { name: 'f', parameters: { type: 'object' } } },
    ]);
  });
});

describe('NeMo Gym response from turns', () => {
  const base = { prompt_token_ids: [1, 2], generation_token_ids: [3], generation_logprobs: [-0.1], llm_latency_ms: 1, backend: 'b', weight_version: null, rewards: { format: 1, tool: 1, outcome: 0, shaping: 0 }, reward: 0, return: 0, normalized_return: null, code: null, status: 'ok' as const, malformed: null };
  const turns: TurnRecord[] = [
    { ...base, index: 0, finish_reason: 'tool_calls', text: '', reasoning: 'think', tool_calls: [{ id: 'c1', name: 'bash', arguments: '{}', output: 'out', status: 'ok', execution: null, code: null, duration_ms: 1 }] },
    { ...base, index: 1, prompt_token_ids: [1, 2, 3, 4], generation_token_ids: [5, 6], generation_logprobs: [-0.2, -0.3], finish_reason: 'stop', text: 'done', reasoning: null, tool_calls: [] },
  ];

  it('puts token ids on the last item of each model call and sums usage', () => {
    const response = buildResponse({ id: 'r1', model: 'm', turns, tools: [], usage: { input: 6, output: 3 } });
    const output = response.output as Array<Record<string, unknown>>;
    expect(output.map((o) => o.type)).toEqual(['reasoning', 'function_call', 'function_call_output', 'message']);
    expect(output[0]!.generation_token_ids).toBeUndefined();
    expect(output[1]).toMatchObject({ call_id: 'c1', prompt_token_ids: [1, 2], generation_token_ids: [3], generation_log_probs: [-0.1] });
    expect(output[2]).toEqual({ type: 'function_call_output', call_id: 'c1', output: 'out' });
    expect(output[3]).toMatchObject({ role: 'assistant', generation_token_ids: [5, 6], content: [{ type: 'output_text', text: 'done', annotations: [] }] });
    expect(response.usage).toMatchObject({ input_tokens: 6, output_tokens: 3, total_tokens: 9 });
    expect(response.incomplete_details).toBeNull();
  });

  it('marks a length stop as incomplete', () => {
    const cut = [{ ...turns[1]!, finish_reason: 'length' }];
    const response = buildResponse({ id: 'r2', model: 'm', turns: cut, tools: [], usage: { input: 1, output: 1 } });
    expect(response.incomplete_details).toEqual({ reason: 'max_output_tokens' });
    expect((response.output as Array<{ status: string }>)[0]!.status).toBe('incomplete');
  });
});
