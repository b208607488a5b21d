import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import { RolloutError } from '../errors.ts';
import type { SubmittedTask } from '../service/service.ts';
import { trainingView } from '../protocol/training-view.ts';
import { RolloutState, RolloutTask, RolloutView, SubmitBatch, SubmitRequest, VLLM_SAMPLING_KEYS } from '../protocol/rollout.ts';
import { SamplingStatus } from '../protocol/sampling.ts';
import type { ApiContext } from './context.ts';
import { suggest } from '../errors.ts';
import { parse } from './parse.ts';
import { errorResponses, MaxResponseTokens, Overlong, TrainingView, trainingViewOptions, ViewParam, wantsTrainingView } from './wire.ts';

const NO_BACKEND = 'add one with POST /v1/llm-backends or --llm';

/**
 * Rollouts submitted without a `policy.base_url` while the service has no LLM backend: they wait
 * for one (then fail), so the 202 and `/v1/status` say so while it holds.
 */
export class BackendWarnings {
  readonly #waiting = new Set<string>();

  constructor(private readonly ctx: ApiContext) {}

  #none(): boolean {
    return this.ctx.options.backends !== undefined && this.ctx.options.backends.list().length === 0;
  }

  /** Notes a submission; answers the warnings of its 202. */
  submitted(tasks: readonly RolloutTask[], submitted: readonly SubmittedTask[]): string[] {
    if (!this.#none()) return [];
    // a known task may have finished already: it is checked at the next /v1/status
    const needy = submitted.filter((_, i) => !tasks[i]!.policy.base_url);
    for (const s of needy) for (const id of s.rolloutIds) this.#waiting.add(id);
    if (needy.length === 0) return [];
    const names = needy.map((s) => s.taskId);
    const shown = names.length > 5 ? `${names.slice(0, 5).join(', ')} and ${names.length - 5} more` : names.join(', ');
    return [`no policy backend for task${names.length === 1 ? '' : 's'} ${shown}: the task names no policy.base_url and the service has no LLM backend; ${NO_BACKEND}`];
  }

  /** The warnings of `/v1/status`. */
  async current(): Promise<string[]> {
    for (const id of this.#waiting) {
      const view = await this.ctx.service.get(id);
      if (!view || view.result) this.#waiting.delete(id);
    }
    if (this.#waiting.size === 0 || !this.#none()) return [];
    return [`no policy backend for ${this.#waiting.size} unfinished rollout${this.#waiting.size === 1 ? '' : 's'} that name no policy.base_url: ${NO_BACKEND}`];
  }
}

const Submitted = z
  .strictObject({
    tasks: z.array(
      z.strictObject({
        task_id: z.string(),
        /** n per task: `<task_id>` for n = 1, else `<task_id>:<sample index>`. */
        rollout_ids: z.array(z.string()),
        /** True when the task id was known: nothing new was started. */
        existing: z.boolean(),
      }),
    ),
    /** What will keep these rollouts from running, e.g. no policy backend. */
    warnings: z.array(z.string()),
    /**
     * With `dynamic_sampling`: the sampling as it stands once its first groups are stored (`tasks`
     * lists those; the rest start as groups are judged). Follow it with GET
     * /v1/rollouts/sampling/{id} and its stream.
     */
    sampling: SamplingStatus.optional(),
  })
  .openapi('Submitted');

// types.ts's schemas were made before @hono/zod-openapi extended zod: named with zod's own `.meta({ id })`.
const SubmitBody = z.union([SubmitBatch.meta({ id: 'SubmitBatch' }), RolloutTask.meta({ id: 'RolloutTask' })]).openapi('SubmitRequest');

const submitRoute = createRoute({
  method: 'post',
  path: '/v1/rollouts',
  summary: 'Submit one task or a batch; answers once it is stored with the rollout ids (n per task). A known task id returns what it has.',
  request: { body: { required: true, content: { 'application/json': { schema: SubmitBody } } } },
  responses: {
    202: { description: 'Accepted', content: { 'application/json': { schema: Submitted } } },
    ...errorResponses(400, 401, 404, 409, 422, 503),
  },
});

const ListQuery = z.object({
  cursor: z.string().optional(),
  limit: z.coerce.number().int().positive().max(1_000).optional().openapi({ type: 'integer', minimum: 1, maximum: 1_000, default: 100 }),
  state: RolloutState.optional(),
  task_id: z.string().optional(),
});

const listRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts',
  summary: 'List rollouts in submission order, a page at a time',
  request: { query: ListQuery },
  responses: {
    200: {
      description: 'A page',
      content: { 'application/json': { schema: z.strictObject({ items: z.array(RolloutView), next_cursor: z.string().nullable() }).openapi('RolloutPage') } },
    },
    ...errorResponses(400, 401, 422),
  },
});

