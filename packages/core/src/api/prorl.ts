import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { Context } from 'hono';
import { RolloutError } from '../errors.ts';
import { valueError } from '../server/fastapi-errors.ts';
import { FastApiReply } from '../server/fastapi.ts';
import { fastApiErrorHandler, parseFastApiBody } from '../server/fastapi-hono.ts';
import { ResponseCreateParams } from '../protocol/responses.ts';
import { responsesToolsToChat } from '../runner/messages.ts';
import { RolloutLimits, RolloutTask, SamplingParams, type RolloutResult } from '../protocol/rollout.ts';
import type { ApiContext, BackendRegistry } from './context.ts';

// ProRL Agent Server's HTTP API (NVIDIA-NeMo/ProRL-Agent-Server: scripts/start_server.py for the
// routes, status codes and bodies; openhands/nvidia/utils.py `final_result` and
// `process_messages_from_agent_state` for the /process result; openhands/nvidia/timer.py for
// `timing`). Errors are FastAPI's `{"detail": ...}`, as ProRL's server answers them.

const NOT_RUNNING = 'Server is not running. Please start the server first.';
const NO_LLM_SERVER = 'No LLM server addresses configured. Please add at least one LLM server address.';

/** LiteLLM provider prefixes ProRL's clients put on the model name (`hosted_vllm/Qwen/Qwen3-8B`). */
const LITELLM_PREFIX = /^(hosted_vllm|openai|litellm_proxy)\//;

/** OpenHands agent and LLMConfig knobs in ProRL's sampling_params that have no meaning here. */
const OPENHANDS_ONLY = new Set([
  'api_key',
  'model',
  'max_output_tokens',
  'max_iterations',
  'max_iteration',
  'modify_params',
  'log_completions',
  'native_tool_calling',
  'token_level_generation',
  'custom_tokenizer',
  'enable_thinking',
  'ensure_thinking_end_properly',
  'strict_loop_detector',
  'drop_params',
  'caching_prompt',
  'disable_vision',
]);

const JOB_ID = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/, 'ids are 1-128 of [A-Za-z0-9._:-], starting alphanumeric');

/** ProRL's `ProcessRequest`, instances in NeMo Gym form (`responses_create_params` plus the task's fields). */
export const ProcessRequest = z
  .object({
    /**
     * The task instance: a NeMo Gym dataset row. Its environment is `env`, else `data_source` when
     * it names a served environment, else the only served one. `instance_id` and `trajectory_id`
     * come back in the result.
     */
    instance: z.looseObject({
      env: z.string().optional(),
      data_source: z.string().optional(),
      responses_create_params: ResponseCreateParams,
    }),
    /**
     * ProRL's sampling params: `model` (a LiteLLM prefix such as `hosted_vllm/` is dropped),
     * `api_key`, `max_output_tokens` (the max_tokens of each call), `max_iterations` (turns), the
     * vLLM sampling names; OpenHands-only knobs (`native_tool_calling`, `modify_params`, ...) are ignored.
     */
    sampling_params: SamplingParams.extend({
      model: z.string().optional(),
      api_key: z.string().optional(),
      max_output_tokens: z.number().int().positive().optional(),
      max_iterations: z.number().int().positive().max(1_000).optional(),
      max_iteration: z.number().int().positive().max(1_000).optional(),
    }).default({}),
    job_id: JOB_ID.optional(),
    /** rollserve's: the policy's OpenAI base URL for this job instead of the registered LLM servers. */
    base_url: z.url().optional(),
    /** rollserve's: stage time, turns and sandbox limits of this job. */
    limits: RolloutLimits.partial().optional(),
  })
  .openapi('ProRLProcessRequest');

