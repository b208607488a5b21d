import { RolloutError } from '../errors.ts';
import { parseHermesGeneration } from './hermes-parser.ts';
import { LlmBackendError } from './llm-error.ts';
import { tokenCompletion, tokenizeChat } from './token-completion.ts';
import type { BackendCall, ChatRequest, ChatResult, LlmChatMessage, LlmTool } from './types.ts';

function startsWith(sequence: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > sequence.length) return false;
  for (let i = 0; i < prefix.length; i++) if (sequence[i] !== prefix[i]) return false;
  return true;
}

/** The longest j such that `generated` ends with `closing[0, j)` (an end-of-turn token the model generated itself). */
function overlap(generated: readonly number[], closing: readonly number[]): number {
  for (let j = Math.min(closing.length, generated.length); j > 0; j--) {
    if (closing.slice(0, j).every((id, k) => generated[generated.length - j + k] === id)) return j;
  }
  return 0;
}

/** How far from its end a rendered conversation may have template tokens after the last reply's text. */
const END_OF_TURN_WINDOW = 16;

/**
 * The template's tokens after the generated ones in `rendered` (the conversation up to and with the
 * last reply): the end of the last reply is where the longest run of the generation's last tokens
 * sits within the last few rendered tokens (ties: the latest). For Qwen `<|im_end|>` ends the
 * generation and `<|im_end|>\n` the rendered turn, so this is `\n`. Null when no token matches
 * (a reply the template renders without what was generated, e.g. reasoning it drops).
 */
function endOfTurn(rendered: readonly number[], generated: readonly number[]): number[] | null {
  let best = { length: 0, at: -1 };
  for (let at = rendered.length - 1; at >= Math.max(0, rendered.length - END_OF_TURN_WINDOW); at--) {
    let length = 0;
    while (length < generated.length && length <= at && rendered[at - length] === generated[generated.length - 1 - length]) length++;
    if (length > best.length) best = { length, at };
  }
  return best.length === 0 ? null : rendered.slice(best.at + 1);
}

interface Previous {
  /** Messages of the previous turn's request. */
  messageCount: number;
  promptTokenIds: number[];
  generationTokenIds: number[];
}

/**
 * One rollout's conversation kept as token ids (token-in, token-out): turn t+1's prompt is turn
 * t's prompt + its generation + the template's end of that turn + the tokens of the messages that
 * followed (tool outputs and the next generation prompt). Earlier turns are never re-tokenised,
 * so each prompt extends the previous prompt and generation by construction, whatever the
 * template makes of the generated text.
 *
 * Per turn: vLLM's `POST /tokenize` of the conversation up to the last assistant message and of
 * the whole one (their difference is the new messages' tokens), then `POST /v1/completions` with
 * the token-id prompt; tool calls are parsed from the generated text (Hermes format). The
 * template's end of the previous turn (`\n` after Qwen's generated `<|im_end|>`) is read off the
 * first of those renderings (see endOfTurn); when the template drops what was generated (reasoning),
 * from the first prompt rendered with an empty reply, less the part the model generated itself.
 */
export class TokenConversation {
  #previous: Previous | null = null;
  #first: { messages: readonly LlmChatMessage[]; promptTokenIds: number[] } | null = null;
  #closing: number[] | null = null;

  /** One turn: its prompt ids, a generation from them, the parsed message. `send` runs each call on the rollout's backend. */
  async turn(send: BackendCall, request: ChatRequest): Promise<ChatResult> {
    const started = performance.now();
    const tools = request.tools && request.tools.length > 0 ? request.tools : undefined;
    const promptTokenIds = await this.#prompt(send, request.messages, request.model, tools);
    const result = await send((backend, options) =>
      tokenCompletion(backend, { promptTokenIds, ...(request.model === undefined ? {} : { model: request.model }), ...(request.sampling ? { sampling: request.sampling } : {}) }, options),
    );
    if (result.generationTokenIds === null) {
      throw new LlmBackendError({
        kind: 'protocol',
        message: `${result.backendId}: the completion has no generated token ids (token-in generation needs vLLM's return_token_ids or return_tokens_as_token_ids)`,
        backendId: result.backendId,
        retryable: false,
      });
    }
    const turnIndex = request.messages.filter((m) => m.role === 'assistant').length;
    const parsed = parseHermesGeneration(result.text, `call_${turnIndex}`);
    const finishReason = parsed.toolCalls.length > 0 && result.finishReason === 'stop' ? 'tool_calls' : result.finishReason;
    this.#first ??= { messages: request.messages.slice(), promptTokenIds };
    this.#previous = { messageCount: request.messages.length, promptTokenIds, generationTokenIds: result.generationTokenIds };
    const message = { role: 'assistant' as const, content: parsed.content, ...(parsed.reasoning === undefined ? {} : { reasoning: parsed.reasoning }), toolCalls: parsed.toolCalls };
    return {
      message,
      finishReason,
      generationTokenIds: result.generationTokenIds,
      generationLogprobs: result.generationLogprobs,
      choices: [{ index: 0, message, finishReason, generationTokenIds: result.generationTokenIds, generationLogprobs: result.generationLogprobs }],
      promptTokenIds,
      usage: result.usage,
      model: result.model,
      backendId: result.backendId,
      latencyMs: performance.now() - started,
      raw: result.raw,
    };
  }

  async #prompt(send: BackendCall, messages: readonly LlmChatMessage[], model: string | undefined, tools: readonly LlmTool[] | undefined): Promise<number[]> {
    const tokenize = (list: readonly LlmChatMessage[], addGenerationPrompt: boolean) =>
      send((backend, options) =>
        tokenizeChat(backend, { messages: list, addGenerationPrompt, ...(model === undefined ? {} : { model }), ...(tools ? { tools } : {}) }, options),
      ).then((r) => r.tokens);
    const previous = this.#previous;
    if (previous === null) return tokenize(messages, true);
    const assistant = messages[previous.messageCount];
    if (messages.length <= previous.messageCount || assistant?.role !== 'assistant') {
      throw new RolloutError({ code: 'INTERNAL', message: 'token-in generation: the conversation must grow by the assistant reply and what followed it' });
    }
    const [rendered, whole] = await Promise.all([tokenize(messages.slice(0, previous.messageCount + 1), false), tokenize(messages, true)]);
    if (!startsWith(whole, rendered)) {
      throw new LlmBackendError({
        kind: 'protocol',
        message: "token-in generation: the chat template renders the conversation differently once messages are appended (its tokens do not extend the earlier ones'), so the new messages' tokens cannot be told apart",
        backendId: null,
        retryable: false,
      });
    }
    const generated = previous.generationTokenIds;
    let end = endOfTurn(rendered, generated);
    if (end === null) {
      // Learn the template's end of an assistant turn once: the first prompt with an empty reply.
      const first = this.#first!;
      this.#closing ??= this.#closingOf(await tokenize([...first.messages, { role: 'assistant', content: '' }], false), first.promptTokenIds);
      end = this.#closing.slice(overlap(generated, this.#closing));
    }
    return [...previous.promptTokenIds, ...generated, ...end, ...whole.slice(rendered.length)];
  }

  #closingOf(withEmptyReply: number[], firstPrompt: readonly number[]): number[] {
    if (!startsWith(withEmptyReply, firstPrompt)) {
      throw new LlmBackendError({
        kind: 'protocol',
        message: 'token-in generation: the chat template renders an assistant reply without its generation prompt, so the end of a turn cannot be found',
        backendId: null,
        retryable: false,
      });
    }
    return withEmptyReply.slice(firstPrompt.length);
  }
}
