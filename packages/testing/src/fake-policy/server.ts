import { setMaxListeners } from 'node:events';
import type { IncomingMessage } from 'node:http';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { serveFetch, type RunningServer } from '@rollserve/core/gym';
import { Hono, type Context } from 'hono';
import {
  completionChunks,
  completionJson,
  generateChoices,
  normalizeReply,
  promptTokenIds,
  readRequestOptions,
  textCompletionJson,
  type CompletionMeta,
  type GeneratedChoice,
  type RequestOptions,
} from './completion.ts';
import { parsePrompt, renderPrompt, toyTokenizer } from './tokenizer.ts';
import type { ChatCompletionBody, FakeFaults, FakePolicy, FakePolicyCall, FakePolicyOptions, FakeReply } from './types.ts';

type Env = { Bindings: { incoming: IncomingMessage } };

/** The reply to every request when no script is given. */
export const FAKE_POLICY_DEFAULT_REPLY = 'Hello from the fake policy.';

const ERROR_TYPES: Record<number, string> = {
  400: 'BadRequestError',
  401: 'AuthenticationError',
  404: 'NotFoundError',
  429: 'RateLimitError',
  500: 'InternalServerError',
  503: 'ServiceUnavailableError',
};

function errorResponse(status: number, message: string): Response {
  const body = { error: { message, type: ERROR_TYPES[status] ?? 'APIError', param: null, code: status } };
  return new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } });
}

function firstUserMessage(messages: unknown[]): string {
  const user = messages.find((m) => (m as { role?: unknown })?.role === 'user') as { content?: unknown } | undefined;
  return typeof user?.content === 'string' ? user.content : JSON.stringify(user?.content ?? null);
}

/**
 * The fake policy's embedding of a text: a hashed bag of words (each non-whitespace toy-tokenizer
 * piece adds 1 at `tokenId % dims`), L2-normalised; all zeros for a text without pieces.
 * Deterministic, so texts with the same words embed the same and disjoint ones (barring hash
 * collisions) are orthogonal.
 */
export function fakeEmbedding(text: string, dims = 64): number[] {
  const vector = new Array<number>(dims).fill(0);
  for (const piece of toyTokenizer.pieces(text)) if (piece.trim() !== '') vector[toyTokenizer.tokenId(piece) % dims]! += 1;
  const norm = Math.sqrt(vector.reduce((a, v) => a + v * v, 0));
  return norm === 0 ? vector : vector.map((v) => v / norm);
}

/**
 * Starts a scripted, OpenAI-compatible policy server that answers chat completions the way vLLM
 * does (JSON and SSE, token ids and logprobs when asked), with the toy tokenizer of `tokenizer.ts`.
 */