const ProRLMessage = z
  .looseObject({
    role: z.string(),
    content: z.string(),
    /** ProRL's: the functions called (`{name, arguments}`). */
    tool_calls: z.array(z.object({ name: z.string(), arguments: z.string() })).optional(),
    /**
     * Assistant: the generated token ids. Other messages: the context tokens they add (the chat
     * template and tool output between two generations, on the last message before the next
     * generation), so that every message's token_ids in order give the whole sequence; null
     * without token ids or on re-tokenisation drift.
     */
    token_ids: z.array(z.number().int()).nullable(),
    /** Assistant: the prompt token ids of that call; null otherwise. */
    input_ids: z.array(z.number().int()).nullable(),
    /** Assistant: the logprob of each generated token; null otherwise. */
    logprobs: z.array(z.number()).nullable(),
  })
  .openapi('ProRLMessage');

/** ProRL's `/process` result (`final_result`), built from a rollserve result. */
export const ProRLResult = z
  .looseObject({
    instance_id: z.unknown(),
    trajectory_id: z.unknown(),
    job_id: z.string(),
    messages: z.array(ProRLMessage),
    /** The tools offered, in chat completions form. */
    tools: z.array(z.looseObject({ type: z.literal('function'), function: z.looseObject({ name: z.string() }) })),
    /** False when the last generation was malformed or cut by the length limit. */
    end_properly: z.boolean(),
    success: z.boolean(),
    error: z.string().nullable(),
    /** The agent ended with a final answer. */
    finish: z.boolean(),
    resolved: z.boolean(),
    reward: z.number(),
    /** null, or the stage that failed: init, run, eval, timeout, cancelled. */
    critical_error: z.string().nullable(),
    /** True: do not train on it (an infrastructure failure). */
    filter: z.boolean(),
    /** Seconds per phase, as ProRL's PausableTimer reports them ("others": queued between stages). */
    timing: z.object({
      init_time: z.number(),
      run_time: z.number(),
      eval_time: z.number(),
      others_time: z.number(),
      counted_elapsed: z.number(),
      timeout_triggered: z.boolean(),
    }),
  })
  .openapi('ProRLResult');

const StatusMessage = z.object({ status: z.string() }).openapi('ProRLStatusMessage');
const ProRLStatus = z
  .object({
    status: z.literal('running'),
    /** /process calls waiting for their result. */
    pending_jobs: z.number().int(),
    running: z.boolean(),
    jobs: z.number().int(),
    /** Jobs being initialised, run, evaluated. */
    init: z.number().int(),
    run: z.number().int(),
    eval: z.number().int(),
  })
  .openapi('ProRLStatus');
const CancelRequest = z.object({ job_id: z.string() }).openapi('ProRLCancelRequest');
const LLMServerRequest = z.object({ address: z.string() }).openapi('ProRLLLMServerRequest');
const Detail = z.object({ detail: z.unknown() }).openapi('ProRLErrorDetail');

const json = <T extends z.ZodType>(schema: T, description: string) => ({ content: { 'application/json': { schema } }, description });
const errors = {
  400: json(Detail, 'The body could not be read (FastAPI: "There was an error parsing the body")'),
  422: json(Detail, 'FastAPI validation error: {detail: [{type, loc, msg, input}]}'),
  503: json(Detail, 'The server is stopped (POST /start), or no LLM server is registered'),
};
const tags = ['ProRL Agent'];
const body = <T extends z.ZodType>(schema: T) => ({ body: { ...json(schema, 'Request'), required: true } });

