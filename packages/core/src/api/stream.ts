import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import type { HttpBindings } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import type { Context } from 'hono';
import { stream } from 'hono/streaming';
import { RolloutError } from '../errors.ts';
import type { RolloutService, Sampling } from '../service/service.ts';
import { SamplingStatus } from '../protocol/sampling.ts';
import { SamplingIdParam, unknownSampling } from './sampling.ts';
import { RolloutGroup, RolloutResult, StalenessBound } from '../protocol/rollout.ts';
import { DEFAULT_STREAM_KEEP_ALIVE_MS, type ApiContext } from './context.ts';
import { trainingView } from '../protocol/training-view.ts';
import { errorResponses, MaxResponseTokens, Overlong, toTrainingGroup, TrainingGroup, TrainingView, trainingViewOptions, ViewParam, wantsTrainingView, type ViewKnobs } from './wire.ts';

const Format = z
  .string()
  .optional()
  .openapi({ enum: ['ndjson', 'sse'], description: 'NDJSON by default, SSE with `sse` or `Accept: text/event-stream`' });

const Ids = z.string().openapi({ description: 'Comma-separated rollout or task ids (a long list: POST the ids in a JSON body instead; a query string has a size limit)' });

/** The ids in a JSON body: as many as the body limit takes (a query string is cut at 16 KiB of headers). */
const StreamRequest = z
  .strictObject({
    ids: z.array(z.string().min(1)).min(1).openapi({ description: 'Rollout or task ids (a task id stands for all its samples)' }),
    format: z.enum(['ndjson', 'sse']).optional().openapi({ description: 'NDJSON by default, SSE with `sse` or `Accept: text/event-stream`' }),
    view: ViewParam,
    max_response_tokens: MaxResponseTokens,
    overlong: Overlong,
    /** A staleness bound judged as each result is sent (see StalenessBound): `flag` marks it `stale`, `filter` leaves it out. */
    staleness: StalenessBound.optional(),
  })
  .openapi('StreamRequest');

/** The stream's staleness bound in a query: `max_staleness=k` and `stale=flag|filter`. */
const StalenessQuery = {
  max_staleness: z
    .string()
    .regex(/^\d{1,9}$/, 'max_staleness: a whole number of versions')
    .optional()
    .openapi({ description: 'A staleness bound: a sample whose oldest turn is more than this many weight versions behind the newest announced is stale' }),
  stale: z
    .enum(['flag', 'filter'])
    .optional()
    .openapi({ description: 'With max_staleness: flag (the default) sends a stale sample with `stale: true`; filter leaves it out of the stream' }),
};

function boundOf(query: { max_staleness?: string | undefined; stale?: 'flag' | 'filter' | undefined }): StalenessBound | undefined {
  if (query.max_staleness === undefined) {
    if (query.stale !== undefined) throw new RolloutError({ code: 'UNPROCESSABLE', message: 'stale: given only with max_staleness' });
    return undefined;
  }
  return { max_versions: Number(query.max_staleness), action: query.stale ?? 'flag' };
}

/**
 * A stream's judge of staleness: a result as it is sent (flagged `stale` when it is), or null
 * when the bound filters it out. A result its task's bound already judged stale stays so.
 */
function staleJudge(service: RolloutService, bound: StalenessBound | undefined): (result: RolloutResult) => RolloutResult | null {
  if (!bound) return (result) => result;
  return (result) => {
    const newest = service.newestWeightVersion;
    const oldest = result.weight_version_min;
    const stale = result.stale || (newest !== null && oldest !== null && newest - oldest > bound.max_versions);
    if (!stale) return result;
    return bound.action === 'filter' ? null : result.stale ? result : { ...result, stale: true };
  };
}

const KEEP_ALIVE =
  'The headers are sent at once, before any result; an idle stream gets a keep-alive after 15 s of silence: an empty line in NDJSON (skip blank lines), a `: keep-alive` comment in SSE.';
