import { Agent, request } from 'undici';
import { RolloutError } from '../errors.ts';
import { callerAbortError, chatCompletion, createLlmAgent } from './chat-completion.ts';
import { LlmBackendError, type LlmFailureKind } from './llm-error.ts';
import type { ChatCompletionOptions, ChatRequest, ChatResult, LlmBackendConfig } from './types.ts';

export interface LlmBackendPoolOptions {
  backends?: readonly LlmBackendConfig[];
  /** Time limit of one model call. @default 600_000 */
  requestTimeoutMs?: number;
  /** Sends of one call, counting resends after connection failures. @default 4 */
  maxAttempts?: number;
  /** First wait before probing an unhealthy backend; doubles up to `backoffMaxMs`. @default 1_000 */
  backoffInitialMs?: number;
  /** @default 30_000 */
  backoffMaxMs?: number;
  /** Time limit of a probe (`GET {baseUrl}/models`). @default 5_000 */
  probeTimeoutMs?: number;
  /** How long a call waits for a healthy backend when there is none. @default 120_000 */
  waitForBackendMs?: number;
  /** Time limit of opening a connection (a host that never answers the TCP handshake). @default 5_000 */
  connectTimeoutMs?: number;
  /** The header naming the rollout on every request (null: none). @default 'x-rollout-id' */
  rolloutHeader?: string | null;
  /** Called after every request (for metrics). */
  onRequest?: (event: LlmRequestEvent) => void;
}

export interface LlmRequestEvent {
  backendId: string;
  rolloutId: string;
  attempt: number;
  latencyMs: number;
  outcome: 'ok' | 'cancelled' | LlmFailureKind;
}

export interface LlmBackendStats {
  id: string;
  base_url: string;
  model: string | null;
  max_concurrency: number | null;
  healthy: boolean;
  /** Rollouts stuck to this backend. */
  rollouts_in_flight: number;
  requests_in_flight: number;
  requests: number;
  failures: number;
  connect_failures: number;
  latency_ms: { last: number | null; mean: number | null };
  last_error: string | null;
  /** Why the backend cannot be reached, while it has never answered and its last attempt failed to connect. */
  unreachable: string | null;
  /** When an unhealthy backend is probed next. */
  next_probe_in_ms: number | null;
}

export interface LlmChatOptions {
  signal?: AbortSignal | undefined;
  /** @default the pool's `requestTimeoutMs` */
  timeoutMs?: number | undefined;
}

interface Entry {
  config: LlmBackendConfig;
  agent: Agent;
  healthy: boolean;
  removed: boolean;
  rollouts: number;
  inFlight: number;
  requests: number;
  failures: number;
  connectFailures: number;
  latencySum: number;
  latencyCount: number;
  lastLatencyMs: number | null;
  lastError: string | null;
  /** It answered once (any HTTP response): a later connection failure is a restart worth waiting for. */
  answered: boolean;
  /** Set while it has never answered and the last attempt to connect failed: the cause. */
  unreachable: string | null;
  backoffMs: number;
  probeTimer: NodeJS.Timeout | null;
  probeAt: number | null;
  probe: AbortController | null;
  /** A probe confirming another's report that the backend gave no response (see failed). */
  confirming: Promise<boolean> | null;
}

interface Waiter {
  wake(): void;
  fail(error: RolloutError): void;
}

/** Failures to open a connection at all, as opposed to one dropped mid-request. */
const UNREACHABLE_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'EHOSTDOWN', 'ENETUNREACH', 'ENETDOWN', 'ETIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT']);

/** `connect ECONNREFUSED 127.0.0.1:9` and the like, when `error` (or what it wraps) failed to connect. */
function unreachableCause(error: unknown, depth = 0): string | undefined {
  if (typeof error !== 'object' || error === null || depth > 4) return undefined;
  const { code, message, errors, cause } = error as { code?: unknown; message?: unknown; errors?: unknown; cause?: unknown };
  if (code === 'UND_ERR_CONNECT_TIMEOUT') {
    const limit = typeof message === 'string' ? /timeout: (\d+) ?ms/.exec(message)?.[1] : undefined;
    return `connect timeout: no TCP handshake${limit ? ` within ${limit} ms` : ''}`;
  }
  if (typeof code === 'string' && UNREACHABLE_CODES.has(code)) {
    return typeof message === 'string' && message.includes(code) ? message : `connect ${code}${typeof message === 'string' && message ? ` (${message})` : ''}`;
  }
  // Happy eyeballs (several addresses) fails with an AggregateError of the attempts.
  for (const inner of Array.isArray(errors) ? errors : []) {
    const found = unreachableCause(inner, depth + 1);
    if (found) return found;
  }
  return unreachableCause(cause, depth + 1);
}