const ROUTES = [
  createRoute({ method: 'post', path: '/start', tags, summary: 'Accept /process jobs (idempotent)', responses: { 200: json(StatusMessage, 'Started') } }),
  createRoute({
    method: 'post',
    path: '/stop',
    tags,
    summary: 'Refuse /process jobs and cancel those in flight',
    responses: { 200: json(StatusMessage, 'Stopped'), 503: errors[503] },
  }),
  createRoute({ method: 'get', path: '/status', tags, summary: 'Jobs in flight per stage', responses: { 200: json(ProRLStatus, 'Running'), 503: errors[503] } }),
  createRoute({
    method: 'post',
    path: '/process',
    tags,
    summary: 'Run one instance; answers its finished result',
    request: body(ProcessRequest),
    responses: { 200: json(ProRLResult, 'The result'), ...errors, 500: json(z.string(), 'An unexpected failure: repr of the error') },
  }),
  createRoute({
    method: 'post',
    path: '/cancel',
    tags,
    summary: 'Cancel a /process job; its /process answers with critical_error "cancelled"',
    request: body(CancelRequest),
    responses: { 200: json(StatusMessage, 'Cancel requested'), 404: json(Detail, 'No such job'), ...errors },
  }),
  createRoute({
    method: 'post',
    path: '/add_llm_server',
    tags,
    summary: 'Register an OpenAI-compatible base URL (`http://host:port/v1`) with the LLM backend pool',
    request: body(LLMServerRequest),
    responses: { 200: json(StatusMessage, 'Added'), 400: errors[400], 422: errors[422], 501: json(Detail, 'This service manages no LLM backends') },
  }),
  createRoute({
    method: 'post',
    path: '/clear_llm_server',
    tags,
    summary: 'Remove every LLM backend (a checkpoint swap); /process then fails with 503 until one is added',
    responses: { 200: json(StatusMessage, 'Cleared'), 501: json(Detail, 'This service manages no LLM backends') },
  }),
];

type BackendEntry = { id?: unknown; base_url?: unknown };

function registered(backends: BackendRegistry): Array<{ id: string; baseUrl: string }> {
  return (backends.list() as BackendEntry[]).flatMap((b) => (typeof b.id === 'string' ? [{ id: b.id, baseUrl: String(b.base_url ?? '') }] : []));
}

/**
 * ProRL's messages: role, content and `tool_calls` as `{name, arguments}`; on each message the
 * token ids of its place in the sequence (see ProRLMessage).
 */
