import { describe, expect, it } from 'vitest';
import { malformedReason } from '../protocol/reward-components.ts';
import { parseHermesGeneration } from './hermes-parser.ts';

describe('parseHermesGeneration', () => {
  it('reads reasoning, the content before the calls, and each call in either JSON spacing', () => {
    const text =
      '<think>Add, then read.</think>Working on it.\n<tool_call>\n{"name": "add", "arguments": {"count": 2}}\n</tool_call><tool_call>{"name":"read","arguments":{}}</tool_call>';
    expect(parseHermesGeneration(text, 'call_3')).toEqual({
      reasoning: 'Add, then read.',
      content: 'Working on it.\n',
      toolCalls: [
        { id: 'call_3_0', name: 'add', arguments: '{"count":2}' },
        { id: 'call_3_1', name: 'read', arguments: '{}' },
      ],
    });
  });

  it('gives content null when the text starts with a call, keeps string arguments, and reads an unclosed last call', () => {
    expect(parseHermesGeneration('<tool_call>{"name":"f","arguments":"{\\"x\\": 1}"}</tool_call>')).toEqual({
      content: null,
      toolCalls: [{ id: 'call_0', name: 'f', arguments: '{"x": 1}' }],
    });
    expect(parseHermesGeneration('<tool_call>{"name":"f"}').toolCalls).toEqual([{ id: 'call_0', name: 'f', arguments: '{}' }]);
  });

  it('is an answer without calls', () => {
    expect(parseHermesGeneration('The counter is 5.')).toEqual({ content: 'The counter is 5.', toolCalls: [] });
    expect(parseHermesGeneration('')).toEqual({ content: '', toolCalls: [] });
  });

  it('makes a malformed call text without calls, which scores as a malformed turn, never a throw', () => {
    for (const text of [
      'Let me add.<tool_call>{"name": "add", "arguments": {"count": }</tool_call>',
      '<tool_call>{"arguments": {}}</tool_call>',
      '<tool_call>[1, 2]</tool_call>',
      '<tool_call>null</tool_call>',
      '<tool_call>{"name":"ok","arguments":{}}</tool_call><tool_call>{"name": broken</tool_call>',
    ]) {
      const parsed = parseHermesGeneration(text);
      expect(parsed).toEqual({ content: text, toolCalls: [] });
      expect(malformedReason({ text: parsed.content, tool_calls: parsed.toolCalls.map((c) => ({ name: c.name, status: 'ok' })) }, false)).toBe(
        'a tool call that is not valid JSON',
      );
    }
  });
});
