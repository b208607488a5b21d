import { z } from 'zod';
import { backendUrl, idsOfLogprobTokens, postToBackend, protocolError } from './backend-request.ts';
import type { ChatChoice, ChatCompletionOptions, ChatRequest, ChatResult, LlmBackendConfig } from './types.ts';
import { integerArray, logprobEntries } from '../protocol/number-arrays.ts';

export { callerAbortError, createLlmAgent } from './backend-request.ts';

const ToolCall = z.looseObject({
  id: z.string().nullish(),
  function: z.looseObject({
    name: z.string(),
    arguments: z.union([z.string(), z.record(z.string(), z.unknown())]).nullish(),
  }),
});

const Choice = z.looseObject({
  index: z.number().int().nullish(),
  message: z.looseObject({
    content: z.string().nullish(),
    reasoning_content: z.string().nullish(),
    reasoning: z.string().nullish(),
    tool_calls: z.array(ToolCall).nullish(),
  }),
  finish_reason: z.string().nullish(),
  token_ids: integerArray.nullable().optional(),
  logprobs: z.looseObject({ content: logprobEntries.nullable().optional() }).nullish(),
});

const Completion = z.looseObject({
  model: z.string().nullish(),
  choices: z.array(Choice).min(1),
  usage: z
    .looseObject({ prompt_tokens: z.number().nullish(), completion_tokens: z.number().nullish(), total_tokens: z.number().nullish() })
    .nullish(),
  prompt_token_ids: integerArray.nullable().optional(),
});

export function chatRequestBody(backend: LlmBackendConfig, chat: ChatRequest): Record<string, unknown> {
  const model = chat.model ?? backend.model;
  return {
    ...chat.sampling,
    ...(model === undefined ? {} : { model }),
    messages: chat.messages,
    ...(chat.tools && chat.tools.length > 0 ? { tools: chat.tools } : {}),
    ...(chat.tool_choice === undefined ? {} : { tool_choice: chat.tool_choice }),
    logprobs: true,
    top_logprobs: chat.sampling?.top_logprobs ?? 0,
    // vLLM >= 0.10.2 returns prompt and generation ids; older ones give ids as `token_id:N` logprob tokens.
    return_token_ids: true,
    return_tokens_as_token_ids: true,
    stream: false,
  };
}

function parseChoice(choice: z.infer<typeof Choice>, position: number): ChatChoice {
  const message = choice.message;
  const toolCalls = (message.tool_calls ?? []).map((call, i) => ({
    id: call.id ?? `call_${position}_${i}`,
    name: call.function.name,
    arguments:
      typeof call.function.arguments === 'string' ? call.function.arguments : JSON.stringify(call.function.arguments ?? {}),
  }));
  const reasoning = message.reasoning_content ?? message.reasoning ?? undefined;
  const logprobContent = choice.logprobs?.content ?? null;
  let generationTokenIds = choice.token_ids ?? null;
  if (generationTokenIds === null && logprobContent !== null) generationTokenIds = idsOfLogprobTokens(logprobContent.map((entry) => entry.token));
  return {
    index: choice.index ?? position,
    message: {
      role: 'assistant',
      content: message.content ?? null,
      ...(reasoning === undefined ? {} : { reasoning }),
      toolCalls,
    },
    finishReason: choice.finish_reason ?? null,
    generationTokenIds,
    generationLogprobs: logprobContent?.map((entry) => entry.logprob) ?? null,
  };
}

/**
 * One chat completion against an OpenAI-compatible (vLLM) backend, asking for prompt and
 * generation token ids and logprobs. Fails with an LlmBackendError (code 'LLM_BACKEND') whose
 * `kind` says what went wrong, or with the caller's abort as a CANCELLED/TIMEOUT RolloutError.
 */
export async function chatCompletion(
  backend: LlmBackendConfig,
  chat: ChatRequest,
  options: ChatCompletionOptions = {},
): Promise<ChatResult> {
  const answer = await postToBackend(backend, backendUrl(backend.baseUrl, 'chat/completions'), chatRequestBody(backend, chat), options);
  const parsed = Completion.safeParse(answer.json);
  if (!parsed.success) throw protocolError(backend, 'a chat completion', z.prettifyError(parsed.error), answer);
  const completion = parsed.data;
  const choices = completion.choices.map(parseChoice);
  const first = choices[0]!;
  const promptTokenIds = completion.prompt_token_ids ?? null;
  const promptTokens = completion.usage?.prompt_tokens ?? promptTokenIds?.length ?? 0;
  const completionTokens = completion.usage?.completion_tokens ?? choices.reduce((sum, c) => sum + (c.generationTokenIds?.length ?? 0), 0);
  return {
    message: first.message,
    finishReason: first.finishReason,
    generationTokenIds: first.generationTokenIds,
    generationLogprobs: first.generationLogprobs,
    choices,
    promptTokenIds,
    usage: { promptTokens, completionTokens, totalTokens: completion.usage?.total_tokens ?? promptTokens + completionTokens },
    model: completion.model ?? null,
    backendId: backend.id,
    latencyMs: answer.latencyMs,
    raw: answer.json,
  };
}
