import { randomUUID } from 'node:crypto';
import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { Context } from 'hono';
import { RolloutError } from '../errors.ts';
import { NOT_FOUND_BODY, pydanticInt, valueError } from '../server/fastapi-errors.ts';
import { FastApiReply, stripRolloutPrefix } from '../server/fastapi.ts';
import { fastApiErrorHandler, fastApiJsonResponse, parseFastApiBody } from '../server/fastapi-hono.ts';
import { aggregateMetricsFloats, verifyResponseFloats } from '../gym/float-fields.ts';
import { computeAggregateMetrics } from '../gym/metrics.ts';
import { ResponseCreateParams } from '../protocol/responses.ts';
import type { VerifyEntry } from '../spec/environment.ts';
import type { RolloutService } from '../service/service.ts';
import { PolicySpec } from '../protocol/rollout.ts';
import type { ApiContext } from './context.ts';

// ---------------------------------------------------------------------------------------------
// Schemas (NeMo Gym's names: SimpleAgentRunRequest, SimpleAgentVerifyResponse, AggregateMetrics)

const AgentRef = z.looseObject({ type: z.string().optional(), name: z.string() });

/** A NeMo Gym dataset row as rollout collection sends it to an agent's `/run`. */
export const GymRunRequest = z
  .looseObject({
    responses_create_params: ResponseCreateParams,
    /** Routes the row: the served environment named by it (`math`, `math_simple_agent`, `math_with_judge_simple_agent`). */
    agent_ref: AgentRef.optional(),
  })
  .openapi('GymRunRequest');

/** What simple_agent's `/run` answers: the verify response (reward plus the environment's extras). */
export const GymRunResponse = z
  .looseObject({
    responses_create_params: z.record(z.string(), z.unknown()),
    /** The NeMo Gym response, token ids on each model call's last output item. */
    response: z.record(z.string(), z.unknown()),
    reward: z.number(),
  })
  .openapi('GymRunResponse');

export const GymAggregateMetricsRequest = z
  .object({
    verify_responses: z.array(
      z.looseObject({ _ng_task_index: pydanticInt().optional(), _ng_rollout_index: pydanticInt().optional(), agent_ref: AgentRef.optional() }),
    ),
  })
  .openapi('GymAggregateMetricsRequest');

export const GymAggregateMetrics = z
  .object({
    group_level_metrics: z.array(z.record(z.string(), z.unknown())),
    agent_metrics: z.record(z.string(), z.unknown()),
    key_metrics: z.record(z.string(), z.unknown()),
  })
  .openapi('GymAggregateMetrics');

const FastApiValidationError = z
  .object({ detail: z.array(z.looseObject({ type: z.string(), loc: z.array(z.union([z.string(), z.number()])), msg: z.string() })) })
  .openapi('FastApiValidationError');
const FastApiDetail = z.object({ detail: z.string() }).openapi('FastApiDetail');

const json = <T extends z.ZodType>(schema: T, description: string) => ({ content: { 'application/json': { schema } }, description });

function routes(prefix: string) {
  const params = prefix ? { params: z.object({ rollout_id: z.string() }) } : {};
  const tags = ['NeMo Gym agent'];
  const common = {
    400: json(FastApiDetail, 'The body could not be read'),
    ...(prefix ? { 404: json(FastApiDetail, 'Not a rollout id NeMo Gym would strip') } : {}),
    422: json(FastApiValidationError, 'FastAPI validation error'),
  };
  return [
    createRoute({
      method: 'post',
      path: `${prefix}/run`,
      tags,
      summary: 'One rollout of a NeMo Gym row, answered as simple_agent answers /run',
      request: { ...params, body: { ...json(GymRunRequest, 'A NeMo Gym dataset row'), required: true } },
      responses: {
        200: json(GymRunResponse, 'The verify response'),
        ...common,
        503: json(FastApiDetail, 'No LLM backend is registered'),
        500: json(z.string(), 'The rollout failed (infrastructure): repr of the error, as NeMo Gym servers answer'),
      },
    }),
    createRoute({
      method: 'post',
      path: `${prefix}/aggregate_metrics`,
      tags,
      summary: "NeMo Gym's aggregate metrics of verify responses, with the environment's own metrics",
      request: { ...params, body: { ...json(GymAggregateMetricsRequest, 'Verify responses'), required: true } },
      responses: { 200: json(GymAggregateMetrics, 'Metrics'), ...common },
    }),
  ];
}

