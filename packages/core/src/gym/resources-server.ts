import { timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Hono, type Context } from 'hono';
import { bearerAuth } from 'hono/bearer-auth';
import { getPath } from 'hono/utils/url';
import { pino, type Logger } from 'pino';
import { z } from 'zod';
import { NeMoGymResponse, ResponseCreateParams } from '../protocol/responses.ts';
import { sandboxSpecOf, type Environment, type EnvironmentContext, type Session, type VerifyEntry } from '../spec/environment.ts';
import { invokeTool, LazyAbort, type ToolOutcome } from '../spec/invoke-tool.ts';
import type { ToolDefinition } from '../spec/tool.ts';
import { createSandboxProvider } from '../sandbox/registry.ts';
import type { SandboxProvider } from '../sandbox/types.ts';
import { createSessionTools, type SessionTools } from '../tools/session-tools.ts';
import { METHOD_NOT_ALLOWED_BODY, NOT_FOUND_BODY, pydanticInt } from '../server/fastapi-errors.ts';
import { bodyValue, stripRolloutPrefix, validateBody as validate } from '../server/fastapi.ts';
import {
  fastApiErrorHandler,
  nodeBindings,
  readBodyBytes,
  readFastApiBody,
  readIncomingBytes,
  requestDeclaredLength,
  requestHeader,
} from '../server/fastapi-hono.ts';
import { checkToken } from '../server/bind-policy.ts';
import { computeAggregateMetrics } from './metrics.ts';
import { aggregateMetricsFloats, verifyResponseFloats } from './float-fields.ts';
import { fastApiJsonResponse } from '../server/fastapi-hono.ts';
import { decodeRequestBody, DEFAULT_MAX_BODY_BYTES, LARGE_BODY_BYTES } from '../server/read-body.ts';
import type { NodeFastPath } from '../server/serve.ts';
import { SessionStore } from '../server/session-store.ts';

export { stripRolloutPrefix } from '../server/fastapi.ts';

export interface ResourcesServerOptions {
  /**
   * The server instance's config block (NeMo Gym YAML, interpolated). Parsed with the
   * environment's `config` schema.
   */
  config?: Record<string, unknown>;
  /** The server instance name (NeMo Gym's `NEMO_GYM_CONFIG_PATH`). @default env.name */
  instanceName?: string;
  logger?: Logger;
  /** Idle sessions are closed after this long. @default 3_600_000 */
  sessionIdleTtlMs?: number;
  /** Per-call limit for tools that set none. @default 60_000 */
  toolTimeoutMs?: number;
  /**
   * Creates the sessions' sandboxes (`ctx.tools`) when the environment names no provider.
   * @default createSandboxProvider(), one for the server (made at first use, closed with it)
   */
  sandboxProvider?: SandboxProvider;
  /**
   * Required as `Authorization: Bearer <token>` on every route but the `GET /` liveness probe
   * when set. NeMo Gym's own clients send no such header.
   */
  token?: string;
  /**
   * The largest request body read, in bytes: a larger one is a 413 `{"detail": ...}`, refused
   * before it is read whole. @default DEFAULT_MAX_BODY_BYTES (64 MiB)
   */
  maxBodyBytes?: number;
}

export type ResourcesServer = Hono<Vars> & {
  readonly cookieName: string;
  readonly sessions: SessionStore;
  readonly environment: Environment<any, any, any>;
  /** Ends every session (their sandboxes and kernels) and stops the reaper. */
  close(): Promise<void>;
  /** Tool calls answered on Node's own objects when `serveFetch` serves the app (its 200s; see NodeFastPath). */
  readonly fastPath: NodeFastPath;
};

type Vars = { Variables: { sessionId: string; sessionBusy: boolean; signal: AbortSignal | undefined } };

/**
 * Aborted when the client goes away before the answer is sent. Served by Node, from the response's
 * own 'close': the web Request that `c.req.raw.signal` would build (with a ReadableStream of the
 * body and an AbortController) cost more than the rest of a tool call's HTTP handling.
 */
