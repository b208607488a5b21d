import { Hono } from 'hono';
import { bearerAuth } from 'hono/bearer-auth';
import { HTTPException } from 'hono/http-exception';
import { stream, streamSSE } from 'hono/streaming';
import { z } from 'zod';
import { RolloutError } from '../errors.ts';
import { checkToken } from '../gym/bind-policy.ts';
import type { RolloutApiOptions } from './api/context.ts';
import { gymAgentApi } from './api/gym-agent.ts';
import { body, parse } from './api/parse.ts';
import { ProcessRequest, prorlApi } from './api/prorl.ts';
import { rolloutOpenApi } from './openapi.ts';
import type { RolloutService } from './service.ts';
import { trainingView } from './training-view.ts';
import { RolloutTask, SubmitBatch, type RolloutResult, type RolloutState } from './types.ts';

export type { BackendRegistry, RolloutApiOptions } from './api/context.ts';

const AddBackend = z.strictObject({
  id: z.string().min(1).optional(),
  base_url: z.url(),
  model: z.string().optional(),
  api_key: z.string().optional(),
  max_concurrency: z.number().int().positive().optional(),
});

const ListQuery = z.object({
  cursor: z.string().optional(),
  limit: z.coerce.number().int().positive().max(1_000).optional(),
  state: z.enum(['queued', 'init', 'run', 'eval', 'done', 'failed', 'cancelled']).optional(),
  task_id: z.string().optional(),
});

/**
 * The rollout service's HTTP API (JSON; results also as NDJSON or SSE streams). Every error body
 * is `{"error": {code, message, retryable, details?}}`, built from RolloutError.
 */