// ---------------------------------------------------------------------------------------------

/**
 * NeMo Gym's resources servers and the environment that replaces each, so that rows and configs
 * written for NeMo Gym (`mcqa_simple_agent` in its mcqa config) reach it.
 */
const NEMO_GYM_SERVERS: Readonly<Record<string, string>> = {
  math_with_judge: 'math',
  math_with_code: 'math',
  mcqa: 'stem',
  code_gen: 'code',
  swebench: 'swe',
};

/**
 * The environment a row or verify response names in `agent_ref.name` (NeMo Gym agent instance
 * names: the environment's name or the NeMo Gym server's it replaces, optionally with
 * `_simple_agent`/`_agent` or another `_...` suffix), else the only served one.
 */
function environmentFor(service: RolloutService, agentRef: { name: string } | undefined, loc: Array<string | number>): string {
  const served = service.environments;
  const name = agentRef?.name;
  if (name !== undefined) {
    const base = name.replace(/_(simple_)?agent$/, '');
    for (const candidate of [name, base]) {
      if (served.includes(candidate)) return candidate;
      const replacing = NEMO_GYM_SERVERS[candidate];
      if (replacing !== undefined && served.includes(replacing)) return replacing;
    }
    const names = [...served.map((env): [string, string] => [env, env]), ...Object.entries(NEMO_GYM_SERVERS).filter(([, env]) => served.includes(env))];
    const prefixed = new Set(names.filter(([prefix]) => base.startsWith(`${prefix}_`)).map(([, env]) => env));
    if (prefixed.size === 1) return [...prefixed][0]!;
  }
  if (served.length === 1) return served[0]!;
  const message = `${name === undefined ? 'no agent_ref.name' : `agent_ref.name "${name}" names none of the served environments`} (served: ${served.join(', ')}); name one, e.g. "${served[0] ?? 'math'}_simple_agent"`;
  throw new FastApiReply(422, { detail: [valueError([...loc, 'agent_ref'], message, agentRef ?? null)] });
}

/** Sampling from the row's Responses parameters, in the chat completions names the policy takes. */
function samplingOf(params: Record<string, unknown>): Record<string, unknown> {
  const sampling: Record<string, unknown> = {};
  if (typeof params.temperature === 'number') sampling.temperature = params.temperature;
  if (typeof params.top_p === 'number') sampling.top_p = params.top_p;
  if (typeof params.max_output_tokens === 'number') sampling.max_tokens = params.max_output_tokens;
  // NeMo Gym's rollout collection puts a per-rollout seed in metadata.extra_body (a JSON string).
  const extraBody = (params.metadata as { extra_body?: unknown } | null | undefined)?.extra_body;
  if (typeof extraBody === 'string') {
    try {
      const seed = (JSON.parse(extraBody) as { seed?: unknown }).seed;
      if (Number.isInteger(seed)) sampling.seed = seed;
    } catch {
      // not JSON: nothing to take from it
    }
  }
  return sampling;
}

/**
 * The rollout service as a NeMo Gym responses_api_agents server: `POST /run` runs a dataset row
 * through the staged pools and answers simple_agent's verify response; `POST /aggregate_metrics`
 * answers what the environment's resources server would. Both also under `/ng-rollout/<id>/`.
 * Errors are FastAPI's (this face stands in for a Python server).
 */
