/**
 * The fake policy's toy tokenizer and chat template. Deterministic and dependency-free, so a test
 * can compute the token ids it expects without asking the server.
 *
 * A text splits into pieces: special tokens (`<|role|>`, `<|end|>`, `<think>`, `</think>`,
 * `<tool_call>`, `</tool_call>`), runs of whitespace, runs of letters/digits/underscore, and single
 * other characters. Joining the pieces gives the text back. A piece's id is the FNV-1a hash of its
 * UTF-8 bytes modulo {@link TOY_VOCAB_SIZE}.
 */

export const TOY_VOCAB_SIZE = 151_936;

const PIECE = /<\|[a-z_]+\|>|<\/?think>|<\/?tool_call>|\s+|[\p{L}\p{N}_]+|[^\s\p{L}\p{N}_]/gu;
const SPECIAL = /^(?:<\|[a-z_]+\|>|<\/?think>|<\/?tool_call>)$/;

const encoder = new TextEncoder();

// Pieces repeat a lot (every turn re-sends the conversation): memoise ids, bounded.
const ids = new Map<string, number>();
const MAX_MEMO = 200_000;

function fnv1a(text: string): number {
  let hash = 0x811c9dc5;
  for (const byte of encoder.encode(text)) {
    hash ^= byte;
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash;
}

export const toyTokenizer = {
  /** The pieces of a text; `pieces(text).join('') === text`. */
  pieces(text: string): string[] {
    return text.match(PIECE) ?? [];
  },
  isSpecial(piece: string): boolean {
    return SPECIAL.test(piece);
  },
  tokenId(piece: string): number {
    let id = ids.get(piece);
    if (id === undefined) {
      if (ids.size >= MAX_MEMO) ids.clear();
      id = fnv1a(piece) % TOY_VOCAB_SIZE;
      ids.set(piece, id);
    }
    return id;
  },
  encode(text: string): number[] {
    return toyTokenizer.pieces(text).map(toyTokenizer.tokenId);
  },
  /** UTF-8 bytes of a piece, as vLLM reports them in `logprobs.content[].bytes`. */
  bytes(piece: string): number[] {
    return Array.from(encoder.encode(piece));
  },
};

/** The logprob the fake policy reports for a sampled token unless the script gives one. */
export function toyLogprob(tokenId: number): number {
  return -((tokenId % 997) + 1) / 1000;
}

/** How an assistant tool call appears in the prompt and in the generated text (Hermes style). */
export function renderToolCall(name: string, args: string): string {
  return `<tool_call>{"name":${JSON.stringify(name)},"arguments":${args}}</tool_call>`;
}

function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((part: { text?: unknown }) => (typeof part?.text === 'string' ? part.text : '')).join('');
}

/**
 * How a drifting model writes a tool call: Python's `json.dumps` spacing (`{"name": "f", "arguments":
 * {"x": 1}}`), as Hermes-trained models do, while the template re-renders it compactly. A chat
 * client that re-renders earlier turns then sees other tokens than the model generated.
 */
export function renderSpacedToolCall(name: string, args: string): string {
  let value: unknown;
  try {
    value = JSON.parse(args);
  } catch {
    return `<tool_call>{"name": ${JSON.stringify(name)}, "arguments": ${args}}</tool_call>`;
  }
  return `<tool_call>${spacedJson({ name, arguments: value })}</tool_call>`;
}

function spacedJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(spacedJson).join(', ')}]`;
  if (typeof value === 'object' && value !== null) {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${spacedJson(v)}`).join(', ')}}`;
  }
  return JSON.stringify(value);
}

/**
 * The toy chat template: `<|tools|>` + the tools as JSON + `<|end|>` when tools are offered, then per
 * message `<|role|>` + its text + its tool calls + `<|end|>`, then the generation prompt
 * `<|assistant|>` (unless `addGenerationPrompt` is false). Earlier turns' reasoning is dropped, as
 * Qwen3's template does, so a turn's prompt starts with the previous prompt plus the previous
 * generation whenever that turn had no reasoning (and the policy does not drift).
 */
export function renderPrompt(messages: readonly unknown[], tools?: readonly unknown[], { addGenerationPrompt = true }: { addGenerationPrompt?: boolean } = {}): string {
  let text = tools && tools.length > 0 ? `<|tools|>${JSON.stringify(tools)}<|end|>` : '';
  for (const raw of messages) {
    const message = (raw ?? {}) as { role?: unknown; content?: unknown; tool_calls?: unknown };
    text += `<|${String(message.role)}|>${contentText(message.content)}`;
    if (Array.isArray(message.tool_calls)) {
      for (const call of message.tool_calls as Array<{ function?: { name?: unknown; arguments?: unknown } }>) {
        const args = call.function?.arguments;
        text += renderToolCall(String(call.function?.name ?? ''), typeof args === 'string' ? args : JSON.stringify(args ?? {}));
      }
    }
    text += '<|end|>';
  }
  return addGenerationPrompt ? `${text}<|assistant|>` : text;
}

/**
 * What the model "generated" for a reply: reasoning in `<think>`, the content, then tool calls
 * (written with spaces by a `drifting` policy, see `renderSpacedToolCall`).
 */
export function renderCompletion(
  reply: {
    content?: string | null;
    reasoning?: string | null;
    toolCalls?: ReadonlyArray<{ name: string; arguments: string }>;
  },
  { drifting = false }: { drifting?: boolean } = {},
): string {
  let text = reply.reasoning != null ? `<think>${reply.reasoning}</think>` : '';
  text += reply.content ?? '';
  for (const call of reply.toolCalls ?? []) text += (drifting ? renderSpacedToolCall : renderToolCall)(call.name, call.arguments);
  return text;
}

const ROLE_OR_END = /<\|([a-z_]+)\|>/g;

/**
 * The toy template read back: the messages and tools a rendered prompt came from (tool calls and
 * `<think>` reasoning of assistant turns parsed, in either spacing). A trailing generation prompt
 * is dropped. The fake policy uses it to give token-id prompts to its script as messages.
 */
export function parsePrompt(text: string): { messages: Array<Record<string, unknown>>; tools?: unknown[] } {
  const messages: Array<Record<string, unknown>> = [];
  let tools: unknown[] | undefined;
  let open: { role: string; start: number } | null = null;
  for (const match of text.matchAll(ROLE_OR_END)) {
    const tag = match[1]!;
    if (tag !== 'end') {
      open = { role: tag, start: match.index + match[0].length };
      continue;
    }
    if (open === null) continue;
    const body = text.slice(open.start, match.index);
    if (open.role === 'tools') {
      try {
        tools = JSON.parse(body) as unknown[];
      } catch {
        tools = undefined;
      }
    } else {
      messages.push(open.role === 'assistant' ? assistantMessage(body) : { role: open.role, content: body });
    }
    open = null;
  }
  return tools === undefined ? { messages } : { messages, tools };
}

function assistantMessage(body: string): Record<string, unknown> {
  let rest = body;
  const thinkEnd = body.indexOf('</think>');
  const message: Record<string, unknown> = { role: 'assistant' };
  if (thinkEnd >= 0) {
    message.reasoning_content = body.slice(0, thinkEnd).replace(/^<think>/, '');
    rest = body.slice(thinkEnd + '</think>'.length);
  }
  const start = rest.indexOf('<tool_call>');
  const calls: Array<Record<string, unknown>> = [];
  for (const [, json] of rest.matchAll(/<tool_call>(.*?)<\/tool_call>/gs)) {
    try {
      const call = JSON.parse(json!) as { name?: unknown; arguments?: unknown };
      const args = typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments ?? {});
      calls.push({ id: `call_${calls.length}`, type: 'function', function: { name: String(call.name), arguments: args } });
    } catch {
      // A malformed call stays text.
    }
  }
  message.content = start >= 0 && calls.length > 0 ? rest.slice(0, start) || null : rest;
  if (calls.length > 0) message.tool_calls = calls;
  return message;
}
