/** Faults the fake policy can inject, per reply or for every request (global). */
export interface FakeFaults {
  /** Wait this long before answering. */
  latencyMs?: number;
  /** Answer with this HTTP status and an OpenAI error body (`{error: {message, type, code}}`). */
  status?: number;
  /** The error message for `status`. */
  errorMessage?: string;
  /** Destroy the socket after reading the request, without answering. */
  dropConnection?: boolean;
  /** Never answer (until the server is killed or closed). */
  hang?: boolean;
}

export interface FakeToolCall {
  name: string;
  /** A JSON string as the model wrote it (may be malformed on purpose), or an object to serialise. */
  arguments: string | Record<string, unknown>;
  /** @default `chatcmpl-tool-<call>-<choice>-<i>` */
  id?: string;
}

export interface FakeReplyObject extends FakeFaults {
  /** The assistant text; `null` or absent with tool calls gives `content: null`. */
  content?: string | null;
  /** Returned as `reasoning_content` (generated as `<think>…</think>` before the content). */
  reasoning?: string;
  toolCalls?: FakeToolCall[];
  /**
   * @default 'length' when `max_tokens` cut the reply, else 'tool_calls' with tool calls, else 'stop'
   */
  finishReason?: 'stop' | 'length' | 'tool_calls';
  /** Logprob of each generated token; missing entries use `toyLogprob(tokenId)`. */
  logprobs?: number[];
  /** One reply per choice when the request asks for `n > 1` (else the reply is repeated). */
  choices?: FakeReplyObject[];
}

/** A string is shorthand for `{ content: string }`. */
export type FakeReply = string | FakeReplyObject;

export interface FakeScriptContext {
  /** Chat completion requests received before this one, over the server's life. */
  callIndex: number;
  /** Requests of this conversation received before this one. */
  conversationCallIndex: number;
  /** The conversation key: the conversation header, or else the first user message. */
  conversation: string;
  /** Assistant messages already in the request: 0 on a conversation's first call. */
  turn: number;
  headers: Record<string, string>;
}

/** The request body of `POST /v1/chat/completions`, as received. */
export type ChatCompletionBody = Record<string, unknown> & { messages: unknown[] };

export type FakeScriptFunction = (request: ChatCompletionBody, ctx: FakeScriptContext) => FakeReply | Promise<FakeReply>;

export interface FakePolicyOptions extends FakeFaults {
  /**
   * Replies consumed in order (per conversation or globally, see `scriptScope`), or a function of
   * the request. An exhausted array answers 500. @default every request gets 'Hello from the fake policy.'
   */
  script?: readonly FakeReply[] | FakeScriptFunction;
  /** @default 'conversation' */
  scriptScope?: 'conversation' | 'global';
  /** The header naming a conversation; without it the first user message does. @default 'x-rollout-id' */
  conversationHeader?: string;
  /** The served model name; a request naming another model gets 404 as from vLLM. @default 'fake-policy' */
  model?: string;
  /** Require `Authorization: Bearer <apiKey>` on /v1 routes. */
  apiKey?: string;
  /** False acts as vLLM before 0.10.2: `return_token_ids` is ignored. @default true */
  supportsReturnTokenIds?: boolean;
  /**
   * Generate tool calls with Python's JSON spacing (`{"name": "f", "arguments": {"x": 1}}`) while
   * the chat template and the chat API's `tool_calls` use the compact form: a chat client that
   * sends the conversation back gets earlier turns re-tokenised differently from what was
   * generated (re-tokenisation drift). Token-id prompts (`/v1/completions`) are unaffected.
   * @default false
   */
  drifting?: boolean;
  /** Prompts longer than this get 400 as from vLLM. @default 32768 */
  maxModelLen?: number;
  /**
   * Faults of `POST /v1/embeddings` only (e.g. `{ status: 503 }` for an embeddings endpoint that is
   * down); the global faults apply too.
   */
  embeddingFaults?: FakeFaults;
  /** Dimensions of the embeddings (hashed bag of words, see `fakeEmbedding`). @default 64 */
  embeddingDims?: number;
  /** @default '127.0.0.1' */
  host?: string;
  /** @default 0 (a free port) */
  port?: number;
}

/** One chat completion or completion request the fake policy received. */
export interface FakePolicyCall {
  /** `/v1/chat/completions` or `/v1/completions` (whose token-id prompt `body.messages` gives back as messages). */
  endpoint: 'chat' | 'completions';
  body: ChatCompletionBody;
  headers: Record<string, string>;
  conversation: string;
  callIndex: number;
  conversationCallIndex: number;
}

export interface FakePolicy {
  /** The OpenAI base URL: `http://127.0.0.1:PORT/v1`. */
  readonly url: string;
  readonly port: number;
  /** Every chat completion request body received, in order. */
  readonly requests: ChatCompletionBody[];
  /** The same requests with their headers and conversation. */
  readonly calls: FakePolicyCall[];
  /** `GET /v1/models` requests received (health probes). */
  readonly modelListCalls: number;
  /** False between `kill()` and `restart()`. */
  readonly running: boolean;
  /** `POST /v1/embeddings` request bodies received, in order. */
  readonly embeddingRequests: Array<Record<string, unknown>>;
  /** `POST /tokenize` request bodies received, in order. */
  readonly tokenizeRequests: Array<Record<string, unknown>>;
  /** `POST /v1/completions` request bodies received, in order, as sent (token-id prompts). */
  readonly completionRequests: Array<Record<string, unknown>>;
  /** Replaces the global faults (those given at start included). */
  setFaults(faults: FakeFaults): void;
  /** Replaces the faults of `POST /v1/embeddings`. */
  setEmbeddingFaults(faults: FakeFaults): void;
  /** Stops listening and drops every open connection, as a crashed backend would. */
  kill(): Promise<void>;
  /** Listens again on the same port. */
  restart(): Promise<void>;
  close(): Promise<void>;
}