function requestSignal(c: Context<Vars>): AbortSignal {
  const existing = c.get('signal');
  if (existing) return existing;
  const { outgoing } = nodeBindings(c);
  let signal: AbortSignal;
  if (outgoing) {
    const controller = new AbortController();
    outgoing.once('close', () => {
      if (!outgoing.writableFinished) controller.abort(new Error('Client connection prematurely closed.'));
    });
    signal = controller.signal;
  } else {
    signal = c.req.raw.signal;
  }
  c.set('signal', signal);
  return signal;
}

/**
 * The same for a tool call, as invokeTool takes it: a LazyAbort aborted from the response's
 * 'close', whose AbortSignal is made only if the tool reads `ctx.signal`.
 */
function requestAbort(c: Context<Vars>): { abort: LazyAbort } | { signal: AbortSignal } {
  const { outgoing } = nodeBindings(c);
  if (!outgoing) return { signal: requestSignal(c) };
  const abort = new LazyAbort();
  outgoing.once('close', () => {
    if (!outgoing.writableFinished) abort.abort(new Error('Client connection prematurely closed.'));
  });
  return { abort };
}

const VerifyBase = z.object({ responses_create_params: ResponseCreateParams, response: NeMoGymResponse });
const AggregateRequest = z.object({
  // NeMo Gym types the entries as plain dicts; the indices are checked here as pydantic ints, so
  // that bad ones get a 422 rather than an error deep in the profiler.
  verify_responses: z
    .array(z.looseObject({ _ng_task_index: pydanticInt().optional(), _ng_rollout_index: pydanticInt().optional() }))
    .superRefine((entries, ctx) => {
      const seen = new Set<string>();
      for (const entry of entries) {
        const key = `${entry._ng_task_index ?? 0}, ${entry._ng_rollout_index ?? 0}`;
        if (seen.has(key)) {
          ctx.addIssue({ code: 'custom', message: `Duplicate materialized input row for rollout key (${key})`, input: entries });
          return;
        }
        seen.add(key);
      }
    }),
});

/** The paths of the server's own routes (a tool of one of these names is served by the route). */
const BUILT_IN_PATHS = new Set(['/', '/reverify_mode', '/seed_session', '/verify', '/aggregate_metrics']);
/** A request target the fast path takes as it is (anything else, a query or an escape, goes to the app). */
const PLAIN_PATH = /^\/[\w./-]*$/;
/** Cookie headers remembered with their verified session cookie (see cookieValueOf). */
const KNOWN_COOKIES = 4_096;
/** Hono's `c.text` content type. */
const TEXT_PLAIN = 'text/plain; charset=UTF-8';

function pascalCase(name: string): string {
  return name.replace(/(^|[-_])([a-z0-9])/g, (_, __, ch: string) => ch.toUpperCase());
}