function prorlMessages(result: RolloutResult): Array<z.infer<typeof ProRLMessage>> {
  const turns = result.turns;
  const assistantAt = result.messages.flatMap((m, i) => (m.role === 'assistant' ? [i] : []));
  // Each turn appended one assistant message: the last turns.length of them are the turns'.
  const turnAt = new Map<number, number>(assistantAt.slice(assistantAt.length - turns.length).map((messageIndex, turn) => [messageIndex, turn]));
  // Context tokens before each turn's generation: what its prompt adds to the sequence so far.
  const context: Array<number[] | null> = [];
  let sequence: number[] | null = [];
  for (const turn of turns) {
    const prompt = turn.prompt_token_ids;
    if (sequence === null || prompt === null || turn.generation_token_ids === null || !sequence.every((id, k) => prompt[k] === id)) {
      sequence = null;
      context.push(null);
      continue;
    }
    context.push(prompt.slice(sequence.length));
    sequence = [...prompt, ...turn.generation_token_ids];
  }
  const generationsAt = [...turnAt.keys()];
  return result.messages.map((message, i) => {
    const turnIndex = turnAt.get(i);
    const toolCalls = (message.tool_calls as Array<{ function?: { name?: string; arguments?: string } }> | undefined)?.map((c) => ({
      name: String(c.function?.name ?? ''),
      arguments: String(c.function?.arguments ?? ''),
    }));
    const base = {
      role: String(message.role),
      content: typeof message.content === 'string' ? message.content : '',
      ...(toolCalls && toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
      ...(typeof message.reasoning_content === 'string' ? { reasoning_content: message.reasoning_content } : {}),
    };
    if (turnIndex !== undefined) {
      const turn = turns[turnIndex]!;
      return { ...base, token_ids: turn.generation_token_ids, input_ids: turn.prompt_token_ids, logprobs: turn.generation_logprobs };
    }
    // A context message: the tokens the next generation's prompt adds go on the last message before
    // it; messages after the last generation are in no prompt.
    const next = generationsAt.find((at) => at > i);
    const tokens = next === undefined ? null : (context[turnAt.get(next)!] ?? null);
    return { ...base, token_ids: tokens === null ? null : next === i + 1 ? tokens : [], input_ids: null, logprobs: null };
  });
}

/** ProRL's `final_result` shape for a finished rollout. */
export function prorlResult(result: RolloutResult, instance: Record<string, unknown>, jobId: string): z.infer<typeof ProRLResult> {
  const last = result.turns.at(-1);
  const resolved = typeof result.verify_extras.resolved === 'boolean' ? result.verify_extras.resolved : result.reward >= 1;
  const seconds = (ms: number) => ms / 1_000;
  const { init, run, eval: evaluation } = result.timing;
  const response = result.response as { tools?: unknown[] } | null;
  return {
    ...result.verify_extras,
    instance_id: instance.instance_id ?? null,
    trajectory_id: instance.trajectory_id ?? null,
    job_id: jobId,
    messages: prorlMessages(result),
    tools: responsesToolsToChat(response?.tools ?? (instance.responses_create_params as { tools?: unknown[] }).tools ?? []).map((t) => ({ ...t, function: { ...t.function } })),
    end_properly: last !== undefined && last.malformed === null && last.finish_reason !== 'length',
    success: result.state === 'done' && result.error === null,
    error: result.error ? `${result.error.code}: ${result.error.message}` : null,
    finish: last !== undefined && last.tool_calls.length === 0 && !!last.text && last.finish_reason !== 'length',
    resolved,
    reward: result.reward,
    critical_error: result.critical_error,
    filter: result.filter,
    timing: {
      init_time: seconds(init.active_ms),
      run_time: seconds(run.active_ms),
      eval_time: seconds(evaluation.active_ms),
      others_time: seconds(init.queued_ms + run.queued_ms + evaluation.queued_ms),
      counted_elapsed: seconds(init.active_ms + run.active_ms + evaluation.active_ms),
      timeout_triggered: result.critical_error === 'timeout',
    },
  };
}

/**
 * ProRL Agent's server API: `/start`, `/stop`, `/status`, `/process`, `/cancel`,
 * `/add_llm_server`, `/clear_llm_server`. It starts accepting jobs; `/stop` refuses new ones and
 * cancels those in flight (this face's jobs only: `/v1/rollouts` is not affected).
 */
export function prorlApi({ service, options }: ApiContext): OpenAPIHono {
  const app = new OpenAPIHono();
  app.onError(fastApiErrorHandler({ logger: service.logger, httpExceptions: true }));
  for (const route of ROUTES) app.openAPIRegistry.registerPath(route);

  let accepting = true;
  /** job id → rollout id of the /process calls waiting for their result. */
  const jobs = new Map<string, string>();
  let nextJob = 0;

  const requireRunning = () => {
    if (!accepting) throw new FastApiReply(503, { detail: NOT_RUNNING });
  };

  app.post('/start', (c) => {
    // ProRL answers 400 when already running; its clients /start before every batch, so here it is a no-op.
    const was = accepting;
    accepting = true;
    return c.json({ status: was ? 'Server is already running' : 'Server started successfully' });
  });

  app.post('/stop', (c) => {
    requireRunning();
    accepting = false;
    for (const rolloutId of jobs.values()) void service.cancel(rolloutId).catch(() => undefined);
    return c.json({ status: 'Server stopped successfully' });
  });

  app.get('/status', async (c) => {
    requireRunning();
    const counts = { init: 0, run: 0, eval: 0 };
    for (const rolloutId of jobs.values()) {
      const state = (await service.get(rolloutId))?.state;
      if (state === 'init' || state === 'run' || state === 'eval') counts[state]++;
    }
    return c.json({ status: 'running', pending_jobs: jobs.size, running: true, jobs: jobs.size, ...counts });
  });

  app.post('/cancel', async (c) => {
    const { value } = await parseFastApiBody(c, CancelRequest);
    requireRunning();
    const rolloutId = jobs.get(value.job_id) ?? ((await service.get(value.job_id)) ? value.job_id : undefined);
    if (rolloutId === undefined) throw new FastApiReply(404, { detail: `Job ${value.job_id} not found` });
    await service.cancel(rolloutId);
    return c.json({ status: `Cancel requested for job ${value.job_id}` });
  });

  const backends = (): BackendRegistry => {
    if (!options.backends) throw new FastApiReply(501, { detail: 'this service manages no LLM backends' });
    return options.backends;
  };

  app.post('/add_llm_server', async (c) => {
    const { value } = await parseFastApiBody(c, LLMServerRequest);
    const registry = backends();
    const address = value.address;
    // ProRL keeps one entry per address: adding it again is a no-op.
    if (!registered(registry).some((b) => b.baseUrl === address)) {
      try {
        registry.add({ baseUrl: address });
      } catch (error) {
        if (!RolloutError.isInstance(error)) throw error;
        if (error.code !== 'CONFLICT') throw new FastApiReply(422, { detail: [valueError(['body', 'address'], error.message, address)] });
        // Another backend has this host:port under another path: name this one by its position.
        registry.add({ id: `prorl-${registered(registry).length}`, baseUrl: address });
      }
    }
    return c.json({ status: `${accepting ? 'Added' : 'Buffered'} LLM server address: ${address}` });
  });

  app.post('/clear_llm_server', (c) => {
    const registry = backends();
    for (const { id } of registered(registry)) registry.remove(id);
    return c.json({ status: accepting ? 'Cleared all LLM server addresses' : 'Cleared buffered LLM server addresses' });
  });

  app.post('/process', async (c: Context) => {
    const { value: request } = await parseFastApiBody(c, ProcessRequest);
    requireRunning();
    const { env: envName, data_source: dataSource, ...row } = request.instance;
    const served = service.environments;
    const env = envName ?? (dataSource !== undefined && served.includes(dataSource) ? dataSource : undefined) ?? (served.length === 1 ? served[0] : undefined);
    if (env === undefined) {
      throw new FastApiReply(422, {
        detail: [valueError(['body', 'instance', 'env'], `instance.env is required (served: ${served.join(', ')})`, envName ?? null)],
      });
    }
    const { model, api_key: apiKey, max_output_tokens: maxOutputTokens, max_iterations: maxIterations, max_iteration: maxIteration, ...rest } = request.sampling_params;
    const sampling = Object.fromEntries(Object.entries(rest).filter(([key]) => !OPENHANDS_ONLY.has(key)));
    if (maxOutputTokens !== undefined && sampling.max_tokens === undefined) sampling.max_tokens = maxOutputTokens;
    const modelName = model?.replace(LITELLM_PREFIX, '') || options.defaultModel;
    if (!modelName) throw new FastApiReply(422, { detail: [valueError(['body', 'sampling_params', 'model'], 'sampling_params.model is required', null)] });
    if (request.base_url === undefined && options.backends && options.backends.list().length === 0) {
      throw new FastApiReply(503, { detail: NO_LLM_SERVER });
    }
    const turns = maxIterations ?? maxIteration;
    const limits = { ...request.limits, ...(turns !== undefined ? { max_turns: turns } : {}) };
    const jobId = request.job_id ?? `prorl-${Date.now().toString(36)}-${(nextJob++).toString(36)}`;
    const task = RolloutTask.parse({
      id: jobId,
      env,
      row,
      policy: { model: modelName, sampling, ...(apiKey ? { api_key: apiKey } : {}), ...(request.base_url ? { base_url: request.base_url } : {}) },
      limits: RolloutLimits.parse(limits),
    });
    const [submitted] = await service.submit([task]);
    const rolloutId = submitted!.rolloutIds[0]!;
    jobs.set(jobId, rolloutId);
    try {
      return c.json(prorlResult(await service.wait(rolloutId), request.instance, jobId));
    } finally {
      jobs.delete(jobId);
    }
  });

  return app;
}
