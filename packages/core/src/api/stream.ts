import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import type { HttpBindings } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { Context } from 'hono';
import { stream, streamSSE } from 'hono/streaming';
import { RolloutError } from '../errors.ts';
import type { RolloutService } from '../service/service.ts';
import { RolloutGroup, RolloutResult } from '../protocol/rollout.ts';
import type { ApiContext } from './context.ts';
import { trainingView } from '../protocol/training-view.ts';
import { errorResponses, toTrainingGroup, TrainingGroup, TrainingView, ViewParam, wantsTrainingView } from './wire.ts';

const Format = z
  .string()
  .optional()
  .openapi({ enum: ['ndjson', 'sse'], description: 'NDJSON by default, SSE with `sse` or `Accept: text/event-stream`' });

const streamRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts/stream',
  summary:
    'Results as they complete: NDJSON (default) or SSE (`format=sse` or Accept: text/event-stream). With `ids`, the stream includes those already finished and ends when all are.',
  request: { query: z.object({ ids: z.string().optional().openapi({ description: 'Comma-separated rollout or task ids' }), format: Format, view: ViewParam }) },
  responses: {
    200: {
      description: 'One RolloutResult (with `view=training`: one TrainingView) per line (NDJSON) or per `result` event (SSE; an `end` event closes it)',
      content: { 'application/x-ndjson': { schema: z.union([RolloutResult, TrainingView]) }, 'text/event-stream': { schema: z.string() } },
    },
    ...errorResponses(400, 401, 404, 422),
  },
});

const groupsRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts/groups/stream',
  summary:
    'Whole groups as they complete: each task once all its samples have finished, advantages and credit filled. NDJSON (default) or SSE; ends when every task named was sent.',
  request: { query: z.object({ ids: z.string().min(1).openapi({ description: 'Comma-separated task ids' }), format: Format, view: ViewParam }) },
  responses: {
    200: {
      description: 'One RolloutGroup (with `view=training`: its results as TrainingViews) per line (NDJSON) or per `group` event (SSE; an `end` event closes it)',
      content: { 'application/x-ndjson': { schema: z.union([RolloutGroup, TrainingGroup]) }, 'text/event-stream': { schema: z.string() } },
    },
    ...errorResponses(400, 401, 404, 422),
  },
});

function formatOf(c: Context, query: string | undefined): 'ndjson' | 'sse' {
  const format = query ?? (c.req.header('accept')?.includes('text/event-stream') ? 'sse' : 'ndjson');
  if (format !== 'sse' && format !== 'ndjson') throw new RolloutError({ code: 'BAD_REQUEST', message: 'format is sse or ndjson' });
  return format;
}

/** Waits for `wake` or the abort, whichever comes first. */
type Waiter = { wait(): Promise<void>; wake(): void };
function waiter(): Waiter {
  let resolve: (() => void) | undefined;
  return {
    wait: () => new Promise<void>((r) => (resolve = r)).then(() => void (resolve = undefined)),
    wake: () => resolve?.(),
  };
}

/** Node's own response when @hono/node-server serves the app (absent under `app.request`). */
function nodeResponse(c: Context): ServerResponse | undefined {
  return (c.env as Partial<HttpBindings> | undefined)?.outgoing;
}

/**
 * Aborted when the client goes away. Served by Node, from the response's own 'close':
 * `c.req.raw.signal` would build a web Request (a ReadableStream of the body, an AbortController).
 */
function clientGone(c: Context): AbortSignal {
  const outgoing = nodeResponse(c);
  if (!outgoing) return c.req.raw.signal;
  const controller = new AbortController();
  // (after a response that was sent whole there is no one to tell, nor an error to make)
  outgoing.once('close', () => {
    if (!outgoing.writableFinished) controller.abort(new Error('Client connection prematurely closed.'));
  });
  return controller.signal;
}

/**
 * NDJSON written straight to Node's response: a line per result, the last one ending the response
 * in the same write as its headers when nothing was sent yet (a rollout's stream opened after it
 * finished is one write). Through hono's `stream()` each line went through a TransformStream and
 * @hono/node-server's reader, which waits a timer for a second chunk before sending the headers.
 */
async function ndjsonToNode(outgoing: ServerResponse, pump: (write: (line: string, last: boolean) => Promise<void>) => Promise<void>, aborted: AbortSignal): Promise<void> {
  outgoing.writeHead(200, { 'content-type': 'application/x-ndjson' });
  try {
    await pump(async (line, last) => {
      if (outgoing.destroyed) return;
      if (last) outgoing.end(line);
      else if (!outgoing.write(line)) await once(outgoing, 'drain', { signal: aborted }).catch(() => undefined);
    });
    if (!outgoing.destroyed && !outgoing.writableEnded) outgoing.end();
  } catch (error) {
    outgoing.destroy(error as Error);
  }
}

/** Results of `wanted` (all results when empty) as they complete; ends once all of `wanted` were written. */
async function pumpResults(service: RolloutService, wanted: Set<string>, write: (result: RolloutResult, last: boolean) => Promise<void>, aborted: AbortSignal): Promise<void> {
  const queue: RolloutResult[] = [];
  const signal = waiter();
  const unsubscribe = service.onResult((result) => {
    if (wanted.size === 0 || wanted.has(result.id)) {
      queue.push(result);
      signal.wake();
    }
  });
  // One abort listener for the stream's life, not one per wait.
  aborted.addEventListener('abort', signal.wake, { once: true });
  try {
    for (const done of (await service.results([...wanted])).values()) queue.push(done);
    const remaining = new Set(wanted);
    while (!aborted.aborted) {
      const next = queue.shift();
      if (!next) {
        await signal.wait();
        continue;
      }
      if (!remaining.delete(next.id) && wanted.size > 0) continue;
      const last = wanted.size > 0 && remaining.size === 0;
      await write(next, last);
      if (last) return;
    }
  } finally {
    aborted.removeEventListener('abort', signal.wake);
    unsubscribe();
  }
}