export function createRolloutApi(service: RolloutService, options: RolloutApiOptions = {}): Hono {
  const app = new Hono();

  app.onError((error, c) => {
    if (error instanceof HTTPException) return error.getResponse(); // bearerAuth's 401
    const wrapped = RolloutError.from(error);
    if (wrapped.status >= 500) service.logger.error({ err: error, path: c.req.path }, 'request failed');
    return c.json(wrapped.toJSON(), wrapped.status as 500);
  });
  app.notFound((c) => c.json(new RolloutError({ code: 'NOT_FOUND', message: `no route ${c.req.method} ${c.req.path}` }).toJSON(), 404));

  app.get('/health', (c) => c.json({ status: 'ok' }));
  const openapi = rolloutOpenApi({ addBackend: AddBackend, process: ProcessRequest });
  app.get('/openapi.json', (c) => c.json(openapi));
  // Routes registered above (/health, /openapi.json) answer before this runs.
  if (options.token) {
    // A 401 for a malformed header too (bearerAuth's own is a 400), as before.
    const body = JSON.stringify(new RolloutError({ code: 'UNAUTHORIZED', message: 'a valid bearer token is required' }).toJSON());
    const unauthorized = () => new Response(body, { status: 401, headers: { 'content-type': 'application/json' } });
    app.use(
      '*',
      bearerAuth({
        token: checkToken(options.token),
        noAuthenticationHeader: { message: unauthorized },
        invalidAuthenticationHeader: { message: unauthorized },
        invalidToken: { message: unauthorized },
      }),
    );
  }

  // The 202 comes once the batch is journaled (a restart runs it), before any of its work starts.
  app.post('/v1/rollouts', async (c) => {
    const raw = await body(c);
    // one schema or the other by shape, so that an error names the field, not "no union member"
    const request = typeof raw === 'object' && raw !== null && 'tasks' in raw ? parse(SubmitBatch, raw) : parse(RolloutTask, raw);
    const tasks = 'tasks' in request ? request.tasks : [request];
    const submitted = await service.submit(tasks);
    return c.json({ tasks: submitted.map((t) => ({ task_id: t.taskId, rollout_ids: t.rolloutIds, existing: t.existing })) }, 202);
  });

  app.get('/v1/rollouts', (c) => {
    const query = parse(ListQuery, c.req.query());
    const page = service.list({
      ...(query.cursor ? { cursor: query.cursor } : {}),
      ...(query.limit ? { limit: query.limit } : {}),
      ...(query.state ? { state: query.state as RolloutState } : {}),
      ...(query.task_id ? { taskId: query.task_id } : {}),
    });
    return c.json({ items: page.items, next_cursor: page.nextCursor });
  });

  // A stream of results as they complete. `ids` (comma-separated rollout or task ids) narrows it
  // and ends it once all of them are finished, results already finished included.
  app.get('/v1/rollouts/stream', (c) => {
    const format = c.req.query('format') ?? (c.req.header('accept')?.includes('text/event-stream') ? 'sse' : 'ndjson');
    if (format !== 'sse' && format !== 'ndjson') throw new RolloutError({ code: 'BAD_REQUEST', message: 'format is sse or ndjson' });
    const wanted = new Set<string>();
    for (const id of (c.req.query('ids') ?? '').split(',').filter(Boolean)) {
      const members = service.taskRollouts(id) ?? (service.get(id) ? [id] : undefined);
      if (!members) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout or task "${id}"` });
      members.forEach((m) => wanted.add(m));
    }
    const pump = async (write: (result: RolloutResult) => Promise<void>, aborted: AbortSignal) => {
      const queue: RolloutResult[] = [];
      let wake: (() => void) | undefined;
      const unsubscribe = service.onResult((result) => {
        if (wanted.size === 0 || wanted.has(result.id)) {
          queue.push(result);
          wake?.();
        }
      });
      try {
        for (const id of wanted) {
          const done = service.get(id)?.result;
          if (done) queue.push(done);
        }
        const remaining = new Set(wanted);
        // One abort listener for the stream's life, not one per wait.
        const onAbort = () => wake?.();
        aborted.addEventListener('abort', onAbort, { once: true });
        try {
          while (!aborted.aborted) {
            const next = queue.shift();
            if (next) {
              if (!remaining.delete(next.id) && wanted.size > 0) continue;
              await write(next);
              if (wanted.size > 0 && remaining.size === 0) return;
              continue;
            }
            await new Promise<void>((resolve) => (wake = resolve));
            wake = undefined;
          }
        } finally {
          aborted.removeEventListener('abort', onAbort);
        }
      } finally {
        unsubscribe();
      }
    };
    const aborted = c.req.raw.signal;
    if (format === 'sse') {
      return streamSSE(c, async (sse) => {
        await pump((result) => sse.writeSSE({ event: 'result', id: result.id, data: JSON.stringify(result) }), aborted);
        await sse.writeSSE({ event: 'end', data: '{}' });
      });
    }
    c.header('content-type', 'application/x-ndjson');
    return stream(c, async (s) => {
      await pump((result) => s.write(`${JSON.stringify(result)}\n`).then(() => undefined), aborted);
    });
  });

  // Whole groups: `ids` are task ids; each task comes once all its samples have finished, with
  // the group's advantages and credit filled in (what a GRPO/GTPO trainer consumes).
  app.get('/v1/rollouts/groups/stream', (c) => {
    const format = c.req.query('format') ?? (c.req.header('accept')?.includes('text/event-stream') ? 'sse' : 'ndjson');
    if (format !== 'sse' && format !== 'ndjson') throw new RolloutError({ code: 'BAD_REQUEST', message: 'format is sse or ndjson' });
    const tasks = new Map<string, string[]>();
    for (const id of (c.req.query('ids') ?? '').split(',').filter(Boolean)) {
      const members = service.taskRollouts(id);
      if (!members) throw new RolloutError({ code: 'NOT_FOUND', message: `no task "${id}"` });
      tasks.set(id, members);
    }
    if (tasks.size === 0) throw new RolloutError({ code: 'BAD_REQUEST', message: 'ids: the task ids whose groups to stream' });
    const byRollout = new Map<string, string>();
    for (const [taskId, members] of tasks) for (const member of members) byRollout.set(member, taskId);
    const pump = async (write: (group: { taskId: string; results: RolloutResult[] }) => Promise<void>, aborted: AbortSignal) => {
      const ready: string[] = [];
      let wake: (() => void) | undefined;
      const whole = (taskId: string) => tasks.get(taskId)!.every((id) => service.get(id)?.result);
      const unsubscribe = service.onResult((result) => {
        const taskId = byRollout.get(result.id);
        if (taskId !== undefined && whole(taskId)) {
          ready.push(taskId);
          wake?.();
        }
      });
      const onAbort = () => wake?.();
      aborted.addEventListener('abort', onAbort, { once: true });
      try {
        for (const taskId of tasks.keys()) if (whole(taskId)) ready.push(taskId);
        while (!aborted.aborted && tasks.size > 0) {
          const taskId = ready.shift();
          if (taskId === undefined) {
            await new Promise<void>((resolve) => (wake = resolve));
            wake = undefined;
            continue;
          }
          const members = tasks.get(taskId);
          if (members === undefined) continue; // sent already
          tasks.delete(taskId);
          await write({ taskId, results: members.map((id) => service.get(id)!.result!) });
        }
      } finally {
        aborted.removeEventListener('abort', onAbort);
        unsubscribe();
      }
    };
    const aborted = c.req.raw.signal;
    if (format === 'sse') {
      return streamSSE(c, async (sse) => {
        await pump((group) => sse.writeSSE({ event: 'group', id: group.taskId, data: JSON.stringify(group) }), aborted);
        await sse.writeSSE({ event: 'end', data: '{}' });
      });
    }
    c.header('content-type', 'application/x-ndjson');
    return stream(c, async (s) => {
      await pump((group) => s.write(`${JSON.stringify(group)}\n`).then(() => undefined), aborted);
    });
  });

  app.get('/v1/rollouts/:id', (c) => {
    const id = c.req.param('id');
    const viewName = c.req.query('view');
    if (viewName !== undefined && viewName !== 'training') throw new RolloutError({ code: 'BAD_REQUEST', message: `view is "training" or omitted, not "${viewName}"` });
    // ?view=training: what a loss needs (training-view.ts); a task id gives its finished samples' views.
    const training = (rolloutId: string) => {
      const result = service.get(rolloutId)?.result;
      return result ? trainingView(result) : null;
    };
    const view = service.get(id);
    if (view) {
      if (viewName !== 'training') return c.json(view);
      if (!view.result) throw new RolloutError({ code: 'CONFLICT', message: `rollout "${id}" has not finished (state ${view.state})`, retryable: true });
      return c.json(trainingView(view.result));
    }
    const members = service.taskRollouts(id);
    if (members) return c.json({ task_id: id, rollouts: members.map((m) => (viewName === 'training' ? training(m) : service.get(m))) });
    throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout or task "${id}"` });
  });

  app.delete('/v1/rollouts/:id', async (c) => {
    const id = c.req.param('id');
    const ids = service.taskRollouts(id) ?? [id];
    const views = ids.map((m) => service.cancel(m));
    if (c.req.query('wait') !== 'false') await Promise.all(ids.map((m) => service.wait(m)));
    return c.json(ids.length === 1 ? service.get(ids[0]!) : { task_id: id, rollouts: views.map((v) => service.get(v.id)) });
  });

  app.get('/v1/status', (c) => c.json({ ...service.status(), environments: service.environments, llm_backends: options.backends?.list() ?? [] }));

  app.get('/metrics', async (c) => {
    c.header('content-type', service.metrics.registry.contentType);
    return c.body(await service.metrics.registry.metrics());
  });

  app.get('/v1/llm-backends', (c) => c.json({ backends: options.backends?.list() ?? [] }));
  app.post('/v1/llm-backends', async (c) => {
    if (!options.backends) throw new RolloutError({ code: 'NOT_FOUND', message: 'this service manages no LLM backends' });
    const request = parse(AddBackend, await body(c));
    const added = options.backends.add({
      baseUrl: request.base_url,
      ...(request.id ? { id: request.id } : {}),
      ...(request.model ? { model: request.model } : {}),
      ...(request.api_key ? { apiKey: request.api_key } : {}),
      ...(request.max_concurrency ? { maxConcurrency: request.max_concurrency } : {}),
    });
    return c.json({ id: added.id }, 201);
  });
  app.delete('/v1/llm-backends/:id', (c) => {
    if (!options.backends?.remove(c.req.param('id'))) {
      throw new RolloutError({ code: 'NOT_FOUND', message: `no LLM backend "${c.req.param('id')}"` });
    }
    return c.json({ removed: c.req.param('id') });
  });

  app.route('/', prorlApi({ service, options }));
  app.route('/', gymAgentApi({ service, options }));

  return app;
}
