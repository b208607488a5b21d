import { randomUUID } from 'node:crypto';
import type { ChatMessage, ChatTool, ChatToolCall } from '../protocol/chat.ts';
import type { TurnRecord } from '../protocol/rollout.ts';

export type { ChatMessage, ChatTool, ChatToolCall } from '../protocol/chat.ts';

function partsText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((part: { type?: string; text?: string; refusal?: string }) => part?.text ?? part?.refusal ?? '')
    .join('');
}

/**
 * The chat messages for a Responses API `input` (and `instructions`), as NeMo Gym's model servers
 * convert them: easy and output messages keep their role; function calls become assistant
 * tool_calls; their outputs become tool messages.
 */
export function inputToMessages(params: { input: unknown; instructions?: unknown }): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (typeof params.instructions === 'string' && params.instructions) {
    messages.push({ role: 'system', content: params.instructions });
  }
  if (typeof params.input === 'string') {
    messages.push({ role: 'user', content: params.input });
    return messages;
  }
  for (const item of (params.input ?? []) as Array<Record<string, unknown>>) {
    const type = item.type ?? 'message';
    if (type === 'message') {
      const role = String(item.role ?? 'user');
      if (role === 'assistant') messages.push({ role: 'assistant', content: partsText(item.content) });
      else messages.push({ role: role === 'system' || role === 'developer' ? role : 'user', content: partsText(item.content) });
    } else if (type === 'function_call') {
      const call: ChatToolCall = {
        id: String(item.call_id),
        type: 'function',
        function: { name: String(item.name), arguments: String(item.arguments ?? '{}') },
      };
      const last = messages.at(-1);
      if (last?.role === 'assistant') (last.tool_calls ??= []).push(call);
      else messages.push({ role: 'assistant', content: null, tool_calls: [call] });
    } else if (type === 'function_call_output') {
      messages.push({ role: 'tool', tool_call_id: String(item.call_id), content: partsText(item.output) });
    }
  }
  return messages;
}

/** Function tools declared in Responses form (`{type, name, parameters}`) in chat form. */
export function responsesToolsToChat(tools: readonly unknown[]): ChatTool[] {
  return tools.flatMap((tool) => {
    const t = tool as { type?: string; name?: string; description?: string; parameters?: Record<string, unknown> };
    if (t.type !== 'function' || !t.name) return [];
    return [{ type: 'function' as const, function: { name: t.name, ...(t.description ? { description: t.description } : {}), ...(t.parameters ? { parameters: t.parameters } : {}) } }];
  });
}

const shortId = () => randomUUID().replaceAll('-', '');

/**
 * The NeMo Gym `response` for a finished agent loop: per model call its reasoning, message and
 * function_call items, with `prompt_token_ids`, `generation_token_ids` and `generation_log_probs`
 * on the call's last output item (CONTRACT.md §3.4), then the function_call_output items; usage
 * summed over turns as simple_agent sums it.
 */
export function buildResponse(options: {
  id: string;
  model: string;
  turns: readonly TurnRecord[];
  tools: readonly unknown[];
  usage: { input: number; output: number };
}): Record<string, unknown> {
  const output: Array<Record<string, unknown>> = [];
  for (const turn of options.turns) {
    const items: Array<Record<string, unknown>> = [];
    if (turn.reasoning) {
      items.push({ id: `rs_${shortId()}`, type: 'reasoning', summary: [{ type: 'summary_text', text: turn.reasoning }] });
    }
    if (turn.text !== null && (turn.text !== '' || turn.tool_calls.length === 0)) {
      items.push({
        id: `msg_${shortId()}`,
        type: 'message',
        role: 'assistant',
        status: turn.finish_reason === 'length' ? 'incomplete' : 'completed',
        content: [{ type: 'output_text', text: turn.text, annotations: [] }],
      });
    }
    for (const call of turn.tool_calls) {
      items.push({ id: `fc_${shortId()}`, type: 'function_call', call_id: call.id, name: call.name, arguments: call.arguments, status: 'completed' });
    }
    const last = items.at(-1);
    if (last && turn.generation_token_ids) {
      last.prompt_token_ids = turn.prompt_token_ids ?? [];
      last.generation_token_ids = turn.generation_token_ids;
      last.generation_log_probs = turn.generation_logprobs ?? [];
    }
    output.push(...items);
    for (const call of turn.tool_calls) {
      output.push({ type: 'function_call_output', call_id: call.id, output: call.output });
    }
  }
  const lastTurn = options.turns.at(-1);
  return {
    id: `resp_${options.id}`,
    created_at: Date.now() / 1000,
    model: options.model,
    object: 'response',
    output,
    parallel_tool_calls: true,
    tool_choice: 'auto',
    tools: options.tools,
    status: lastTurn?.finish_reason === 'length' ? 'incomplete' : 'completed',
    incomplete_details: lastTurn?.finish_reason === 'length' ? { reason: 'max_output_tokens' } : null,
    usage: {
      input_tokens: options.usage.input,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: options.usage.output,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: options.usage.input + options.usage.output,
    },
  };
}
