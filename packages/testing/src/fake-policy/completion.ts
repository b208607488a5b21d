import { renderCompletion, renderPrompt, toyLogprob, toyTokenizer } from './tokenizer.ts';
import type { ChatCompletionBody, FakeReply, FakeReplyObject } from './types.ts';

type PieceKind = 'marker' | 'reasoning' | 'content' | 'tool';

interface Token {
  piece: string;
  id: number;
  logprob: number;
  kind: PieceKind;
  /** Index of the tool call a 'tool' or tool marker piece belongs to. */
  tool: number;
}

interface NormalizedToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** One generated choice, before it is shaped as JSON or SSE. */
export interface GeneratedChoice {
  index: number;
  content: string | null;
  reasoning: string | null;
  toolCalls: NormalizedToolCall[];
  finishReason: string;
  tokens: Token[];
  truncated: boolean;
}

/** What the request asked for, as vLLM reads it. */
export interface RequestOptions {
  n: number;
  maxTokens: number | undefined;
  logprobs: boolean;
  topLogprobs: number;
  tokensAsIds: boolean;
  returnTokenIds: boolean;
  stream: boolean;
  includeUsage: boolean;
}

function integer(value: unknown): number | undefined {
  return typeof value === 'number' && Number.isInteger(value) ? value : undefined;
}

export function readRequestOptions(body: Record<string, unknown>, supportsReturnTokenIds: boolean): RequestOptions {
  const streamOptions = (body.stream_options ?? {}) as { include_usage?: unknown };
  // The completions API's `logprobs` is a count of alternatives; the chat API's a flag with `top_logprobs`.
  const completionLogprobs = integer(body.logprobs);
  return {
    n: integer(body.n) ?? 1,
    maxTokens: integer(body.max_completion_tokens) ?? integer(body.max_tokens),
    logprobs: body.logprobs === true || completionLogprobs !== undefined,
    topLogprobs: completionLogprobs ?? integer(body.top_logprobs) ?? 0,
    tokensAsIds: body.return_tokens_as_token_ids === true,
    returnTokenIds: supportsReturnTokenIds && body.return_token_ids === true,
    stream: body.stream === true,
    includeUsage: streamOptions.include_usage === true,
  };
}

export function normalizeReply(reply: FakeReply): FakeReplyObject {
  return typeof reply === 'string' ? { content: reply } : reply;
}

function tokensOf(text: string, logprobs: readonly number[] | undefined): Token[] {
  let kind: 'reasoning' | 'content' | 'tool' = 'content';
  let tool = -1;
  return toyTokenizer.pieces(text).map((piece, i) => {
    const id = toyTokenizer.tokenId(piece);
    let pieceKind: PieceKind = kind;
    if (piece === '<think>') [pieceKind, kind] = ['marker', 'reasoning'];
    else if (piece === '</think>') [pieceKind, kind] = ['marker', 'content'];
    else if (piece === '<tool_call>') [pieceKind, kind, tool] = ['marker', 'tool', tool + 1];
    else if (piece === '</tool_call>') [pieceKind, kind] = ['marker', 'content'];
    return { piece, id, logprob: logprobs?.[i] ?? toyLogprob(id), kind: pieceKind, tool };
  });
}

export function generateChoice(reply: FakeReplyObject, index: number, callIndex: number, maxTokens: number | undefined, drifting = false): GeneratedChoice {
  const toolCalls = (reply.toolCalls ?? []).map((call, i) => ({
    id: call.id ?? `chatcmpl-tool-${callIndex}-${index}-${i}`,
    name: call.name,
    arguments: typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments),
  }));
  const all = tokensOf(renderCompletion({ content: reply.content ?? null, reasoning: reply.reasoning ?? null, toolCalls }, { drifting }), reply.logprobs);
  const truncated = maxTokens !== undefined && all.length > maxTokens;
  if (!truncated) {
    return {
      index,
      content: reply.content === undefined ? (toolCalls.length > 0 ? null : '') : reply.content,
      reasoning: reply.reasoning ?? null,
      toolCalls,
      finishReason: reply.finishReason ?? (toolCalls.length > 0 ? 'tool_calls' : 'stop'),
      tokens: all,
      truncated,
    };
  }
  // Cut by max_tokens: an unfinished tool call stays text in the content, as a tool parser leaves it.
  const tokens = all.slice(0, maxTokens);
  const hasReasoning = tokens[0]?.piece === '<think>';
  const insideThink = hasReasoning && !tokens.some((t) => t.piece === '</think>');
  const reasoning = hasReasoning ? tokens.filter((t) => t.kind === 'reasoning').map((t) => t.piece).join('') : null;
  const afterThink = hasReasoning ? tokens.slice(tokens.findIndex((t) => t.piece === '</think>') + 1) : tokens;
  return {
    index,
    content: insideThink ? null : afterThink.map((t) => t.piece).join(''),
    reasoning,
    toolCalls: [],
    finishReason: reply.finishReason ?? 'length',
    tokens,
    truncated,
  };
}