const RESULTS_200 = {
  description: `One RolloutResult (with \`view=training\`: one TrainingView) per line (NDJSON) or per \`result\` event (SSE; an \`end\` event closes it). ${KEEP_ALIVE}`,
  content: { 'application/x-ndjson': { schema: z.union([RolloutResult, TrainingView]) }, 'text/event-stream': { schema: z.string() } },
};
const GROUPS_200 = {
  description: `One RolloutGroup (with \`view=training\`: its results as TrainingViews) per line (NDJSON) or per \`group\` event (SSE; an \`end\` event closes it). ${KEEP_ALIVE}`,
  content: { 'application/x-ndjson': { schema: z.union([RolloutGroup, TrainingGroup]) }, 'text/event-stream': { schema: z.string() } },
};

const streamRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts/stream',
  summary:
    'Results as they complete: NDJSON (default) or SSE (`format=sse` or Accept: text/event-stream). With `ids`, the stream includes those already finished and ends when all are.',
  request: { query: z.object({ ids: Ids.optional(), format: Format, view: ViewParam, max_response_tokens: MaxResponseTokens, overlong: Overlong, ...StalenessQuery }) },
  responses: { 200: RESULTS_200, ...errorResponses(400, 401, 404, 422) },
});

const streamPostRoute = createRoute({
  method: 'post',
  path: '/v1/rollouts/stream',
  summary: 'As GET /v1/rollouts/stream with `ids`, the ids in a JSON body: any number of them (a trainer streaming thousands of rollouts)',
  request: { body: { required: true, content: { 'application/json': { schema: StreamRequest } } } },
  responses: { 200: RESULTS_200, ...errorResponses(400, 401, 404, 422) },
});

const groupsRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts/groups/stream',
  summary:
    'Whole groups as they complete: each task once all its samples have finished, advantages and credit filled. NDJSON (default) or SSE; ends when every task named was sent.',
  request: {
    query: z.object({ ids: Ids.min(1).openapi({ description: 'Comma-separated task ids (many: POST them)' }), format: Format, view: ViewParam, max_response_tokens: MaxResponseTokens, overlong: Overlong, ...StalenessQuery }),
  },
  responses: { 200: GROUPS_200, ...errorResponses(400, 401, 404, 422) },
});

const groupsPostRoute = createRoute({
  method: 'post',
  path: '/v1/rollouts/groups/stream',
  summary: 'As GET /v1/rollouts/groups/stream, the task ids in a JSON body: any number of them',
  request: { body: { required: true, content: { 'application/json': { schema: StreamRequest } } } },
  responses: { 200: GROUPS_200, ...errorResponses(400, 401, 404, 422) },
});

const SAMPLED_200 = {
  description: `The sampling's kept groups as they are kept, one RolloutGroup (with \`view=training\`: its results as TrainingViews) per line (NDJSON) or \`group\` event (SSE), then once it ends one \`{"sampling": SamplingStatus}\` line (SSE: a \`sampling\` event, then \`end\`) with its final counts. ${KEEP_ALIVE}`,
  content: {
    'application/x-ndjson': { schema: z.union([RolloutGroup, TrainingGroup, z.strictObject({ sampling: SamplingStatus }).openapi('SamplingEnd')]) },
    'text/event-stream': { schema: z.string() },
  },
};

