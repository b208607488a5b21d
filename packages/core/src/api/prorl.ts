import { randomUUID } from 'node:crypto';
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
  'max_model_len',
  'enable_thinking',
  'ensure_thinking_end_properly',
  'strict_loop_detector',
  'drop_params',
  'caching_prompt',
  'disable_vision',
]);

/**
 * ProRL's own instance rows name their handler in `data_source` (openhands/nvidia/registry.py:
 * `deepscaler` is its math handler, `deepcoder*` and the code datasets its code handler): the
 * served environment each one means when no served environment has that name.
 */
const PRORL_DATA_SOURCES: ReadonlyArray<[RegExp, string]> = [
  [/^deepscaler$/, 'math'],
  [/^(deepcoder.*|codecontests|apps|codeforces|taco)$/, 'code'],
];

/** ProRL's `ProcessRequest`, instances in NeMo Gym form (`responses_create_params` plus the task's fields). */
export const ProcessRequest = z
  .object({
    /**
     * The task instance: a NeMo Gym dataset row. Its environment is `env`, else `data_source` when
     * it names a served environment, else the only served one. `instance_id` and `trajectory_id`
     * come back in the result.
     */
    instance: z
      .looseObject({
        env: z.string().optional(),
        data_source: z.string().optional(),
        responses_create_params: ResponseCreateParams.optional(),
        /** ProRL's own row (a DeepScaleR row): the chat prompt, a list of messages or its JSON text. */
        prompt: z.union([z.array(z.looseObject({ role: z.string(), content: z.unknown() })), z.string()]).optional(),
        /** ProRL's own row: `ground_truth`, the expected answer (math) or the tests (code, as JSON). */
        reward_model: z.looseObject({ ground_truth: z.unknown().optional() }).optional(),
      })
      .superRefine((instance, ctx) => {
        if (instance.responses_create_params === undefined && instance.prompt === undefined) {
          ctx.addIssue({ code: 'invalid_type', expected: 'object', path: ['responses_create_params'], message: 'responses_create_params (or ProRL\'s prompt) is required' });
        }
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
    /** Any string, as ProRL takes it (`step-1/traj-0`); it names the job for /cancel, not the rollout. */
    job_id: z.string().nullish(),
    /** rollserve's: the policy's OpenAI base URL for this job instead of the registered LLM servers. */
    base_url: z.url().optional(),
    /** rollserve's: stage time, turns and sandbox limits of this job. */
    limits: RolloutLimits.partial().optional(),
  })
  .openapi('ProRLProcessRequest');

/**
 * ProRL's message. The three token keys are there when the rollout has token ids (ProRL's
 * `token_level_generation`), on every message, and left out otherwise, as ProRL does.
 */
const ProRLMessage = z
  .looseObject({
    role: z.string(),
    content: z.string(),
    /** ProRL's: the functions called (`{name, arguments}`). */
    tool_calls: z.array(z.object({ name: z.string(), arguments: z.string() })).optional(),
    /**
     * Assistant: the generated token ids. Other messages: the context tokens they add (the chat
     * template and tool output between two generations, on the last message before the next
     * generation; `[]` on the others), so that every message's token_ids in order give the whole
     * sequence. After a re-tokenisation drift the context message carries the prompt's tokens past
     * what it shares with the sequence so far (the assistant's `input_ids` is then the exact prompt).
     */
    token_ids: z.array(z.number().int()).optional(),
    /** Assistant: the prompt token ids of that call; null otherwise. */
    input_ids: z.array(z.number().int()).nullable().optional(),
    /** Assistant: the logprob of each generated token; null otherwise. */
    logprobs: z.array(z.number()).nullable().optional(),
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
    /** ProRL's name for the SWE patch (also `model_patch`, the environment's); null on an error result without one. */
    git_patch: z.string().nullable().optional(),
    /** Error results (init, run, eval, cancelled): what failed. rollserve has no Python traceback: the error's code and message. */
    traceback: z.string().optional(),
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
 * ProRL's messages (`process_messages_from_agent_state`): role, content and `tool_calls` as
 * `{name, arguments}`, up to the last assistant message (ProRL drops what follows it); in token
 * mode, on each message the token ids of its place in the sequence (see ProRLMessage).
 */
function prorlMessages(result: RolloutResult): Array<z.infer<typeof ProRLMessage>> {
  const turns = result.turns;
  let end = result.messages.length;
  while (end > 0 && result.messages[end - 1]!.role !== 'assistant') end--;
  const messages = result.messages.slice(0, end);
  const assistantAt = messages.flatMap((m, i) => (m.role === 'assistant' ? [i] : []));
  // Each turn appended one assistant message: the last turns.length of them are the turns'.
  const turnAt = new Map<number, number>(assistantAt.slice(Math.max(0, assistantAt.length - turns.length)).map((messageIndex, turn) => [messageIndex, turn]));
  // Token mode: the policy gave token ids. A turn without them (a failed call) then has empty lists, never null.
  const tokenMode = turns.some((t) => t.prompt_token_ids !== null && t.generation_token_ids !== null);
  // Context tokens before each turn's generation: what its prompt adds to the sequence so far.
  const context: number[][] = [];
  let sequence: number[] = [];
  for (const turn of tokenMode ? turns : []) {
    const prompt = turn.prompt_token_ids;
    if (prompt === null || turn.generation_token_ids === null) {
      context.push([]);
      continue;
    }
    let common = 0;
    while (common < sequence.length && common < prompt.length && sequence[common] === prompt[common]) common++;
    context.push(prompt.slice(common));
    sequence = [...prompt, ...turn.generation_token_ids];
  }
  const generationsAt = [...turnAt.keys()];
  return messages.map((message, i) => {
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
    if (!tokenMode) return base;
    if (turnIndex !== undefined) {
      const turn = turns[turnIndex]!;
      return { ...base, token_ids: turn.generation_token_ids ?? [], input_ids: turn.prompt_token_ids, logprobs: turn.generation_logprobs };
    }
    // A context message: the tokens the next generation's prompt adds go on the last message before it.
    const next = generationsAt.find((at) => at > i);
    const tokens = next !== undefined && next === i + 1 ? (context[turnAt.get(next)!] ?? []) : [];
    return { ...base, token_ids: tokens, input_ids: null, logprobs: null };
  });
}

/** The stages whose failure ProRL answers with an exception result (`git_patch`, `traceback`). */
const EXCEPTION_STAGES = new Set(['init', 'run', 'eval', 'cancelled']);

/** ProRL's `final_result` shape for a finished rollout. */
export function prorlResult(result: RolloutResult, instance: Record<string, unknown>, jobId: string): z.infer<typeof ProRLResult> {
  const last = result.turns.at(-1);
  const resolved = typeof result.verify_extras.resolved === 'boolean' ? result.verify_extras.resolved : result.reward >= 1;
  const seconds = (ms: number) => ms / 1_000;
  const { init, run, eval: evaluation } = result.timing;
  const response = result.response as { tools?: unknown[] } | null;
  const error = result.error ? `${result.error.code}: ${result.error.message}` : null;
  const exceptionResult = result.critical_error !== null && EXCEPTION_STAGES.has(result.critical_error);
  return {
    ...result.verify_extras,
    instance_id: instance.instance_id ?? null,
    trajectory_id: instance.trajectory_id ?? null,
    job_id: jobId,
    messages: prorlMessages(result),
    tools: responsesToolsToChat(response?.tools ?? (instance.responses_create_params as { tools?: unknown[] } | undefined)?.tools ?? []).map((t) => ({ ...t, function: { ...t.function } })),
    end_properly: last !== undefined && last.malformed === null && last.finish_reason !== 'length',
    success: result.state === 'done' && result.error === null,
    error,
    finish: last !== undefined && last.tool_calls.length === 0 && !!last.text && last.finish_reason !== 'length',
    resolved,
    reward: result.reward,
    critical_error: result.critical_error,
    // SWE results carry the patch as ProRL names it; so do error results, as ProRL's exception results.
    ...('model_patch' in result.verify_extras || exceptionResult ? { git_patch: typeof result.verify_extras.model_patch === 'string' ? result.verify_extras.model_patch : null } : {}),
    ...(exceptionResult ? { traceback: error ?? String(result.critical_error) } : {}),
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

/** The prompt's text: ProRL's math handler reads the first message's content (`obtain_problem_statement`). */
function promptMessages(prompt: unknown): Array<{ role: string; content: unknown }> {
  const parsed: unknown = typeof prompt === 'string' ? JSON.parse(prompt) : prompt;
  if (!Array.isArray(parsed)) throw new Error('prompt is not a list of messages');
  return parsed as Array<{ role: string; content: unknown }>;
}

/** Code tests from ProRL's `reward_model.ground_truth` (JSON `{inputs, outputs, fn_name?}`, or a list of `{input, output}`). */
function unitTests(groundTruth: unknown): Record<string, unknown> | undefined {
  let value = groundTruth;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch {
      return undefined;
    }
  }
  if (Array.isArray(value)) {
    const tests = value as Array<{ input?: unknown; output?: unknown }>;
    if (!tests.every((t) => typeof t?.input === 'string' && typeof t.output === 'string')) return undefined;
    return { inputs: tests.map((t) => t.input), outputs: tests.map((t) => t.output) };
  }
  if (typeof value === 'object' && value !== null && Array.isArray((value as { inputs?: unknown }).inputs)) return value as Record<string, unknown>;
  return undefined;
}

/**
 * A ProRL instance as a NeMo Gym row. ProRL's own rows (a DeepScaleR row: `data_source`, `prompt`,
 * `reward_model: {ground_truth}`, `extra_info`) become `responses_create_params.input` (the prompt),
 * `question` (its first message) and `expected_answer` (the ground truth), or the code tests in
 * `verifier_metadata.unit_tests`; fields the row has already are kept.
 */
function prorlRow(instance: Record<string, unknown>): Record<string, unknown> {
  if (instance.responses_create_params !== undefined || instance.prompt === undefined) return instance;
  let messages: Array<{ role: string; content: unknown }>;
  try {
    messages = promptMessages(instance.prompt);
  } catch (error) {
    throw new FastApiReply(422, { detail: [valueError(['body', 'instance', 'prompt'], `prompt is not a list of chat messages: ${(error as Error).message}`, instance.prompt)] });
  }
  const groundTruth = (instance.reward_model as { ground_truth?: unknown } | undefined)?.ground_truth;
  const derived: Record<string, unknown> = { responses_create_params: { input: messages } };
  const first = messages[0]?.content;
  if (typeof first === 'string') derived.question = first;
  if (typeof groundTruth === 'string' || typeof groundTruth === 'number') derived.expected_answer = String(groundTruth);
  const tests = unitTests(groundTruth);
  if (tests !== undefined) derived.verifier_metadata = { unit_tests: tests };
  return { ...derived, ...instance, responses_create_params: derived.responses_create_params };
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
    const { env: envName, data_source: dataSource, ...given } = request.instance;
    const served = service.environments;
    const fromSource = dataSource === undefined ? undefined : served.includes(dataSource) ? dataSource : PRORL_DATA_SOURCES.find(([name]) => name.test(dataSource))?.[1];
    const env = envName ?? (fromSource !== undefined && served.includes(fromSource) ? fromSource : undefined) ?? (served.length === 1 ? served[0] : undefined);
    if (env === undefined) {
      throw new FastApiReply(422, {
        detail: [valueError(['body', 'instance', 'env'], `instance.env is required (served: ${served.join(', ')})`, envName ?? null)],
      });
    }
    const row = prorlRow(given);
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
      // A fresh task per call: ProRL's job ids are the caller's labels (reused across steps), not ids of stored work.
      id: `prorl-${randomUUID()}`,
      env,
      row,
      policy: { model: modelName, sampling, ...(apiKey ? { api_key: apiKey } : {}), ...(request.base_url ? { base_url: request.base_url } : {}) },
      limits: RolloutLimits.parse(limits),
    });
    const [submitted] = await service.submit([task]);
    const rolloutId = submitted!.rolloutIds[0]!;
    jobs.set(jobId, rolloutId);
    try {
      return c.json(prorlResult(await service.wait(rolloutId), { ...request.instance, ...row }, jobId));
    } finally {
      if (jobs.get(jobId) === rolloutId) jobs.delete(jobId);
    }
  });

  // FastAPI answers a known path with another method 405 (Starlette's, with its Allow header).
  for (const route of ROUTES) {
    const allow = route.method.toUpperCase();
    app.all(route.path, (c) => c.json({ detail: 'Method Not Allowed' }, 405, { allow }));
  }

  return app;
}