/** The choices for a request: `reply.choices` one per choice, or the reply repeated `n` times. */
export function generateChoices(reply: FakeReplyObject, n: number, callIndex: number, maxTokens: number | undefined, drifting = false): GeneratedChoice[] {
  return Array.from({ length: n }, (_, i) => generateChoice(reply.choices?.[i] ?? reply, i, callIndex, maxTokens, drifting));
}

export function promptTokenIds(body: ChatCompletionBody): number[] {
  return toyTokenizer.encode(renderPrompt(body.messages, Array.isArray(body.tools) ? body.tools : undefined));
}

function logprobEntry(token: Token, options: RequestOptions) {
  const text = options.tokensAsIds ? `token_id:${token.id}` : token.piece;
  const alternatives = Array.from({ length: Math.max(0, options.topLogprobs - 1) }, (_, k) => {
    const alt = `alt${k + 1}`;
    return { token: alt, logprob: token.logprob - (k + 1), bytes: toyTokenizer.bytes(alt) };
  });
  return {
    token: text,
    logprob: token.logprob,
    bytes: toyTokenizer.bytes(text),
    top_logprobs: options.topLogprobs > 0 ? [{ token: text, logprob: token.logprob, bytes: toyTokenizer.bytes(text) }, ...alternatives] : [],
  };
}

function usage(promptIds: readonly number[], choices: readonly GeneratedChoice[]) {
  const completion = choices.reduce((sum, choice) => sum + choice.tokens.length, 0);
  return {
    prompt_tokens: promptIds.length,
    total_tokens: promptIds.length + completion,
    completion_tokens: completion,
    prompt_tokens_details: null,
  };
}

function toolCallJson(call: NormalizedToolCall) {
  return { id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } };
}

export interface CompletionMeta {
  id: string;
  created: number;
  model: string;
}

/** The `chat.completion` body, shaped as vLLM returns it. */
export function completionJson(meta: CompletionMeta, promptIds: readonly number[], choices: readonly GeneratedChoice[], options: RequestOptions) {
  return {
    id: meta.id,
    object: 'chat.completion',
    created: meta.created,
    model: meta.model,
    choices: choices.map((choice) => ({
      index: choice.index,
      message: {
        role: 'assistant',
        content: choice.content,
        refusal: null,
        annotations: null,
        audio: null,
        function_call: null,
        tool_calls: choice.toolCalls.map(toolCallJson),
        reasoning_content: choice.reasoning,
      },
      logprobs: options.logprobs ? { content: choice.tokens.map((t) => logprobEntry(t, options)) } : null,
      finish_reason: choice.finishReason,
      stop_reason: null,
      ...(options.returnTokenIds ? { token_ids: choice.tokens.map((t) => t.id) } : {}),
    })),
    service_tier: null,
    system_fingerprint: null,
    usage: usage(promptIds, choices),
    prompt_logprobs: null,
    ...(options.returnTokenIds ? { prompt_token_ids: [...promptIds] } : {}),
    kv_transfer_params: null,
  };
}

/**
 * The `chat.completion.chunk` events of a streamed completion, as vLLM sends them: a role chunk,
 * one chunk per reasoning or content token, one chunk per tool call, a finish chunk per choice, a
 * usage chunk when `stream_options.include_usage`, then `[DONE]`. Marker tokens (`<think>`,
 * `<tool_call>`) carry no text and ride along with the next chunk's token ids and logprobs.
 */