export function gymAgentApi({ service, options }: ApiContext): OpenAPIHono {
  const app = new OpenAPIHono();
  app.onError(fastApiErrorHandler({ logger: service.logger, httpExceptions: true }));

  const modelFor = (params: Record<string, unknown>): string => {
    const fromBackends = (options.backends?.list() ?? []).map((b) => (b as { model?: unknown }).model).find((m): m is string => typeof m === 'string' && m !== '');
    const model = options.defaultModel ?? (typeof params.model === 'string' && params.model ? params.model : undefined) ?? fromBackends;
    if (model === undefined) {
      const message = 'no model to run: set responses_create_params.model, or start the service with a default model';
      throw new FastApiReply(422, { detail: [valueError(['body', 'responses_create_params', 'model'], message, params.model ?? null)] });
    }
    return model;
  };

  const run = async (c: Context, ngRolloutId: string | undefined) => {
    const { body, value } = await parseFastApiBody(c, GymRunRequest);
    const env = environmentFor(service, value.agent_ref, ['body']);
    const params = body.responses_create_params as Record<string, unknown>;
    const policy = PolicySpec.parse({ model: modelFor(params), sampling: samplingOf(params) });
    // Without a backend the rollout would wait for one: say so now, as a model server that is down would.
    if (options.backends && options.backends.list().length === 0) {
      throw new FastApiReply(503, { detail: 'no LLM backend to run the policy on: add one (POST /v1/llm-backends or /add_llm_server, or --llm)' });
    }
    const rolloutId = ngRolloutId ?? (typeof body._ng_rollout_id === 'string' ? body._ng_rollout_id : undefined);
    const [submitted] = await service.submit([
      {
        // Fresh ids: the same row run again (another collection) is another rollout, not a cached one.
        id: `ng-${randomUUID()}`,
        env,
        row: body as never,
        policy,
        ...(rolloutId !== undefined ? { metadata: { ng_rollout_id: rolloutId } } : {}),
      },
    ]);
    const result = await service.wait(submitted!.rolloutIds[0]!);
    if (result.state !== 'done' || result.response === null) {
      // simple_agent answers 500 when a model call, /seed_session or /verify fails; so does this.
      const cause = result.error ? `${result.error.code}: ${result.error.message}` : result.state;
      throw new RolloutError({ code: 'INTERNAL', message: `rollout ${result.id} failed (${result.critical_error ?? result.state}): ${cause}` });
    }
    const answer = {
      responses_create_params: body.responses_create_params,
      response: result.response,
      reward: result.reward,
      ...(result.reward_components ? { reward_components: result.reward_components } : {}),
      ...result.verify_extras,
    };
    // SimpleAgentVerifyResponse's floats as Python writes them (`"reward": 1.0`): they land in the collected JSONL.
    return fastApiJsonResponse(c, answer, verifyResponseFloats(service.environment(env)?.floatFields));
  };

  const aggregate = async (c: Context) => {
    const { value } = await parseFastApiBody(c, GymAggregateMetricsRequest);
    const entries = value.verify_responses;
    if (entries.length === 0) return c.json({ group_level_metrics: [], agent_metrics: {}, key_metrics: {} });
    const index = Math.max(
      0,
      entries.findIndex((e) => e.agent_ref !== undefined),
    );
    const env = service.environment(environmentFor(service, entries[index]!.agent_ref, ['body', 'verify_responses', index]))!;
    const hooks = { ...(env.metrics ? { metrics: env.metrics } : {}), ...(env.keyMetrics ? { keyMetrics: env.keyMetrics } : {}) };
    return fastApiJsonResponse(c, computeAggregateMetrics(entries as VerifyEntry[], hooks), aggregateMetricsFloats(env.floatFields));
  };

  // The /ng-rollout/<id> prefix as NeMo Gym's RolloutContextMiddleware reads it; an id it would not
  // strip is a 404, as there.
  const prefixed = (handler: (c: Context, id: string) => Promise<Response>, rest: string) => async (c: Context) => {
    const stripped = stripRolloutPrefix(c.req.path);
    if (stripped.rolloutId === undefined || stripped.path !== rest) return c.json(NOT_FOUND_BODY, 404);
    return handler(c, stripped.rolloutId);
  };

  const [runRoute, aggregateRoute] = routes('');
  const [prefixedRun, prefixedAggregate] = routes('/ng-rollout/{rollout_id}');
  // Documented from the schemas the handlers validate with; validated by them (FastAPI's 422s).
  for (const route of [runRoute, aggregateRoute, prefixedRun, prefixedAggregate]) app.openAPIRegistry.registerPath(route!);
  app.post('/run', (c) => run(c, undefined));
  app.post('/aggregate_metrics', aggregate);
  app.post('/ng-rollout/:rollout_id/run', prefixed(run, '/run'));
  app.post(
    '/ng-rollout/:rollout_id/aggregate_metrics',
    prefixed((c) => aggregate(c), '/aggregate_metrics'),
  );
  // FastAPI answers a known path with another method 405 (Starlette's, with its Allow header).
  for (const path of ['/run', '/aggregate_metrics', '/ng-rollout/:rollout_id/run', '/ng-rollout/:rollout_id/aggregate_metrics']) {
    app.all(path, (c) => c.json({ detail: 'Method Not Allowed' }, 405, { allow: 'POST' }));
  }
  return app;
}
