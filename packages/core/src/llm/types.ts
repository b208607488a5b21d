import type { Dispatcher } from 'undici';

/** An OpenAI-compatible inference server (a vLLM replica) the agent loop can call. */
export interface LlmBackendConfig {
  id: string;
  /** The OpenAI base URL, e.g. `http://node1:8000/v1`. */
  baseUrl: string;
  /** The served model name sent as `model` when the request names none. */
  model?: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Concurrent requests (connections) to this backend; more wait in line. @default unlimited */
  maxConcurrency?: number;
}

/** A chat message as sent to the server (OpenAI chat completions; vLLM's extra fields allowed). */
export type LlmChatMessage = {
  role: string;
  content?: unknown;
  [key: string]: unknown;
};

export interface LlmTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown> };
}

/**
 * Sampling parameters, passed through at the top level of the body as openai-python's
 * `extra_body` does (vLLM names; unknown keys are passed through too).
 */
export type LlmSamplingParams = {
  temperature?: number | undefined;
  top_p?: number | undefined;
  top_k?: number | undefined;
  min_p?: number | undefined;
  max_tokens?: number | undefined;
  max_completion_tokens?: number | undefined;
  stop?: string | string[] | undefined;
  seed?: number | undefined;
  repetition_penalty?: number | undefined;
  presence_penalty?: number | undefined;
  frequency_penalty?: number | undefined;
  n?: number | undefined;
  [key: string]: unknown;
};

export interface ChatRequest {
  messages: readonly LlmChatMessage[];
  /** @default the backend's model; omitted when neither names one */
  model?: string;
  tools?: readonly LlmTool[];
  tool_choice?: unknown;
  sampling?: LlmSamplingParams;
}

export interface ChatCompletionOptions {
  /** The caller's cancellation (a cancelled rollout, its time limit). */
  signal?: AbortSignal | undefined;
  /** Time limit of this one request. @default none */
  timeoutMs?: number | undefined;
  /** Extra request headers (for example `x-rollout-id`). */
  headers?: Record<string, string> | undefined;
  /** The keep-alive connection pool to use. @default a shared Agent without undici's 300 s limits */
  dispatcher?: Dispatcher | undefined;
}

export interface ChatToolCallResult {
  id: string;
  name: string;
  /** The arguments exactly as the model wrote them (may be malformed JSON). */
  arguments: string;
}

export interface ChatChoice {
  index: number;
  message: {
    role: 'assistant';
    content: string | null;
    reasoning?: string;
    toolCalls: ChatToolCallResult[];
  };
  /** 'stop', 'length', 'tool_calls', … as the server said; null if it said nothing. */
  finishReason: string | null;
  /** From `choice.token_ids` (vLLM >= 0.10.2) or from `token_id:N` logprob tokens. */
  generationTokenIds: number[] | null;
  /** `choice.logprobs.content[].logprob`, one per generated token. */
  generationLogprobs: number[] | null;
}

/** One chat completion: the first choice flattened, every choice in `choices` (n > 1). */
export interface ChatResult extends Omit<ChatChoice, 'index'> {
  choices: ChatChoice[];
  promptTokenIds: number[] | null;
  usage: { promptTokens: number; completionTokens: number; totalTokens: number };
  model: string | null;
  backendId: string;
  latencyMs: number;
  /** The response body as parsed. */
  raw: unknown;
}

/** `POST /tokenize` (vLLM) of a conversation, rendered with the backend's chat template. */
export interface TokenizeChatRequest {
  messages: readonly LlmChatMessage[];
  /** @default the backend's model */
  model?: string;
  tools?: readonly LlmTool[];
  /** End with the template's generation prompt (`<|im_start|>assistant\n`). */
  addGenerationPrompt: boolean;
}

/** `POST /v1/completions` with a token-id prompt (vLLM): generation from exactly these ids. */
export interface TokenCompletionRequest {
  promptTokenIds: readonly number[];
  /** @default the backend's model */
  model?: string;
  sampling?: LlmSamplingParams;
}

export interface TokenCompletionResult {
  /** The generated text (special tokens skipped, as vLLM detokenises it). */
  text: string;
  /** 'stop' or 'length' as the server said; null if it said nothing. */
  finishReason: string | null;
  /** From `choice.token_ids` (vLLM >= 0.10.2) or from `token_id:N` logprob tokens. */
  generationTokenIds: number[] | null;
  generationLogprobs: number[] | null;
  usage: { promptTokens: number; completionTokens: number; totalTokens: number };
  model: string | null;
  backendId: string;
  latencyMs: number;
  raw: unknown;
}

/**
 * Runs one request on the rollout's backend (the pool's `send`, bound to a rollout and its
 * signal): the token-in conversation makes several calls per turn, all to the same backend.
 */
export type BackendCall = <R extends { latencyMs: number }>(
  call: (backend: LlmBackendConfig, options: ChatCompletionOptions) => Promise<R>,
) => Promise<R>;