/** Each task of `tasks` once all its samples have finished. */
async function pumpGroups(
  service: RolloutService,
  tasks: Map<string, string[]>,
  write: (group: RolloutGroup, last: boolean) => Promise<void>,
  aborted: AbortSignal,
): Promise<void> {
  const byRollout = new Map<string, string>();
  for (const [taskId, members] of tasks) for (const member of members) byRollout.set(member, taskId);
  const ready: string[] = [];
  const signal = waiter();
  // the members of each task still unfinished
  const open = new Map<string, Set<string>>([...tasks].map(([taskId, members]) => [taskId, new Set(members)]));
  const finished = (id: string) => {
    const taskId = byRollout.get(id);
    const members = taskId === undefined ? undefined : open.get(taskId);
    if (!members || !members.delete(id) || members.size > 0) return;
    open.delete(taskId!);
    ready.push(taskId!);
    signal.wake();
  };
  const unsubscribe = service.onResult((result) => finished(result.id));
  aborted.addEventListener('abort', signal.wake, { once: true });
  try {
    for (const id of (await service.results([...byRollout.keys()])).keys()) finished(id);
    while (!aborted.aborted && tasks.size > 0) {
      const taskId = ready.shift();
      if (taskId === undefined) {
        await signal.wait();
        continue;
      }
      const members = tasks.get(taskId);
      if (members === undefined) continue; // sent already
      tasks.delete(taskId);
      // read back from the store: the group's credit was added when its last sample was stored
      const stored = await service.results(members);
      const results = members.map((id) => stored.get(id)!);
      await write({ task_id: taskId, results }, tasks.size === 0);
    }
  } finally {
    aborted.removeEventListener('abort', signal.wake);
    unsubscribe();
  }
}

/**
 * Answers with what `pump` emits, each item in its wire shape: NDJSON straight to Node's response
 * when served by Node (else through hono's stream), or SSE events closed by an `end` event.
 */
function send<T>(
  c: Context,
  format: 'ndjson' | 'sse',
  aborted: AbortSignal,
  shape: { event: string; id: (item: T) => string; wire: (item: T) => unknown },
  pump: (emit: (item: T, last: boolean) => Promise<void>) => Promise<void>,
): Response {
  const outgoing = nodeResponse(c);
  if (format === 'ndjson' && outgoing) {
    void ndjsonToNode(outgoing, (write) => pump((item, last) => write(`${JSON.stringify(shape.wire(item))}\n`, last)), aborted);
    return RESPONSE_ALREADY_SENT;
  }
  if (format === 'sse') {
    return streamSSE(c, async (sse) => {
      await pump((item) => sse.writeSSE({ event: shape.event, id: shape.id(item), data: JSON.stringify(shape.wire(item)) }));
      await sse.writeSSE({ event: 'end', data: '{}' });
    });
  }
  c.header('content-type', 'application/x-ndjson');
  return stream(c, async (s) => {
    await pump((item) => s.write(`${JSON.stringify(shape.wire(item))}\n`).then(() => undefined));
  });
}

/** GET /v1/rollouts/stream and /v1/rollouts/groups/stream (NDJSON or SSE). */
export function streamApi({ service }: ApiContext): OpenAPIHono {
  const app = new OpenAPIHono();

  // `ids` (rollout or task ids) narrows the stream and ends it once all of them are finished,
  // results already finished included.
  app.openapi(streamRoute, async (c) => {
    const query = c.req.valid('query');
    const format = formatOf(c, query.format);
    const wire = wantsTrainingView(query.view) ? trainingView : (result: RolloutResult) => result;
    const wanted = new Set<string>();
    for (const id of (query.ids ?? '').split(',').filter(Boolean)) {
      const members = (await service.taskRollouts(id)) ?? ((await service.get(id)) ? [id] : undefined);
      if (!members) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout or task "${id}"` });
      members.forEach((m) => wanted.add(m));
    }
    const aborted = clientGone(c);
    return send(c, format, aborted, { event: 'result', id: (result) => result.id, wire }, (emit) => pumpResults(service, wanted, emit, aborted));
  });

  // Whole groups, with the group's advantages and credit filled in (what a GRPO/GTPO trainer consumes).
  app.openapi(groupsRoute, async (c) => {
    const query = c.req.valid('query');
    const format = formatOf(c, query.format);
    const wire = wantsTrainingView(query.view) ? toTrainingGroup : (group: RolloutGroup) => group;
    const tasks = new Map<string, string[]>();
    for (const id of query.ids.split(',').filter(Boolean)) {
      const members = await service.taskRollouts(id);
      if (!members) throw new RolloutError({ code: 'NOT_FOUND', message: `no task "${id}"` });
      tasks.set(id, members);
    }
    if (tasks.size === 0) throw new RolloutError({ code: 'UNPROCESSABLE', message: 'ids: the task ids whose groups to stream' });
    const aborted = clientGone(c);
    return send(c, format, aborted, { event: 'group', id: (group) => group.task_id, wire }, (emit) => pumpGroups(service, tasks, emit, aborted));
  });

  return app;
}