export async function startFakePolicy(options: FakePolicyOptions = {}): Promise<FakePolicy> {
  const {
    script,
    scriptScope = 'conversation',
    conversationHeader = 'x-rollout-id',
    model = 'fake-policy',
    apiKey,
    supportsReturnTokenIds = true,
    drifting = false,
    maxModelLen = 32_768,
    host = '127.0.0.1',
    port = 0,
    embeddingFaults: initialEmbeddingFaults = {},
    embeddingDims = 64,
    ...initialFaults
  } = options;
  let faults: FakeFaults = initialFaults;
  let embeddingFaults: FakeFaults = initialEmbeddingFaults;
  const embeddingRequests: Array<Record<string, unknown>> = [];
  const tokenizeRequests: Array<Record<string, unknown>> = [];
  const completionRequests: Array<Record<string, unknown>> = [];
  const requests: ChatCompletionBody[] = [];
  const calls: FakePolicyCall[] = [];
  const conversationCalls = new Map<string, number>();
  let modelListCalls = 0;
  let globalCursor = 0;
  // Aborted when the server is killed or closed: ends every wait (latency, hang) at once.
  const newLife = () => {
    const controller = new AbortController();
    setMaxListeners(0, controller.signal); // one listener per waiting request
    return controller;
  };
  let life = newLife();

  /** Waits `ms`; true when cut short by the server's end or the client going away. */
  const interrupted = (ms: number, request: AbortSignal): Promise<boolean> => {
    const signals = [life.signal, request];
    if (signals.some((s) => s.aborted)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = (cut: boolean) => {
        if (timer) clearTimeout(timer);
        for (const s of signals) s.removeEventListener('abort', onAbort);
        resolve(cut);
      };
      const onAbort = () => done(true);
      const timer = Number.isFinite(ms) ? setTimeout(() => done(false), ms) : undefined;
      for (const s of signals) s.addEventListener('abort', onAbort, { once: true });
    });
  };

  /** Applies faults; returns the response to send instead of the real one, if any. */
  const applyFaults = async (c: Context<Env>, f: FakeFaults): Promise<Response | undefined> => {
    if (f.latencyMs && f.latencyMs > 0 && (await interrupted(f.latencyMs, c.req.raw.signal))) return RESPONSE_ALREADY_SENT;
    if (f.dropConnection) {
      c.env.incoming.socket.destroy();
      return RESPONSE_ALREADY_SENT;
    }
    if (f.hang) {
      await interrupted(Number.POSITIVE_INFINITY, c.req.raw.signal);
      return RESPONSE_ALREADY_SENT;
    }
    if (f.status !== undefined) return errorResponse(f.status, f.errorMessage ?? `fake policy: injected HTTP ${f.status}`);
    return undefined;
  };

  const nextReply = async (body: ChatCompletionBody, call: FakePolicyCall): Promise<FakeReply | undefined> => {
    if (script === undefined) return FAKE_POLICY_DEFAULT_REPLY;
    if (typeof script === 'function') {
      const turn = body.messages.filter((m) => (m as { role?: unknown })?.role === 'assistant').length;
      const { callIndex, conversationCallIndex, conversation, headers } = call;
      return script(body, { callIndex, conversationCallIndex, conversation, turn, headers });
    }
    const index = scriptScope === 'global' ? globalCursor++ : call.conversationCallIndex;
    return script[index];
  };

  const app = new Hono<Env>();
  const unauthorized = (c: Context<Env>) =>
    apiKey !== undefined && c.req.path.startsWith('/v1') && c.req.header('authorization') !== `Bearer ${apiKey}`;
  app.use('*', async (c, next) => {
    // Chat completions record the request first, then apply the same checks.
    if (c.req.path === '/v1/chat/completions' || c.req.path === '/v1/completions') return next();
    const injected = await applyFaults(c, faults);
    if (injected) return injected;
    if (unauthorized(c)) return c.json({ error: 'Unauthorized' }, 401);
    return next();
  });
  app.get('/health', (c) => c.body(null, 200));
  app.get('/v1/models', (c) => {
    modelListCalls += 1;
    const created = Math.floor(Date.now() / 1000);
    return c.json({
      object: 'list',
      data: [{ id: model, object: 'model', created, owned_by: 'vllm', root: model, parent: null, max_model_len: maxModelLen }],
    });
  });
  // OpenAI's embeddings shape, as vLLM serves it for embedding models.
  app.post('/v1/embeddings', async (c) => {
    let body: Record<string, unknown>;
    try {
      body = (await c.req.json()) as Record<string, unknown>;
    } catch {
      return errorResponse(400, 'fake policy: the body is not valid JSON');
    }
    embeddingRequests.push(body);
    const injected = await applyFaults(c, embeddingFaults);
    if (injected) return injected;
    const input = typeof body.input === 'string' ? [body.input] : body.input;
    if (!Array.isArray(input) || !input.every((t) => typeof t === 'string')) return errorResponse(400, 'fake policy: `input` must be a string or an array of strings');
    if (typeof body.model === 'string' && body.model !== model) return errorResponse(404, `The model \`${body.model}\` does not exist.`);
    const tokens = input.reduce((n, t) => n + toyTokenizer.encode(t).length, 0);
    return c.json({
      object: 'list',
      data: input.map((text, index) => ({ object: 'embedding', index, embedding: fakeEmbedding(text, embeddingDims) })),
      model,
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    });
  });
  /**
   * Answers a generation request, chat or completions: records it, applies faults, advances the
   * conversation's script, checks it, and generates the scripted reply.
   */
  const generate = async (
    c: Context<Env>,
    endpoint: FakePolicyCall['endpoint'],
    body: ChatCompletionBody,
    promptIds: number[] | string,
    respond: (meta: CompletionMeta, promptIds: number[], choices: GeneratedChoice[], request: RequestOptions) => Response | Promise<Response>,
  ): Promise<Response> => {
    const headers = Object.fromEntries(c.req.raw.headers.entries());
    const conversation = headers[conversationHeader.toLowerCase()] ?? firstUserMessage(body.messages);
    const call: FakePolicyCall = {
      endpoint,
      body,
      headers,
      conversation,
      callIndex: calls.length,
      conversationCallIndex: conversationCalls.get(conversation) ?? 0,
    };
    if (endpoint === 'chat') requests.push(body);
    calls.push(call);
    const injectedGlobally = await applyFaults(c, faults);
    if (injectedGlobally) return injectedGlobally;
    if (unauthorized(c)) return c.json({ error: 'Unauthorized' }, 401);
    // Requests refused by a global fault do not advance the conversation's script.
    const conversationCallIndex = conversationCalls.get(conversation) ?? 0;
    call.conversationCallIndex = conversationCallIndex;
    conversationCalls.set(conversation, conversationCallIndex + 1);
    if (typeof promptIds === 'string') return errorResponse(400, promptIds);
    if (typeof body.model === 'string' && body.model !== model) {
      return errorResponse(404, `The model \`${body.model}\` does not exist.`);
    }
    const request = readRequestOptions(body, supportsReturnTokenIds);
    if (promptIds.length + (request.maxTokens ?? 0) > maxModelLen) {
      return errorResponse(
        400,
        `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${promptIds.length + (request.maxTokens ?? 0)} tokens.`,
      );
    }
    const raw = await nextReply(body, call);
    if (raw === undefined) return errorResponse(500, `fake policy: the script has no reply for call ${conversationCallIndex} of ${conversation}`);
    const reply = normalizeReply(raw);
    const injected = await applyFaults(c, reply);
    if (injected) return injected;
    const meta = { id: `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-fake-${call.callIndex}`, created: Math.floor(Date.now() / 1000), model };
    return respond(meta, promptIds, generateChoices(reply, request.n, call.callIndex, request.maxTokens, drifting), request);
  };

  app.post('/v1/chat/completions', async (c) => {
    let body: ChatCompletionBody;
    try {
      body = (await c.req.json()) as ChatCompletionBody;
    } catch {
      return errorResponse(400, 'fake policy: the body is not valid JSON');
    }
    const valid = typeof body === 'object' && body !== null && Array.isArray(body.messages) && body.messages.length > 0;
    if (!valid) body = { ...(typeof body === 'object' && body !== null ? body : {}), messages: [] };
    const promptIds = valid ? promptTokenIds(body) : 'fake policy: `messages` must be a non-empty array';
    return generate(c, 'chat', body, promptIds, (meta, ids, choices, request) => {
      if (!request.stream) return c.json(completionJson(meta, ids, choices, request));
      const events = completionChunks(meta, ids, choices, request);
      const encoder = new TextEncoder();
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          for (const event of events) controller.enqueue(encoder.encode(event));
          controller.close();
        },
      });
      return new Response(stream, {
        headers: { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'transfer-encoding': 'chunked' },
      });
    });
  });

  // The ids this server gave out (tokenize, generations), so a token-id prompt can be read back.
  const vocabulary = new Map<number, string>();
  const encodeAndRemember = (text: string): number[] =>
    toyTokenizer.pieces(text).map((piece) => {
      const id = toyTokenizer.tokenId(piece);
      vocabulary.set(id, piece);
      return id;
    });

  // vLLM's tokenizer route (at the server root, beside /v1): a chat with the template, or a text.
  app.post('/tokenize', async (c) => {
    let body: Record<string, unknown>;
    try {
      body = (await c.req.json()) as Record<string, unknown>;
    } catch {
      return errorResponse(400, 'fake policy: the body is not valid JSON');
    }
    if (typeof body !== 'object' || body === null) return errorResponse(400, 'fake policy: the body must be an object');
    tokenizeRequests.push(body);
    if (typeof body.model === 'string' && body.model !== model) return errorResponse(404, `The model \`${body.model}\` does not exist.`);
    let text: string;
    if (Array.isArray(body.messages)) {
      const tools = Array.isArray(body.tools) ? body.tools : undefined;
      text = renderPrompt(body.messages, tools, { addGenerationPrompt: body.add_generation_prompt !== false });
    } else if (typeof body.prompt === 'string') {
      text = body.prompt;
    } else {
      return errorResponse(400, 'fake policy: /tokenize takes `messages` (an array) or `prompt` (a string)');
    }
    const tokens = encodeAndRemember(text);
    return c.json({
      count: tokens.length,
      max_model_len: maxModelLen,
      tokens,
      token_strs: body.return_token_strs === true ? toyTokenizer.pieces(text) : null,
    });
  });

  // Completions from a token-id prompt (or a text): the prompt is read back through the toy
  // template so the script sees the same messages as in a chat completion.
  app.post('/v1/completions', async (c) => {
    let raw: Record<string, unknown>;
    try {
      raw = (await c.req.json()) as Record<string, unknown>;
    } catch {
      return errorResponse(400, 'fake policy: the body is not valid JSON');
    }
    if (typeof raw !== 'object' || raw === null) raw = {};
    completionRequests.push(raw);
    let promptIds: number[] | string;
    let text = '';
    if (typeof raw.prompt === 'string') {
      text = raw.prompt;
      promptIds = encodeAndRemember(text);
    } else if (Array.isArray(raw.prompt) && raw.prompt.length > 0 && raw.prompt.every((id) => Number.isInteger(id))) {
      const ids = raw.prompt as number[];
      const unknown = ids.find((id) => !vocabulary.has(id));
      promptIds = unknown === undefined ? ids : `fake policy: token id ${unknown} is not one this server gave out (tokenize or generate first)`;
      if (unknown === undefined) text = ids.map((id) => vocabulary.get(id)!).join('');
    } else {
      promptIds = 'fake policy: `prompt` must be a string or a non-empty array of token ids (one prompt)';
    }
    if (raw.stream === true) promptIds = 'fake policy: streamed completions are not supported';
    const { messages, tools } = parsePrompt(text);
    const body: ChatCompletionBody = { ...raw, messages, ...(tools ? { tools } : {}) };
    return generate(c, 'completions', body, promptIds, (meta, ids, choices, request) => {
      for (const choice of choices) for (const token of choice.tokens) vocabulary.set(token.id, token.piece);
      return c.json(textCompletionJson(meta, ids, choices, request));
    });
  });
  app.notFound((c) => c.json({ detail: 'Not Found' }, 404));
  app.onError((error) => errorResponse(500, `fake policy: ${error instanceof Error ? error.message : String(error)}`));

  let server: RunningServer | null = await serveFetch(app, { host, port });
  let closed = false;
  const boundPort = server.port;
  const urlHost = host.includes(':') ? `[${host}]` : host;

  const stop = async () => {
    if (!server) return;
    const running = server;
    server = null;
    life.abort();
    await running.close();
  };

  return {
    url: `http://${urlHost}:${boundPort}/v1`,
    port: boundPort,
    requests,
    calls,
    embeddingRequests,
    tokenizeRequests,
    completionRequests,
    get modelListCalls() {
      return modelListCalls;
    },
    get running() {
      return server !== null;
    },
    setFaults(next) {
      faults = next;
    },
    setEmbeddingFaults(next) {
      embeddingFaults = next;
    },
    kill: stop,
    async restart() {
      if (server || closed) return;
      life = newLife();
      server = await serveFetch(app, { host, port: boundPort });
    },
    async close() {
      closed = true;
      await stop();
    },
  };
}