const sampledRoute = createRoute({
  method: 'get',
  path: '/v1/rollouts/sampling/{id}/stream',
  summary:
    "A dynamic sampling's informative groups as they are kept (at most `groups`), advantages and credit filled, then its final counts; groups dropped or cancelled are not sent (readable by id). NDJSON (default) or SSE.",
  request: { params: SamplingIdParam, query: z.object({ format: Format, view: ViewParam, max_response_tokens: MaxResponseTokens, overlong: Overlong }) },
  responses: { 200: SAMPLED_200, ...errorResponses(400, 401, 404, 422) },
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

/** What a stream's writer is told by its pump. */
interface Sink<T> {
  /** Writes one item; `last`: the stream ends with it. */
  emit(item: T, last: boolean): Promise<void>;
  /** Nothing to send for now: the pump waits for the next result. */
  idle(): void;
}

/** How one format frames an item, a keep-alive and the end. */
interface Framing {
  contentType: string;
  item(event: string, id: string, data: string): string;
  keepAlive: string;
  end: string;
}
const NDJSON: Framing = { contentType: 'application/x-ndjson', item: (_event, _id, data) => `${data}\n`, keepAlive: '\n', end: '' };
const SSE: Framing = {
  contentType: 'text/event-stream',
  // in the order hono's writeSSE wrote them
  item: (event, id, data) => `event: ${event}\ndata: ${data}\nid: ${id}\n\n`,
  keepAlive: ': keep-alive\n\n',
  end: 'event: end\ndata: {}\n\n',
};

/**
 * A stream written straight to Node's response. The last item ends the response in the same write
 * as its headers when nothing was sent yet (a rollout's stream opened after it finished is one
 * write); else the headers go out as soon as the pump first has nothing to send, so that a client
 * that opens the stream before it submits is answered at once, and an idle stream gets a
 * keep-alive every `keepAliveMs` (proxies and clients drop connections silent for long). Through
 * hono's `stream()` each line went through a TransformStream and @hono/node-server's reader, which
 * waits for a first chunk before sending the headers.
 */
async function toNode(
  outgoing: ServerResponse,
  framing: Framing,
  keepAliveMs: number,
  pump: (write: (chunk: string, last: boolean) => Promise<void>, idle: () => void) => Promise<void>,
  aborted: AbortSignal,
): Promise<void> {
  // no-cache and no proxy buffering: each line is meant to arrive when written
  outgoing.writeHead(200, { 'content-type': framing.contentType, 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
  // (`headersSent` is true from writeHead on, before a byte went out: this says whether they did)
  let flushed = false;
  let sentAt = 0;
  const keepAlive = setInterval(() => {
    if (!flushed || outgoing.destroyed || outgoing.writableEnded || outgoing.writableNeedDrain) return;
    if (Date.now() - sentAt >= keepAliveMs) {
      outgoing.write(framing.keepAlive);
      sentAt = Date.now();
    }
  }, keepAliveMs);
  keepAlive.unref();
  try {
    await pump(
      async (chunk, last) => {
        if (outgoing.destroyed) return;
        flushed = true;
        sentAt = Date.now();
        if (last) outgoing.end(chunk + framing.end);
        else if (!outgoing.write(chunk)) await once(outgoing, 'drain', { signal: aborted }).catch(() => undefined);
      },
      () => {
        if (!flushed && !outgoing.destroyed) {
          outgoing.flushHeaders();
          flushed = true;
          sentAt = Date.now();
        }
      },
    );
    if (!outgoing.destroyed && !outgoing.writableEnded) outgoing.end(framing.end);
  } catch (error) {
    outgoing.destroy(error as Error);
  } finally {
    clearInterval(keepAlive);
  }
}

/** Results of `wanted` (all results when empty) as they complete; ends once all of `wanted` were written. */
async function pumpResults(
  service: RolloutService,
  wanted: Set<string>,
  sink: Sink<RolloutResult>,
  aborted: AbortSignal,
  judge: (result: RolloutResult) => RolloutResult | null,
): Promise<void> {
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
        sink.idle();
        await signal.wait();
        continue;
      }
      if (!remaining.delete(next.id) && wanted.size > 0) continue;
      const last = wanted.size > 0 && remaining.size === 0;
      const judged = judge(next);
      // a stale result the bound filters is not sent (the stream still ends after the last one)
      if (judged !== null) await sink.emit(judged, last);
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
  sink: Sink<RolloutGroup>,
  aborted: AbortSignal,
  judge: (result: RolloutResult) => RolloutResult | null,
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
        sink.idle();
        await signal.wait();
        continue;
      }
      const members = tasks.get(taskId);
      if (members === undefined) continue; // sent already
      tasks.delete(taskId);
      // read back from the store: the group's credit was added when its last sample was stored
      const stored = await service.results(members);
      // a bound that filters leaves stale samples out; a group with none left is not sent
      const results = members.map((id) => judge(stored.get(id)!)).filter((result) => result !== null);
      if (results.length > 0) await sink.emit({ task_id: taskId, results }, tasks.size === 0);
    }
  } finally {
    aborted.removeEventListener('abort', signal.wake);
    unsubscribe();
  }
}

