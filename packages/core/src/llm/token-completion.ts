import { z } from 'zod';
import { backendUrl, idsOfLogprobTokens, postToBackend, protocolError, serverUrl } from './backend-request.ts';
import type { ChatCompletionOptions, LlmBackendConfig, TokenCompletionRequest, TokenCompletionResult, TokenizeChatRequest } from './types.ts';
import { integerArray, nullableNumberArray } from '../protocol/number-arrays.ts';

const Tokenized = z.looseObject({ tokens: integerArray.schema });

const CompletionChoice = z.looseObject({
  index: z.number().int().nullish(),
  text: z.string(),
  finish_reason: z.string().nullish(),
  token_ids: integerArray.nullable().optional(),
  logprobs: z.looseObject({ tokens: z.array(z.string()).nullish(), token_logprobs: nullableNumberArray.nullable().optional() }).nullish(),
});

const Completion = z.looseObject({
  model: z.string().nullish(),
  choices: z.array(CompletionChoice).min(1),
  usage: z
    .looseObject({ prompt_tokens: z.number().nullish(), completion_tokens: z.number().nullish(), total_tokens: z.number().nullish() })
    .nullish(),
});

/** The token ids of a conversation under the backend's chat template: vLLM's `POST /tokenize`. */
export async function tokenizeChat(
  backend: LlmBackendConfig,
  request: TokenizeChatRequest,
  options: ChatCompletionOptions = {},
): Promise<{ tokens: number[]; latencyMs: number }> {
  const model = request.model ?? backend.model;
  const body = {
    ...(model === undefined ? {} : { model }),
    messages: request.messages,
    ...(request.tools && request.tools.length > 0 ? { tools: request.tools } : {}),
    add_generation_prompt: request.addGenerationPrompt,
  };
  const answer = await postToBackend(backend, serverUrl(backend.baseUrl, 'tokenize'), body, options);
  const parsed = Tokenized.safeParse(answer.json);
  if (!parsed.success) throw protocolError(backend, 'a tokenization', z.prettifyError(parsed.error), answer);
  return { tokens: parsed.data.tokens, latencyMs: answer.latencyMs };
}

export function tokenCompletionBody(backend: LlmBackendConfig, request: TokenCompletionRequest): Record<string, unknown> {
  const model = request.model ?? backend.model;
  const { top_logprobs, ...sampling } = request.sampling ?? {};
  return {
    ...sampling,
    ...(model === undefined ? {} : { model }),
    prompt: request.promptTokenIds,
    // The completions API's logprobs is the number of alternatives; the sampled token's comes with any.
    logprobs: typeof top_logprobs === 'number' && top_logprobs > 0 ? top_logprobs : 1,
    // vLLM >= 0.10.2 returns the generated ids; older ones give them as `token_id:N` logprob tokens.
    return_token_ids: true,
    return_tokens_as_token_ids: true,
    stream: false,
  };
}

/**
 * One generation from a token-id prompt (`POST /v1/completions`, vLLM): nothing is rendered or
 * re-tokenised on the server, so the trainer sees exactly the ids the policy was conditioned on.
 */
export async function tokenCompletion(
  backend: LlmBackendConfig,
  request: TokenCompletionRequest,
  options: ChatCompletionOptions = {},
): Promise<TokenCompletionResult> {
  const answer = await postToBackend(backend, backendUrl(backend.baseUrl, 'completions'), tokenCompletionBody(backend, request), options);
  const parsed = Completion.safeParse(answer.json);
  if (!parsed.success) throw protocolError(backend, 'a completion', z.prettifyError(parsed.error), answer);
  const completion = parsed.data;
  const choice = completion.choices[0]!;
  const logprobs = choice.logprobs ?? null;
  const generationTokenIds = choice.token_ids ?? (logprobs?.tokens ? idsOfLogprobTokens(logprobs.tokens) : null);
  const promptTokens = completion.usage?.prompt_tokens ?? request.promptTokenIds.length;
  const completionTokens = completion.usage?.completion_tokens ?? generationTokenIds?.length ?? 0;
  return {
    text: choice.text,
    finishReason: choice.finish_reason ?? null,
    generationTokenIds,
    generationLogprobs: logprobs?.token_logprobs?.map((logprob) => logprob ?? 0) ?? null,
    usage: { promptTokens, completionTokens, totalTokens: completion.usage?.total_tokens ?? promptTokens + completionTokens },
    model: completion.model ?? null,
    backendId: backend.id,
    latencyMs: answer.latencyMs,
    raw: answer.json,
  };
}