export function completionChunks(meta: CompletionMeta, promptIds: readonly number[], choices: readonly GeneratedChoice[], options: RequestOptions): string[] {
  const events: string[] = [];
  const head = { id: meta.id, object: 'chat.completion.chunk', created: meta.created, model: meta.model };
  const push = (choice: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
    events.push(`data: ${JSON.stringify({ ...head, choices: [choice], ...extra })}\n\n`);
  const withTokens = (index: number, delta: Record<string, unknown>, tokens: Token[], finishReason: string | null) => ({
    index,
    delta,
    logprobs: options.logprobs && tokens.length > 0 ? { content: tokens.map((t) => logprobEntry(t, options)) } : null,
    finish_reason: finishReason,
    ...(options.returnTokenIds ? { token_ids: tokens.map((t) => t.id) } : {}),
  });
  choices.forEach((choice, c) => {
    push(
      { index: choice.index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null },
      c === 0 && options.returnTokenIds ? { prompt_token_ids: [...promptIds] } : {},
    );
    let pending: Token[] = [];
    let tool: { index: number; tokens: Token[] } | null = null;
    for (const token of choice.tokens) {
      const asToolCall = !choice.truncated && (token.kind === 'tool' || (token.kind === 'marker' && token.piece.includes('tool_call')));
      if (asToolCall) {
        if (!tool) tool = { index: token.tool, tokens: [...pending] };
        tool.tokens.push(token);
        pending = [];
        if (token.piece === '</tool_call>') {
          const call = choice.toolCalls[tool.index]!;
          push(withTokens(choice.index, { tool_calls: [{ index: tool.index, ...toolCallJson(call) }] }, tool.tokens, null));
          tool = null;
        }
      } else if (token.kind === 'marker') {
        pending.push(token);
      } else {
        const field = token.kind === 'reasoning' ? 'reasoning_content' : 'content';
        push(withTokens(choice.index, { [field]: token.piece }, [...pending, token], null));
        pending = [];
      }
    }
    push(withTokens(choice.index, {}, [...pending, ...(tool?.tokens ?? [])], choice.finishReason));
  });
  if (options.includeUsage) events.push(`data: ${JSON.stringify({ ...head, choices: [], usage: usage(promptIds, choices) })}\n\n`);
  events.push('data: [DONE]\n\n');
  return events;
}

/**
 * The `text_completion` body of `POST /v1/completions`, shaped as vLLM returns it: the generated
 * text (tool calls unparsed, `<|role|>`/`<|end|>` tokens skipped), `token_ids` and `prompt_token_ids` on the choice with
 * `return_token_ids`, and the completions API's logprobs (`tokens`, `token_logprobs`, …).
 */
export function textCompletionJson(meta: CompletionMeta, promptIds: readonly number[], choices: readonly GeneratedChoice[], options: RequestOptions) {
  return {
    id: meta.id,
    object: 'text_completion',
    created: meta.created,
    model: meta.model,
    choices: choices.map((choice) => {
      // vLLM detokenises with skip_special_tokens: role and end tokens (`<|end|>`) leave no text.
      const textOf = (t: Token) => (/^<\|[a-z_]+\|>$/.test(t.piece) ? '' : t.piece);
      let offset = 0;
      const textOffset = choice.tokens.map((t) => {
        const at = offset;
        offset += textOf(t).length;
        return at;
      });
      return {
        index: choice.index,
        text: choice.tokens.map(textOf).join(''),
        logprobs: options.logprobs
          ? {
              text_offset: textOffset,
              token_logprobs: choice.tokens.map((t) => t.logprob),
              tokens: choice.tokens.map((t) => (options.tokensAsIds ? `token_id:${t.id}` : t.piece)),
              top_logprobs: choice.tokens.map((t) => ({ [options.tokensAsIds ? `token_id:${t.id}` : t.piece]: t.logprob })),
            }
          : null,
        // Completions carry no tool parser: a finished reply stops, whatever it wrote.
        finish_reason: choice.truncated ? 'length' : choice.finishReason === 'length' ? 'length' : 'stop',
        stop_reason: null,
        prompt_logprobs: null,
        ...(options.returnTokenIds ? { token_ids: choice.tokens.map((t) => t.id), prompt_token_ids: [...promptIds] } : {}),
      };
    }),
    service_tier: null,
    system_fingerprint: null,
    usage: usage(promptIds, choices),
    kv_transfer_params: null,
  };
}