/**
 * The policy's inference servers. A rollout sticks to one backend for all its turns (so vLLM's
 * prefix cache keeps its conversation), chosen by fewest rollouts in flight, ties in turn. A request
 * that gets no response takes its backend out of rotation and is sent again to another; the
 * backend is probed after an exponential back-off and put back when it answers.
 *
 * A backend that has never answered and fails to connect (refused, no such host, no route, no
 * handshake within `connectTimeoutMs`) is a wrong or dead URL, not a restart: with no other
 * healthy backend, calls fail at once with an LlmBackendError naming the URL and the cause instead
 * of waiting `waitForBackendMs` for it. Once it has answered, a failure to connect is waited out.
 */
export class LlmBackendPool {
  readonly #entries = new Map<string, Entry>();
  readonly #sticky = new Map<string, Entry>();
  readonly #waiters = new Set<Waiter>();
  readonly #closing = new Set<Promise<void>>();
  readonly #options: Required<Omit<LlmBackendPoolOptions, 'backends' | 'onRequest'>> & Pick<LlmBackendPoolOptions, 'onRequest'>;
  #cursor = 0;
  #closed = false;

  constructor({ backends = [], ...options }: LlmBackendPoolOptions = {}) {
    this.#options = {
      requestTimeoutMs: 600_000,
      maxAttempts: 4,
      backoffInitialMs: 1_000,
      backoffMaxMs: 30_000,
      probeTimeoutMs: 5_000,
      waitForBackendMs: 120_000,
      connectTimeoutMs: 5_000,
      rolloutHeader: 'x-rollout-id',
      ...options,
    };
    for (const backend of backends) this.add(backend);
  }

  /** Adds a backend, healthy until a request to it fails to connect. The id defaults to the URL's host:port. */
  add(input: Omit<LlmBackendConfig, 'id'> & { id?: string | undefined }): LlmBackendStats {
    if (this.#closed) throw new RolloutError({ code: 'UNAVAILABLE', message: 'the LLM backend pool is closed' });
    if (!URL.canParse(input.baseUrl) || !/^https?:$/.test(new URL(input.baseUrl).protocol)) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: `not an http(s) base URL: ${input.baseUrl}` });
    }
    const config: LlmBackendConfig = { ...input, id: input.id ?? new URL(input.baseUrl).host };
    if (config.maxConcurrency !== undefined && !(Number.isInteger(config.maxConcurrency) && config.maxConcurrency > 0)) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: `maxConcurrency must be a positive integer` });
    }
    if (this.#entries.has(config.id)) {
      throw new RolloutError({ code: 'CONFLICT', message: `an LLM backend with id ${config.id} exists` });
    }
    const entry: Entry = {
      config,
      // a short connect limit, so that a dead host shows at once
      agent: createLlmAgent(config.maxConcurrency, this.#options.connectTimeoutMs),
      healthy: true,
      removed: false,
      rollouts: 0,
      inFlight: 0,
      requests: 0,
      failures: 0,
      connectFailures: 0,
      latencySum: 0,
      latencyCount: 0,
      lastLatencyMs: null,
      lastError: null,
      answered: false,
      unreachable: null,
      backoffMs: this.#options.backoffInitialMs,
      probeTimer: null,
      probeAt: null,
      probe: null,
      confirming: null,
    };
    this.#entries.set(config.id, entry);
    this.#notify();
    return this.#stats(entry);
  }

  /**
   * Takes a backend out. Its requests in flight finish; their rollouts move to another backend on
   * their next call.
   */
  remove(id: string): boolean {
    const entry = this.#entries.get(id);
    if (!entry) return false;
    this.#entries.delete(id);
    entry.removed = true;
    this.#stopProbing(entry);
    this.#closeAgent(entry.agent, false);
    return true;
  }

  list(): LlmBackendStats[] {
    return [...this.#entries.values()].map((entry) => this.#stats(entry));
  }

  get(id: string): LlmBackendStats | undefined {
    const entry = this.#entries.get(id);
    return entry && this.#stats(entry);
  }

  /** The backend a rollout is stuck to, if any. */
  backendOf(rolloutId: string): string | undefined {
    return this.#sticky.get(rolloutId)?.config.id;
  }

  /**
   * Sticks a rollout to a backend (the one it has if that one is healthy), waiting for a healthy
   * backend when there is none. `chat` does this itself; `release` must follow either.
   */
  async acquire(rolloutId: string, { signal }: { signal?: AbortSignal | undefined } = {}): Promise<LlmBackendConfig> {
    const entry = await this.#acquire(rolloutId, signal, performance.now() + this.#options.waitForBackendMs);
    return { ...entry.config };
  }

  /**
   * `acquire` without waiting: the rollout's backend (sticking it to the least loaded healthy one
   * if it has none), or undefined when no backend is healthy now. `release` must follow.
   */
  tryAcquire(rolloutId: string): LlmBackendConfig | undefined {
    if (this.#closed) return undefined;
    const current = this.#sticky.get(rolloutId);
    if (current && current.healthy && !current.removed) return { ...current.config };
    const next = this.#pick();
    if (!next) return undefined;
    if (current) current.rollouts -= 1;
    next.rollouts += 1;
    this.#sticky.set(rolloutId, next);
    return { ...next.config };
  }

  /** The headers the pool sends a backend with each of a rollout's requests. */
  requestHeaders(rolloutId: string): Record<string, string> {
    return this.#options.rolloutHeader ? { [this.#options.rolloutHeader]: rolloutId } : {};
  }

  /**
   * Someone else's request to a backend got no response (a node calling it directly). The pool
   * probes it at once and takes it out of rotation only if the probe gets no answer either: a node
   * whose own network fails it must not move every rollout off a backend the others reach.
   * Reports that come while a probe is on wait for that probe.
   */
  async failed(backendId: string, message: string): Promise<void> {
    const entry = this.#entries.get(backendId);
    if (!entry || entry.removed || this.#closed || !entry.healthy) return;
    entry.confirming ??= this.#check(entry).finally(() => {
      entry.confirming = null;
    });
    if (await entry.confirming) return;
    // (the first report to hear the probe's answer takes it out; the others find it out)
    if (entry.removed || this.#closed || !entry.healthy) return;
    entry.failures += 1;
    entry.connectFailures += 1;
    entry.lastError = message;
    this.#markUnhealthy(entry);
  }

  release(rolloutId: string): void {
    const entry = this.#sticky.get(rolloutId);
    if (!entry) return;
    entry.rollouts -= 1;
    this.#sticky.delete(rolloutId);
  }

  /** One model call for a rollout, on its sticky backend; resent elsewhere when it gets no response. */
  async chat(rolloutId: string, chat: ChatRequest, options: LlmChatOptions = {}): Promise<ChatResult> {
    return this.send(rolloutId, (backend, o) => chatCompletion(backend, chat, o), options);
  }

  /** Any request of a rollout (a tokenization, a token-id completion) with `chat`'s stickiness, resends and accounting. */
  async send<R extends { latencyMs: number }>(
    rolloutId: string,
    call: (backend: LlmBackendConfig, options: ChatCompletionOptions) => Promise<R>,
    { signal, timeoutMs }: LlmChatOptions = {},
  ): Promise<R> {
    const deadline = performance.now() + this.#options.waitForBackendMs;
    const headers = this.#options.rolloutHeader ? this.requestHeaders(rolloutId) : undefined;
    for (let attempt = 1; ; attempt++) {
      const entry = await this.#acquire(rolloutId, signal, deadline);
      entry.inFlight += 1;
      entry.requests += 1;
      const started = performance.now();
      let outcome: LlmRequestEvent['outcome'] = 'ok';
      try {
        const result = await call(entry.config, {
          signal,
          timeoutMs: timeoutMs ?? this.#options.requestTimeoutMs,
          headers,
          dispatcher: entry.agent,
        });
        entry.latencySum += result.latencyMs;
        entry.latencyCount += 1;
        entry.lastLatencyMs = result.latencyMs;
        entry.answered = true;
        entry.unreachable = null;
        // An answer is as good as a probe.
        if (!entry.healthy && !entry.removed) this.#markHealthy(entry);
        return result;
      } catch (error) {
        const failure = error instanceof LlmBackendError ? error : null;
        outcome = failure?.kind ?? 'cancelled';
        if (!failure) throw error;
        entry.failures += 1;
        entry.lastError = failure.message;
        if (failure.kind === 'http' || failure.kind === 'protocol') entry.answered = true;
        if (failure.kind === 'connect' && !signal?.aborted && !this.#closed) {
          entry.connectFailures += 1;
          const cause = entry.answered ? undefined : unreachableCause(failure.cause);
          if (cause !== undefined) entry.unreachable = cause;
          if (!entry.removed) this.#markUnhealthy(entry);
          // A URL that never answered fails now unless another backend may take the call.
          if (cause !== undefined && this.#allUnreachable()) throw this.#unreachableError(failure);
          if (attempt < this.#options.maxAttempts) continue;
        }
        throw error;
      } finally {
        entry.inFlight -= 1;
        this.#options.onRequest?.({ backendId: entry.config.id, rolloutId, attempt, latencyMs: performance.now() - started, outcome });
      }
    }
  }

  /** Stops probes, fails waiting calls, and closes every connection (requests in flight fail). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const closed = new LlmBackendError({ kind: 'unavailable', message: 'the LLM backend pool is closed', backendId: null, retryable: false });
    for (const waiter of [...this.#waiters]) waiter.fail(closed);
    for (const entry of this.#entries.values()) {
      this.#stopProbing(entry);
      this.#closeAgent(entry.agent, true);
    }
    this.#entries.clear();
    this.#sticky.clear();
    await Promise.all([...this.#closing]);
  }

  async #acquire(rolloutId: string, signal: AbortSignal | undefined, deadline: number): Promise<Entry> {
    for (;;) {
      if (signal?.aborted) throw callerAbortError(signal.reason);
      if (this.#closed) {
        throw new LlmBackendError({ kind: 'unavailable', message: 'the LLM backend pool is closed', backendId: null, retryable: false });
      }
      const current = this.#sticky.get(rolloutId);
      if (current && current.healthy && !current.removed) return current;
      const next = this.#pick();
      if (next) {
        if (current) current.rollouts -= 1;
        next.rollouts += 1;
        this.#sticky.set(rolloutId, next);
        return next;
      }
      // Every backend is a URL that never answered and could not be reached: say so now.
      if (this.#allUnreachable()) throw this.#unreachableError();
      await this.#waitForChange(signal, deadline);
    }
  }

  #allUnreachable(): boolean {
    if (this.#entries.size === 0) return false;
    for (const entry of this.#entries.values()) if (entry.unreachable === null) return false;
    return true;
  }

  /** `policy backend http://127.0.0.1:9/v1 unreachable: connect ECONNREFUSED 127.0.0.1:9`, one clause per backend. */
  #unreachableError(cause?: unknown): LlmBackendError {
    const entries = [...this.#entries.values()];
    return new LlmBackendError({
      kind: 'unavailable',
      message: entries.map((entry, i) => `${i === 0 ? 'policy backend ' : ''}${entry.config.baseUrl} unreachable: ${entry.unreachable}`).join('; '),
      backendId: entries.length === 1 ? entries[0]!.config.id : null,
      retryable: true,
      cause,
    });
  }

  /** The healthy backend with fewest rollouts; ties go round robin. */
  #pick(): Entry | undefined {
    const entries = [...this.#entries.values()];
    let best: Entry | undefined;
    let bestIndex = 0;
    for (let k = 0; k < entries.length; k++) {
      const index = (this.#cursor + k) % entries.length;
      const entry = entries[index]!;
      if (!entry.healthy) continue;
      if (!best || entry.rollouts < best.rollouts) {
        best = entry;
        bestIndex = index;
      }
    }
    if (best) this.#cursor = (bestIndex + 1) % entries.length;
    return best;
  }

  #waitForChange(signal: AbortSignal | undefined, deadline: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const remaining = deadline - performance.now();
      const finish = (error?: RolloutError) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.#waiters.delete(waiter);
        if (error) reject(error);
        else resolve();
      };
      const waiter: Waiter = { wake: () => finish(), fail: finish };
      const onAbort = () => finish(callerAbortError(signal?.reason));
      const timer = setTimeout(
        () =>
          finish(
            new LlmBackendError({
              kind: 'unavailable',
              message: `no healthy LLM backend within ${this.#options.waitForBackendMs} ms (${this.#entries.size} configured)`,
              backendId: null,
              retryable: true,
            }),
          ),
        Math.max(0, remaining),
      );
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#waiters.add(waiter);
    });
  }

  #notify(): void {
    for (const waiter of [...this.#waiters]) waiter.wake();
  }

  #markUnhealthy(entry: Entry): void {
    if (!entry.healthy) return;
    entry.healthy = false;
    this.#scheduleProbe(entry);
  }

  #scheduleProbe(entry: Entry): void {
    const delay = entry.backoffMs;
    entry.backoffMs = Math.min(entry.backoffMs * 2, this.#options.backoffMaxMs);
    entry.probeAt = performance.now() + delay;
    // Not unref'd: close() ends it, and a leaked pool should show up in tests.
    entry.probeTimer = setTimeout(() => void this.#probe(entry), delay);
  }

  async #probe(entry: Entry): Promise<void> {
    entry.probeTimer = null;
    entry.probeAt = null;
    const ok = await this.#check(entry);
    if (entry.removed || this.#closed || entry.healthy) return;
    if (ok) this.#markHealthy(entry);
    else this.#scheduleProbe(entry);
  }

  /** Whether the backend answers its `/models` with a 2xx within the probe time limit. */
  async #check(entry: Entry): Promise<boolean> {
    const controller = new AbortController();
    entry.probe = controller;
    const timer = setTimeout(() => controller.abort(), this.#options.probeTimeoutMs);
    let ok = false;
    try {
      const response = await request(`${entry.config.baseUrl.replace(/\/+$/, '')}/models`, {
        headers: entry.config.apiKey === undefined ? {} : { authorization: `Bearer ${entry.config.apiKey}` },
        signal: controller.signal,
        dispatcher: entry.agent,
      });
      await response.body.dump();
      entry.answered = true;
      entry.unreachable = null;
      ok = response.statusCode >= 200 && response.statusCode < 300;
      if (!ok) entry.lastError = `probe: HTTP ${response.statusCode}`;
    } catch (error) {
      entry.lastError = `probe: ${error instanceof Error ? error.message : String(error)}`;
      if (!entry.answered) entry.unreachable = unreachableCause(error) ?? entry.unreachable;
    } finally {
      clearTimeout(timer);
      if (entry.probe === controller) entry.probe = null;
    }
    return ok;
  }

  #markHealthy(entry: Entry): void {
    this.#stopProbing(entry);
    entry.healthy = true;
    entry.backoffMs = this.#options.backoffInitialMs;
    this.#notify();
  }

  #stopProbing(entry: Entry): void {
    if (entry.probeTimer) clearTimeout(entry.probeTimer);
    entry.probeTimer = null;
    entry.probeAt = null;
    entry.probe?.abort();
  }

  #closeAgent(agent: Agent, force: boolean): void {
    const closing = (force ? agent.destroy() : agent.close()).catch(() => {});
    this.#closing.add(closing);
    void closing.finally(() => this.#closing.delete(closing));
  }

  #stats(entry: Entry): LlmBackendStats {
    return {
      id: entry.config.id,
      base_url: entry.config.baseUrl,
      model: entry.config.model ?? null,
      max_concurrency: entry.config.maxConcurrency ?? null,
      healthy: entry.healthy,
      rollouts_in_flight: entry.rollouts,
      requests_in_flight: entry.inFlight,
      requests: entry.requests,
      failures: entry.failures,
      connect_failures: entry.connectFailures,
      latency_ms: {
        last: entry.lastLatencyMs,
        mean: entry.latencyCount === 0 ? null : entry.latencySum / entry.latencyCount,
      },
      last_error: entry.lastError,
      unreachable: entry.unreachable,
      next_probe_in_ms: entry.probeAt === null ? null : Math.max(0, entry.probeAt - performance.now()),
    };
  }
}