function cookieFrom(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** A provider made when a sandbox is first asked for (a session that uses none makes none). */
function lazyProvider(make: () => SandboxProvider): SandboxProvider {
  return {
    name: 'default',
    create: (spec) => make().create(spec),
    prefetch: (spec) => make().prefetch?.(spec) ?? Promise.resolve(),
  };
}

/**
 * A NeMo Gym resources server for one environment, as a Hono app: every route, status code, body
 * shape and cookie rule of shared/nemo-gym/CONTRACT.md §1. Serve it with `serveFetch`.
 */
export function createResourcesServer(env: Environment<any, any, any>, options: ResourcesServerOptions = {}): ResourcesServer {
  const instanceName = options.instanceName ?? env.name;
  const cookieName = `${pascalCase(env.name)}ResourcesServer___${instanceName}`;
  const verifyFloats = verifyResponseFloats(env.floatFields);
  const logger = options.logger ?? pino({ name: instanceName, level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
  const config = (env.config ? env.config.parse(options.config ?? {}) : (options.config ?? {})) as Record<string, unknown>;
  const sessions = new SessionStore({ idleTtlMs: options.sessionIdleTtlMs ?? 3_600_000, logger });
  const defaultToolTimeoutMs = options.toolTimeoutMs ?? 60_000;
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const readJson = (c: Context) => readFastApiBody(c, maxBodyBytes);

  const app = new Hono<Vars>({
    getPath: (request) => stripRolloutPrefix(getPath(request)).path,
  });

  // env.setup once per server, on first use; what it returns is every hook's ctx.resources.
  let resources: unknown;
  let setupDone = env.setup === undefined;
  let settingUp: Promise<unknown> | undefined;
  const setup = async (): Promise<void> => {
    settingUp ??= Promise.resolve()
      .then(() => env.setup!(config))
      .then(
        (value) => {
          resources = value;
          setupDone = true;
        },
        (error: unknown) => {
          settingUp = undefined; // tried again by the next request
          throw error;
        },
      );
    await settingUp;
  };

  // The sessions' default provider, one for the server (its warm sandboxes and kernel fork
  // servers serve every session), made at first use and closed with the server.
  let defaultProvider: SandboxProvider | undefined;
  // The session's ctx.tools, made on first use; the sandbox from env.sandbox, for the seed row.
  const toolsBySession = new Map<string, { tools: SessionTools; row?: Record<string, unknown>; logger?: Logger }>();
  const toolsOf = (session: Session) => {
    let entry = toolsBySession.get(session.id);
    if (entry === undefined) {
      const seed: { row?: Record<string, unknown>; logger?: Logger } = {};
      const provider = env.sandbox?.provider?.(config, resources) ?? options.sandboxProvider ?? lazyProvider(() => (defaultProvider ??= createSandboxProvider()));
      const tools = createSessionTools(session, {
        provider,
        spec: () => sandboxSpecOf(env.sandbox, seed.row, config),
      });
      entry = Object.assign(seed, { tools });
      toolsBySession.set(session.id, entry);
      session.onClose(() => void toolsBySession.delete(session.id));
    }
    return entry;
  };

  /** The hooks' ctx for a session but its signal (a tool call's comes from invokeTool, made only when read). */
  const sessionContext = (sessionId: string, busy: () => void): Omit<EnvironmentContext, 'signal'> => {
    const session = sessions.get(sessionId);
    busy();
    const entry = toolsOf(session);
    entry.logger ??= logger.child({ session: session.id });
    return { session, config, logger: entry.logger, tools: entry.tools, resources };
  };
  const contextOf = (c: Context<Vars>): Omit<EnvironmentContext, 'signal'> =>
    sessionContext(c.get('sessionId'), () => {
      // Busy while this request is served: the idle reaper leaves it alone (a long SWE verify).
      if (!c.get('sessionBusy')) {
        sessions.use(c.get('sessionId'), true);
        c.set('sessionBusy', true);
      }
    });
  const contextFor = (c: Context<Vars>): EnvironmentContext => ({ ...contextOf(c), signal: requestSignal(c) });

  // The session cookie's value for a request's Cookie header: its own when we signed it, else a new
  // session's. A session's Cookie header comes back on each of its calls: once verified, it is kept.
  const knownCookies = new Map<string, string>();
  const cookieValueOf = (header: string | undefined): string => {
    const known = header === undefined ? undefined : knownCookies.get(header);
    if (known !== undefined) return known;
    const given = cookieFrom(header, cookieName);
    const id = sessions.idFromCookie(given);
    if (id === undefined) return sessions.newCookieValue();
    const value = given!.replace(/^"(.*)"$/, '$1');
    if (header!.length <= 4096) {
      if (knownCookies.size >= KNOWN_COOKIES) knownCookies.delete(knownCookies.keys().next().value!);
      knownCookies.set(header!, value);
    }
    return value;
  };
  const setCookie = (value: string) => `${cookieName}=${value}; path=/; Max-Age=1209600; httponly; samesite=lax`;
  // A tool call the fast path began and handed to the app: its session's cookie, and the tool's
  // outcome once the tool ran (the app answers it; the tool never runs twice).
  const handedBack = new WeakMap<IncomingMessage, { cookie: string; outcome?: ToolOutcome }>();

  // Session cookie on every response, 404 and 422 as CONTRACT.md §1.3 asks, and 500 too (Python
  // sends none there; re-sending it keeps simple_agent's session alive, which can only help).
  app.use(async (c, next) => {
    const { incoming } = nodeBindings(c);
    const value = (incoming && handedBack.get(incoming)?.cookie) ?? cookieValueOf(requestHeader(c, 'cookie'));
    const sessionId = value.slice(0, value.lastIndexOf('.'));
    c.set('sessionId', sessionId);
    try {
      await next();
    } finally {
      if (c.get('sessionBusy')) sessions.use(sessionId, false);
    }
    c.res.headers.append('set-cookie', setCookie(value));
  });

  // A declared body above the cap is refused on every route, before the token and whether the
  // route reads bodies at all (Node would otherwise read and drop all of it after the answer).
  app.use(async (c, next) => {
    // refused by the read, which drains what comes for a moment
    if ((requestDeclaredLength(c) ?? 0) > maxBodyBytes) await readBodyBytes(c, maxBodyBytes);
    return next();
  });

  // The liveness probe stays open; everything else takes the token when there is one.
  app.get('/', (c) => c.json({ status: 'ok' }));
  if (options.token !== undefined) {
    const unauthorized = (detail: string) => () =>
      new Response(JSON.stringify({ detail }), { status: 401, headers: { 'content-type': 'application/json' } });
    app.use(
      bearerAuth({
        token: checkToken(options.token),
        noAuthenticationHeader: { message: unauthorized('Not authenticated') },
        invalidAuthenticationHeader: { message: unauthorized('Invalid authentication credentials') },
        invalidToken: { message: unauthorized('Invalid authentication credentials') },
      }),
    );
  }
  app.get('/reverify_mode', (c) => c.json(env.reverifyMode));

  app.post('/seed_session', async (c) => {
    const body = await readJson(c);
    const [raw] = validate([z.looseObject({})], body);
    // The session's sandbox is made for this row (its parsed form) when the environment asks so.
    const sandboxRow = env.sandbox?.spec ? { ...raw, ...(validate([env.row], body)[0] as object) } : undefined;
    if (!env.seedSession && sandboxRow === undefined) return c.json({});
    if (!setupDone) await setup();
    if (sandboxRow !== undefined) toolsOf(sessions.get(c.get('sessionId'))).row = sandboxRow;
    if (!env.seedSession) return c.json({});
    const [row] = env.seedRow ? validate([env.seedRow], body) : [raw];
    const result = await env.seedSession({ ...raw, ...(row as object) }, contextFor(c));
    return c.json(result ?? {});
  });

  app.post('/verify', async (c) => {
    const body = await readJson(c);
    const [raw] = validate([z.looseObject({})], body) as [Record<string, unknown>];
    const [, row] = validate<z.ZodType>([VerifyBase, env.row], body);
    const sessionId = c.get('sessionId');
    try {
      if (!setupDone) await setup();
      const result = await env.verify(
        { ...raw, ...(row as object) },
        raw.response as z.output<typeof NeMoGymResponse>,
        contextFor(c),
      );
      const { reward, ...extras } = result;
      const numeric = typeof reward === 'number' && Number.isFinite(reward) ? reward : 0;
      // A judge outage: NeMo Gym's judge_failsafe answers the whole request plus the failure keys
      // (CONTRACT.md §1.6), so that collection routes the row to its failures file.
      if ('_ng_failure_class' in extras) return fastApiJsonResponse(c, { ...raw, ...extras, reward: numeric }, verifyFloats);
      // Echo the two objects as they came (token ids and unknown keys intact): raw, not parsed.
      const answer = { responses_create_params: raw.responses_create_params, response: raw.response, reward: numeric, ...extras };
      return fastApiJsonResponse(c, answer, verifyFloats);
    } finally {
      await sessions.end(sessionId);
    }
  });

  app.post('/aggregate_metrics', async (c) => {
    const [request] = validate([AggregateRequest], await readJson(c));
    const hooks = {
      ...(env.metrics ? { metrics: env.metrics } : {}),
      ...(env.keyMetrics ? { keyMetrics: env.keyMetrics } : {}),
    };
    return fastApiJsonResponse(c, computeAggregateMetrics(request.verify_responses as VerifyEntry[], hooks), aggregateMetricsFloats(env.floatFields));
  });

  for (const [name, tool] of Object.entries(env.tools)) {
    app.post(`/${name}`, async (c) => {
      // No body at all is a no-argument call; a JSON null stays FastAPI's missing body.
      const raw = await readJson(c);
      const body = raw === undefined ? {} : raw;
      const [args] = validate([tool.parameters], body);
      return runTool(c, tool, args);
    });
  }

  async function runTool(c: Context<Vars>, tool: ToolDefinition<any, any>, args: unknown) {
    if (!setupDone) await setup();
    const { incoming } = nodeBindings(c);
    const outcome =
      (incoming && handedBack.get(incoming)?.outcome) ??
      (await invokeTool(tool, args, contextOf(c), { timeoutMs: tool.timeoutMs ?? defaultToolTimeoutMs, ...requestAbort(c) }));
    if (outcome.ok) {
      if (tool.text) return c.text(tool.text(outcome.value));
      return typeof outcome.value === 'string' ? c.text(outcome.value) : c.json(outcome.value ?? null);
    }
    if (outcome.timedOut) return c.json({ detail: (outcome.error as Error).message }, 504);
    throw outcome.error;
  }

  // 405 on known paths with another method, 404 everywhere else: FastAPI's bodies.
  const known = new Map<string, string>([
    ['/', 'GET'],
    ['/reverify_mode', 'GET'],
    ['/seed_session', 'POST'],
    ['/verify', 'POST'],
    ['/aggregate_metrics', 'POST'],
    ...Object.keys(env.tools).map((name): [string, string] => [`/${name}`, 'POST']),
  ]);
  for (const [path, method] of known) {
    app.all(path, (c) => c.json(METHOD_NOT_ALLOWED_BODY, 405, { allow: method }));
  }
  app.notFound((c) => c.json(NOT_FOUND_BODY, 404));
  // The environment's errors are its own code's exceptions: a 500 with repr(e), but bad input it
  // found only while computing (the 422 a pydantic validator gives).
  app.onError(fastApiErrorHandler({ logger }));

  // The fast path: a tool call's 200 answered on Node's own objects, with what the routes above
  // would answer (status, headers, body, cookie). It takes only the plain requests (POST to a
  // tool's exact path, a declared small body, a Host and token @hono/node-server and bearerAuth
  // accept, the environment set up); anything else, and every answer but a 200 (422, 504, an
  // error), goes to the app as before, with the bytes, the session and the tool's outcome it has.
  const toolsByPath = new Map<string, ToolDefinition<any, any>>(
    Object.entries(env.tools)
      .filter(([name]) => !BUILT_IN_PATHS.has(`/${name}`))
      .map(([name, tool]) => [`/${name}`, tool] as const),
  );
  const bearer = options.token === undefined ? undefined : Buffer.from(`Bearer ${options.token}`);
  const authorized = (header: string | undefined): boolean => {
    if (bearer === undefined) return true;
    if (header === undefined) return false;
    const given = Buffer.from(header);
    return given.length === bearer.length && timingSafeEqual(given, bearer);
  };
  const hosts = new Map<string, boolean>();
  /** Whether @hono/node-server takes this Host (it answers 400 to one it does not), as it decides. */
  const hostAccepted = (host: string | undefined): boolean => {
    if (!host) return false;
    let accepted = hosts.get(host);
    if (accepted === undefined) {
      try {
        const { hostname } = new URL(`http://${host}/`);
        accepted = hostname.length === host.length || hostname === host.replace(/:\d+$/, '');
      } catch {
        accepted = false;
      }
      if (hosts.size < 64) hosts.set(host, accepted);
    }
    return accepted;
  };

  /** Runs a tool call begun on the fast path; false hands it to the app (begun then says how far it got). */
  async function answerToolCall(
    incoming: IncomingMessage,
    outgoing: ServerResponse,
    tool: ToolDefinition<any, any>,
    begun: { cookie: string; outcome?: ToolOutcome },
  ): Promise<boolean> {
    const sessionId = begun.cookie.slice(0, begun.cookie.lastIndexOf('.'));
    let args: unknown;
    let context: Omit<EnvironmentContext, 'signal'>;
    try {
      // No body at all is a no-argument call, as on the route.
      const raw = bodyValue(decodeRequestBody(await readIncomingBytes(incoming, maxBodyBytes), incoming.headers['content-type'] ?? null));
      // a JSON null is FastAPI's missing body, and bad arguments its 422: the app answers them
      const parsed = raw === null ? undefined : (tool.parameters as z.ZodType).safeParse(raw === undefined ? {} : raw);
      if (!parsed?.success) return false;
      args = parsed.data;
      context = sessionContext(sessionId, () => sessions.use(sessionId, true));
    } catch {
      // the app answers it from the same bytes: its 422, its 400, its 500
      return false;
    }
    const abort = new LazyAbort();
    outgoing.once('close', () => {
      if (!outgoing.writableFinished) abort.abort(new Error('Client connection prematurely closed.'));
    });
    try {
      begun.outcome = await invokeTool(tool, args, context, { timeoutMs: tool.timeoutMs ?? defaultToolTimeoutMs, abort });
    } finally {
      sessions.use(sessionId, false);
    }
    const { outcome } = begun;
    if (!outcome.ok) return false;
    let text: unknown;
    let type: string;
    try {
      if (tool.text || typeof outcome.value === 'string') {
        text = tool.text ? tool.text(outcome.value) : outcome.value;
        type = TEXT_PLAIN;
      } else {
        text = JSON.stringify(outcome.value ?? null);
        type = 'application/json';
      }
    } catch {
      return false;
    }
    if (typeof text !== 'string') return false;
    // the headers as @hono/node-server writes the route's Response with the session cookie
    outgoing.writeHead(200, { 'content-type': type, 'set-cookie': setCookie(begun.cookie), 'Content-Length': Buffer.byteLength(text) });
    outgoing.end(text);
    return true;
  }

  const fastPath: NodeFastPath = (incoming, outgoing, fallback) => {
    if (incoming.method !== 'POST' || !setupDone) return false;
    const url = incoming.url ?? '';
    if (!PLAIN_PATH.test(url)) return false;
    const tool = toolsByPath.get(stripRolloutPrefix(url).path);
    const { headers } = incoming;
    const length = headers['content-length'];
    if (tool === undefined || length === undefined || headers['transfer-encoding'] !== undefined) return false;
    const declared = Number(length);
    if (!(declared <= maxBodyBytes && declared < LARGE_BODY_BYTES) || !hostAccepted(headers.host) || !authorized(headers.authorization)) return false;
    const begun: { cookie: string; outcome?: ToolOutcome } = { cookie: cookieValueOf(headers.cookie) };
    const handBack = () => {
      handedBack.set(incoming, begun);
      fallback();
    };
    answerToolCall(incoming, outgoing, tool, begun).then(
      (answered) => {
        if (!answered) handBack();
      },
      (error: unknown) => {
        logger.error({ err: error, path: url }, 'tool call failed on the fast path');
        if (!outgoing.headersSent) handBack();
      },
    );
    return true;
  };

  return Object.assign(app, {
    fastPath,
    cookieName,
    sessions,
    environment: env,
    close: async () => {
      await sessions.close();
      await defaultProvider?.close?.();
      if (env.setup === undefined) await env.close?.(undefined);
      else if (settingUp !== undefined) {
        const ran = await settingUp.then(() => true, () => false);
        if (ran) await env.close?.(resources);
      }
    },
  });
}