type SampledItem = RolloutGroup | { sampling: SamplingStatus };

/** A sampling's kept groups in the order kept, then its status once it has ended. */
async function pumpSampling(service: RolloutService, sampling: Sampling, sink: Sink<SampledItem>, aborted: AbortSignal): Promise<void> {
  const signal = waiter();
  sampling.events.on('change', signal.wake);
  aborted.addEventListener('abort', signal.wake, { once: true });
  try {
    let sent = 0;
    while (!aborted.aborted) {
      const taskId = sampling.kept[sent];
      if (taskId !== undefined) {
        sent++;
        const members = (await service.taskRollouts(taskId)) ?? [];
        const stored = await service.results(members);
        // (a sample pruned by retention since is left out; a group with none left is not sent)
        const results = members.flatMap((id) => stored.get(id) ?? []);
        if (results.length > 0) await sink.emit({ task_id: taskId, results }, false);
        continue;
      }
      if (sampling.finished) {
        await sink.emit({ sampling: sampling.status() }, true);
        return;
      }
      sink.idle();
      await signal.wait();
    }
  } finally {
    aborted.removeEventListener('abort', signal.wake);
    sampling.events.off('change', signal.wake);
  }
}

/**
 * Answers with what `pump` emits, each item in its wire shape: straight to Node's response when
 * served by Node (else through hono's stream), NDJSON lines or SSE events closed by an `end` event.
 */
function send<T>(
  c: Context,
  format: 'ndjson' | 'sse',
  keepAliveMs: number,
  aborted: AbortSignal,
  shape: { event: string | ((item: T) => string); id: (item: T) => string; wire: (item: T) => unknown },
  pump: (sink: Sink<T>) => Promise<void>,
): Response {
  const framing = format === 'sse' ? SSE : NDJSON;
  const eventOf = typeof shape.event === 'string' ? () => shape.event as string : shape.event;
  const frame = (item: T) => framing.item(eventOf(item), shape.id(item), JSON.stringify(shape.wire(item)));
  const outgoing = nodeResponse(c);
  if (outgoing) {
    void toNode(outgoing, framing, keepAliveMs, (write, idle) => pump({ emit: (item, last) => write(frame(item), last), idle }), aborted);
    return RESPONSE_ALREADY_SENT;
  }
  // under `app.request` (no socket to keep alive)
  c.header('content-type', framing.contentType);
  return stream(c, async (s) => {
    await pump({ emit: (item) => s.write(frame(item)).then(() => undefined), idle: () => undefined });
    if (framing.end) await s.write(framing.end);
  });
}

/** The rollout ids of `ids` (rollout or task ids). */
async function resultsOf(service: RolloutService, ids: readonly string[]): Promise<Set<string>> {
  const wanted = new Set<string>();
  for (const id of ids) {
    const members = (await service.taskRollouts(id)) ?? ((await service.get(id)) ? [id] : undefined);
    if (!members) throw new RolloutError({ code: 'NOT_FOUND', message: `no rollout or task "${id}"` });
    members.forEach((m) => wanted.add(m));
  }
  return wanted;
}

/** Each task of `ids` with its rollout ids. */
async function groupsOf(service: RolloutService, ids: readonly string[]): Promise<Map<string, string[]>> {
  const tasks = new Map<string, string[]>();
  for (const id of ids) {
    const members = await service.taskRollouts(id);
    if (!members) throw new RolloutError({ code: 'NOT_FOUND', message: `no task "${id}"` });
    tasks.set(id, members);
  }
  if (tasks.size === 0) throw new RolloutError({ code: 'UNPROCESSABLE', message: 'ids: the task ids whose groups to stream' });
  return tasks;
}