const IdParam = z.object({ id: z.string().min(1).openapi({ param: { name: 'id', in: 'path' }, description: 'A rollout id, or a task id for its group' }) });

const TaskRollouts = z
  .strictObject({ task_id: z.string(), rollouts: z.array(RolloutView) })
  .openapi('TaskRollouts', { description: "A task's rollouts (GET or DELETE with a task id)" });

const getRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts/{id}',
  summary: 'One rollout, or for a task id its group; `view=training` gives what a loss needs (finished rollouts only; null for unfinished members of a group)',
  request: { params: IdParam, query: z.object({ view: ViewParam, max_response_tokens: MaxResponseTokens, overlong: Overlong }) },
  responses: {
    200: {
      description: 'The rollout (RolloutView), its task (TaskRollouts), or with `view=training` their training views',
      content: {
        'application/json': {
          schema: z.union([RolloutView, TaskRollouts, TrainingView, z.strictObject({ task_id: z.string(), rollouts: z.array(TrainingView.nullable()) }).openapi('TaskTrainingViews')]),
        },
      },
    },
    ...errorResponses(400, 401, 404, 409, 422),
  },
});

const deleteRoute = createRoute({
  method: 'delete',
  path: '/v1/rollouts/{id}',
  summary: 'Cancel a rollout (or every rollout of a task): it leaves its queue or stage and its sandbox is freed; answers once it has ended (`wait=false`: at once)',
  request: { params: IdParam, query: z.object({ wait: z.enum(['true', 'false']).optional().openapi({ default: 'true' }) }) },
  responses: {
    200: { description: 'The cancelled rollout, or its task', content: { 'application/json': { schema: z.union([RolloutView, TaskRollouts]) } } },
    ...errorResponses(401, 404, 422),
  },
});

const SAMPLING_KEYS = new Set(VLLM_SAMPLING_KEYS);

/**
 * A 422 for a sampling name that is not vLLM's (`temprature`): passed through, a typo would be
 * ignored by the policy server and the run sampled at its defaults. Checked here, on the trainer's
 * route only: ProRL's and NeMo Gym's faces take their clients' knobs as those servers do.
 */
function checkSampling(tasks: readonly RolloutTask[], batch: boolean): void {
  const issues = tasks.flatMap((task, i) => {
    const unknown = Object.keys(task.policy.sampling).filter((key) => !SAMPLING_KEYS.has(key));
    if (unknown.length === 0) return [];
    const path = [...(batch ? ['tasks', i] : []), 'policy', 'sampling'];
    const named = unknown.map((key) => {
      const meant = key === 'n' || key === 'best_of' ? "the task's `n`" : suggest(key, VLLM_SAMPLING_KEYS);
      return `"${key}"${meant ? ` (did you mean ${meant.startsWith('the') ? meant : `"${meant}"`}?)` : ''}`;
    });
    return [{ code: 'unrecognized_keys', keys: unknown, path, message: `not a sampling parameter: ${named.join(', ')}; the names taken are vLLM's SamplingParams and its OpenAI server's extras` }];
  });
  if (issues.length === 0) return;
  const message = issues.map((issue) => `${issue.message}\n  → at ${issue.path.join('.')}`).join('\n');
  throw new RolloutError({ code: 'UNPROCESSABLE', message: `✖ ${message}`, details: issues });
}

