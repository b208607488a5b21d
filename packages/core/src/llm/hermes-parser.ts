import type { ChatToolCallResult } from './types.ts';

/** What a generated text says, read as vLLM's `hermes` tool parser and Qwen3 reasoning parser read it. */
export interface ParsedGeneration {
  /** The text before the first tool call (null when empty and there are tool calls); the whole text when no call parsed. */
  content: string | null;
  /** The text before `</think>` (without `<think>`), when there is a `</think>`. */
  reasoning?: string;
  toolCalls: ChatToolCallResult[];
}

const TOOL_CALL = /<tool_call>(.*?)<\/tool_call>|<tool_call>(?![\s\S]*<\/tool_call>)([\s\S]*)$/gs;

/**
 * Parses a generation in the Hermes format that Qwen and Hermes chat templates teach:
 * `<think>…</think>` reasoning, then content, then `<tool_call>{"name": …, "arguments": …}</tool_call>`
 * blocks. As vLLM's hermes parser does, one block that is not a JSON object with a string `name`
 * makes the whole text content with no tool calls (the turn is then malformed, see
 * `malformedReason`); it never throws.
 *
 * @param idPrefix tool call ids are `${idPrefix}_${i}`.
 */
export function parseHermesGeneration(text: string, idPrefix = 'call'): ParsedGeneration {
  let rest = text;
  let reasoning: string | undefined;
  const thinkEnd = text.indexOf('</think>');
  if (thinkEnd >= 0) {
    reasoning = text.slice(0, thinkEnd).replace(/^\s*<think>/, '');
    rest = text.slice(thinkEnd + '</think>'.length);
  }
  const withReasoning = (parsed: Omit<ParsedGeneration, 'reasoning'>): ParsedGeneration => (reasoning === undefined ? parsed : { ...parsed, reasoning });
  const start = rest.indexOf('<tool_call>');
  if (start < 0) return withReasoning({ content: rest, toolCalls: [] });
  const toolCalls: ChatToolCallResult[] = [];
  for (const match of rest.matchAll(TOOL_CALL)) {
    const body = (match[1] ?? match[2] ?? '').trim();
    let call: unknown;
    try {
      call = JSON.parse(body);
    } catch {
      return withReasoning({ content: rest, toolCalls: [] });
    }
    const { name, arguments: args } = (call ?? {}) as { name?: unknown; arguments?: unknown };
    if (typeof call !== 'object' || call === null || Array.isArray(call) || typeof name !== 'string') {
      return withReasoning({ content: rest, toolCalls: [] });
    }
    toolCalls.push({ id: `${idPrefix}_${toolCalls.length}`, name, arguments: typeof args === 'string' ? args : JSON.stringify(args ?? {}) });
  }
  const before = rest.slice(0, start);
  return withReasoning({ content: before === '' ? null : before, toolCalls });
}