const splitIds = (ids: string | undefined) => (ids ?? '').split(',').filter(Boolean);

/** GET and POST /v1/rollouts/stream and /v1/rollouts/groups/stream (NDJSON or SSE). */
export function streamApi({ service, options }: ApiContext): OpenAPIHono {
  const app = new OpenAPIHono();
  const keepAliveMs = options.streamKeepAliveMs ?? DEFAULT_STREAM_KEEP_ALIVE_MS;

  // `ids` (rollout or task ids) narrows the stream and ends it once all of them are finished,
  // results already finished included.
  const results = async (c: Context, ids: readonly string[], format: 'ndjson' | 'sse', view: string | undefined, knobs: ViewKnobs, bound: StalenessBound | undefined) => {
    const training = wantsTrainingView(view);
    const viewOptions = trainingViewOptions(training, knobs);
    const wire = training ? (result: RolloutResult) => trainingView(result, viewOptions) : (result: RolloutResult) => result;
    const wanted = await resultsOf(service, ids);
    const aborted = clientGone(c);
    const judge = staleJudge(service, bound);
    return send(c, format, keepAliveMs, aborted, { event: 'result', id: (result) => result.id, wire }, (sink) => pumpResults(service, wanted, sink, aborted, judge));
  };
  app.openapi(streamRoute, (c) => {
    const query = c.req.valid('query');
    return results(c, splitIds(query.ids), formatOf(c, query.format), query.view, query, boundOf(query));
  });
  app.openapi(streamPostRoute, (c) => {
    const body = c.req.valid('json');
    return results(c, body.ids, formatOf(c, body.format), body.view, body, body.staleness);
  });

  // Whole groups, with the group's advantages and credit filled in (what a GRPO/GTPO trainer consumes).
  const groups = async (c: Context, ids: readonly string[], format: 'ndjson' | 'sse', view: string | undefined, knobs: ViewKnobs, bound: StalenessBound | undefined) => {
    const training = wantsTrainingView(view);
    const viewOptions = trainingViewOptions(training, knobs);
    const wire = training ? (group: RolloutGroup) => toTrainingGroup(group, viewOptions) : (group: RolloutGroup) => group;
    const tasks = await groupsOf(service, ids);
    const aborted = clientGone(c);
    const judge = staleJudge(service, bound);
    return send(c, format, keepAliveMs, aborted, { event: 'group', id: (group) => group.task_id, wire }, (sink) => pumpGroups(service, tasks, sink, aborted, judge));
  };
  app.openapi(groupsRoute, (c) => {
    const query = c.req.valid('query');
    return groups(c, splitIds(query.ids), formatOf(c, query.format), query.view, query, boundOf(query));
  });
  app.openapi(groupsPostRoute, (c) => {
    const body = c.req.valid('json');
    return groups(c, body.ids, formatOf(c, body.format), body.view, body, body.staleness);
  });

  // A dynamic sampling's kept groups, then its counts.
  app.openapi(sampledRoute, async (c) => {
    const { id } = c.req.valid('param');
    const query = c.req.valid('query');
    const sampling = await service.sampling(id);
    if (!sampling) throw unknownSampling(id);
    const training = wantsTrainingView(query.view);
    const viewOptions = trainingViewOptions(training, query);
    const format = formatOf(c, query.format);
    const aborted = clientGone(c);
    const isEnd = (item: SampledItem): item is { sampling: SamplingStatus } => 'sampling' in item;
    return send<SampledItem>(
      c,
      format,
      keepAliveMs,
      aborted,
      {
        event: (item) => (isEnd(item) ? 'sampling' : 'group'),
        id: (item) => (isEnd(item) ? item.sampling.id : item.task_id),
        wire: (item) => (isEnd(item) || !training ? item : toTrainingGroup(item, viewOptions)),
      },
      (sink) => pumpSampling(service, sampling, sink, aborted),
    );
  });

  return app;
}