/** POST/GET/DELETE /v1/rollouts[/:id]. */
export function rolloutsApi({ service }: ApiContext, warnings: BackendWarnings): OpenAPIHono {
  const app = new OpenAPIHono();

  // The 202 comes once the batch is stored (a restart runs it), before any of its work starts.
  app.openapi(
    submitRoute,
    async (c) => {
      const request = c.req.valid('json');
      // the batch's staleness bound is each task's that names none
      const bound = 'tasks' in request ? request.staleness : undefined;
      const tasks = 'tasks' in request ? (bound ? request.tasks.map((task) => (task.staleness ? task : { ...task, staleness: bound })) : request.tasks) : [request];
      checkSampling(tasks, 'tasks' in request);
      const dynamic = 'tasks' in request ? request.dynamic_sampling : undefined;
      const started = dynamic ? await service.sample(tasks, dynamic) : undefined;
      const submitted = started ? started.submitted : await service.submit(tasks);
      // a sampling's warnings are of the tasks it started
      const startedTasks = started ? started.submitted.map((s) => s.task) : tasks;
      return c.json(
        {
          tasks: submitted.map((t) => ({ task_id: t.taskId, rollout_ids: t.rolloutIds, existing: t.existing })),
          warnings: warnings.submitted(startedTasks, submitted),
          ...(started ? { sampling: started.sampling.status() } : {}),
        },
        202,
      );
    },
    // one schema or the other by shape, so that an error names the field, not "no union member"
    (result): undefined => {
      if (result.success) return;
      const raw = (result as { data?: unknown }).data; // zod-validator passes the value it checked
      parse(typeof raw === 'object' && raw !== null && 'tasks' in raw ? SubmitBatch : RolloutTask, raw);
      parse(SubmitRequest, raw); // not reached: one of them failed
    },
  );

  app.openapi(listRoute, async (c) => {
    const query = c.req.valid('query');
    const page = await service.list({
      ...(query.cursor ? { cursor: query.cursor } : {}),
      ...(query.limit ? { limit: query.limit } : {}),
      ...(query.state ? { state: query.state } : {}),
      ...(query.task_id ? { taskId: query.task_id } : {}),
    });
    return c.json({ items: page.items, next_cursor: page.nextCursor }, 200);
  });

  app.openapi(getRoute, async (c) => {
    const { id } = c.req.valid('param');
    const query = c.req.valid('query');
    const training = wantsTrainingView(query.view);
    const viewOptions = trainingViewOptions(training, query);
    const view = await service.get(id);
    if (view) {
      if (!training) return c.json(view, 200);
      if (!view.result) throw new RolloutError({ code: 'CONFLICT', message: `rollout "${id}" has not finished (state ${view.state})`, retryable: true });
      return c.json(trainingView(view.result, viewOptions), 200);
    }
    const members = await service.taskRollouts(id);
    if (!members) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout or task "${id}"` });
    const views = await Promise.all(members.map(async (m) => (await service.get(m))!));
    if (!training) return c.json({ task_id: id, rollouts: views }, 200);
    return c.json({ task_id: id, rollouts: views.map((v) => (v.result ? trainingView(v.result, viewOptions) : null)) }, 200);
  });

  app.openapi(deleteRoute, async (c) => {
    const { id } = c.req.valid('param');
    const ids = (await service.taskRollouts(id)) ?? [id];
    await Promise.all(ids.map((m) => service.cancel(m)));
    if (c.req.valid('query').wait !== 'false') await Promise.all(ids.map((m) => service.wait(m)));
    const views = await Promise.all(ids.map(async (m) => (await service.get(m))!));
    if (ids.length === 1) return c.json(views[0]!, 200);
    return c.json({ task_id: id, rollouts: views }, 200);
  });

  return app;
}
