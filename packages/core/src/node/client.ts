import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request, type Dispatcher } from 'undici';
import { ERROR_CODES, RolloutError, type RolloutErrorCode } from '../errors.ts';
import type { ModelTurn } from '../protocol/chat.ts';
import { toLegacyResult } from '../protocol/legacy-result.ts';
import {
  fromWireModelTurn,
  HeartbeatAnswer,
  NODE_CREDENTIAL_HEADER,
  NODE_FEATURES_HEADER,
  NodeClaims,
  NodeCommitAnswer,
  NodeRegistered,
  NodeRoute,
  NodeView,
  WireModelTurn,
  type NodeGeneration,
  type NodeRouteRequest,
  type NodeWeights,
  type NodeClaim,
  type NodeCommit,
  type NodeCommitStatus,
  type NodeLease,
  type NodeModelRequest,
  type NodeRegistration,
  type NodeUpcoming,
} from '../protocol/nodes.ts';
import { encodeResult } from '../protocol/result-codec.ts';
import { RolloutTask } from '../protocol/rollout.ts';
import { z } from 'zod';

export interface NodeClientOptions {
  /** The central service, `http://host:8100`. */
  serviceUrl: string;
  /** Its bearer token. */
  token?: string;
  /** The node's credential, when it has one already (else the one `register` answers is kept). */
  credential?: string;
  /** A call's limit (the long poll and model turns add their own wait). @default 30_000 */
  timeoutMs?: number;
  /** What the node says it reads and does (NODE_FEATURES_HEADER). @default ['weights'] */
  features?: readonly string[];
}

/** Whether a failed call may succeed if made again: the service unreachable, restarting or busy. */
export function isRetryable(error: unknown): boolean {
  if (!RolloutError.isInstance(error)) return false;
  if (error.code === 'CANCELLED') return false;
  return error.retryable || error.status >= 500;
}

/**
 * Calls `attempt` until it succeeds, waiting between tries (exponential, with jitter) while the
 * error is retryable and `signal` is not aborted; other errors are thrown at once.
 */
export async function withRetry<T>(
  attempt: () => Promise<T>,
  { signal, minMs = 100, maxMs = 2_000, retryable = isRetryable }: { signal?: AbortSignal; minMs?: number; maxMs?: number; retryable?: (error: unknown) => boolean } = {},
): Promise<T> {
  for (let tries = 0; ; tries++) {
    try {
      return await attempt();
    } catch (error) {
      if (signal?.aborted || !retryable(error)) throw error;
      const wait = Math.min(maxMs, minMs * 2 ** Math.min(tries, 10));
      await sleep(wait / 2 + Math.random() * (wait / 2), undefined, signal ? { signal } : undefined).catch(() => undefined);
      if (signal?.aborted) throw error;
    }
  }
}

const Released = z.object({ released: z.number().int() });
const NodeList = z.object({ nodes: z.array(NodeView) });

const isCode = (code: unknown): code is RolloutErrorCode => typeof code === 'string' && code in ERROR_CODES;

/**
 * The node's side of /v1/nodes over HTTP: one keep-alive connection pool to the service, the
 * bearer token, the node's credential (the one its registration answered, sent on every call
 * after it), a time limit per call, and every failure a RolloutError (the service's own error,
 * or a retryable UNAVAILABLE when it cannot be reached).
 */
export class NodeClient {
  readonly #base: string;
  #headers: Record<string, string>;
  readonly #timeoutMs: number;
  readonly #agent: Agent;
  /** When the service last answered a call (performance.now()): any answer but a 5xx. */
  #lastAnswer = performance.now();
  /** The features the service took up at the last registration. */
  #serviceFeatures: readonly string[] = [];
  /** Called with the weight state whenever an answer carries one (a node calling backends itself). */
  onWeights: ((weights: NodeWeights) => void) | undefined;

  constructor(options: NodeClientOptions) {
    this.#base = options.serviceUrl.replace(/\/+$/, '');
    this.#headers = {
      'content-type': 'application/json',
      // it reads weight versions and pauses, and the work queued next (an older service ignores the header)
      [NODE_FEATURES_HEADER]: (options.features ?? ['weights', 'prefetch']).join(','),
      ...(options.token ? { authorization: `Bearer ${options.token}` } : {}),
      ...(options.credential ? { [NODE_CREDENTIAL_HEADER]: options.credential } : {}),
    };
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#agent = new Agent({ keepAliveTimeout: 30_000, keepAliveMaxTimeout: 300_000, connect: { timeout: 10_000 } });
  }

  get serviceUrl(): string {
    return this.#base;
  }

  /** The node's credential, sent from now on (register keeps the one it is answered). */
  get credential(): string | undefined {
    return this.#headers[NODE_CREDENTIAL_HEADER];
  }

  set credential(credential: string | undefined) {
    const { [NODE_CREDENTIAL_HEADER]: _old, ...rest } = this.#headers;
    this.#headers = credential ? { ...rest, [NODE_CREDENTIAL_HEADER]: credential } : rest;
  }

  /** The features of NODE_FEATURES_HEADER the service took up when the node last registered (none from an older service). */
  get serviceFeatures(): readonly string[] {
    return this.#serviceFeatures;
  }

  #heard(weights: NodeWeights | undefined): void {
    if (weights) this.onWeights?.(weights);
  }

  /** When the service last answered a call (performance.now()): any answer but a 5xx. */
  get lastAnswer(): number {
    return this.#lastAnswer;
  }

  async #call<T extends z.ZodType>(method: Dispatcher.HttpMethod, path: string, schema: T, body?: unknown, { signal, extraMs = 0 }: { signal?: AbortSignal; extraMs?: number } = {}): Promise<z.output<T>> {
    const timeout = this.#timeoutMs + extraMs;
    let response: Dispatcher.ResponseData;
    try {
      response = await request(`${this.#base}${path}`, {
        method,
        dispatcher: this.#agent,
        headers: this.#headers,
        headersTimeout: timeout,
        bodyTimeout: timeout,
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        ...(signal ? { signal } : {}),
      });
    } catch (error) {
      if (signal?.aborted) throw new RolloutError({ code: 'CANCELLED', message: `${method} ${path} aborted`, cause: error });
      throw new RolloutError({ code: 'UNAVAILABLE', message: `the service at ${this.#base} is unreachable: ${(error as Error).message}`, retryable: true, cause: error });
    }
    // a gateway's 502/503 for a service that is gone is no answer of the service's
    if (response.statusCode < 500) this.#lastAnswer = performance.now();
    let text: string;
    try {
      text = await response.body.text();
    } catch (error) {
      if (signal?.aborted) throw new RolloutError({ code: 'CANCELLED', message: `${method} ${path} aborted`, cause: error });
      throw new RolloutError({ code: 'UNAVAILABLE', message: `the service's answer to ${method} ${path} broke off: ${(error as Error).message}`, retryable: true, cause: error });
    }
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      value = undefined;
    }
    if (response.statusCode >= 400) {
      const error = (value as { error?: { code?: unknown; message?: unknown; retryable?: unknown; details?: unknown } } | undefined)?.error;
      const code = isCode(error?.code) ? error.code : response.statusCode >= 500 ? 'UNAVAILABLE' : 'BAD_REQUEST';
      throw new RolloutError({
        code,
        message: typeof error?.message === 'string' ? error.message : `${method} ${path} answered ${response.statusCode}: ${text.slice(0, 200)}`,
        retryable: error?.retryable === true || response.statusCode >= 500,
        details: error?.details,
      });
    }
    const parsed = schema.safeParse(value);
    if (!parsed.success) {
      throw new RolloutError({ code: 'INTERNAL', message: `the service's answer to ${method} ${path} is not what this node expects (version skew?): ${text.slice(0, 200)}` });
    }
    return parsed.data;
  }

  #node(nodeId: string): string {
    return `/v1/nodes/${encodeURIComponent(nodeId)}`;
  }

  /** Registers (again, presenting the credential it has); keeps the credential the service answers. */
  async register(registration: NodeRegistration, signal?: AbortSignal): Promise<NodeRegistered> {
    const registered = await this.#call('POST', '/v1/nodes', NodeRegistered, registration, signal ? { signal } : {});
    this.credential = registered.credential;
    this.#serviceFeatures = registered.features ?? [];
    this.#heard(registered.weights);
    return registered;
  }

  /** `generation`: a node calling backends itself says what it heard of the weights and how many of its turns are in flight. */
  async heartbeat(nodeId: string, leases: readonly NodeLease[], signal?: AbortSignal, generation?: NodeGeneration): Promise<HeartbeatAnswer> {
    const answer = await this.#call('POST', `${this.#node(nodeId)}/heartbeat`, HeartbeatAnswer, { leases, ...(generation ? { generation } : {}) }, signal ? { signal } : {});
    this.#heard(answer.weights);
    return answer;
  }

  /** The route of a rollout the node holds (a node calling backends itself); waits as long as the service looks for a healthy backend. */
  async route(nodeId: string, call: NodeRouteRequest, signal: AbortSignal): Promise<NodeRoute> {
    return this.#call('POST', `${this.#node(nodeId)}/route`, NodeRoute, call, { signal, extraMs: 600_000 });
  }

  /**
   * A long poll: answers within `waitMs` (plus the call's limit). Each claim's task is checked
   * against RolloutTask here: a version skew shows now, not mid-rollout.
   */
  async claim(nodeId: string, limit: number, waitMs: number, signal?: AbortSignal): Promise<NodeClaim[]> {
    return (await this.claimWork(nodeId, limit, waitMs, signal)).claims;
  }

  /** A claim, with the tasks the service says are queued next (`upcoming`; none from a service that does not say). */
  async claimWork(nodeId: string, limit: number, waitMs: number, signal?: AbortSignal): Promise<{ claims: NodeClaim[]; upcoming: NodeUpcoming[] }> {
    const answer = await this.#call('POST', `${this.#node(nodeId)}/claim`, NodeClaims, { limit, wait_ms: waitMs }, { extraMs: waitMs, ...(signal ? { signal } : {}) });
    this.#heard(answer.weights);
    const upcoming: NodeUpcoming[] = [];
    // a hint: a task this node cannot read is left out, not an error
    for (const next of answer.upcoming ?? []) {
      const task = RolloutTask.safeParse(next.task);
      if (task.success) upcoming.push({ ...next, task: task.data });
    }
    return { claims: answer.claims.map((claim) => ({ ...claim, task: RolloutTask.parse(claim.task) })), upcoming };
  }

  /**
   * Commits results, each token id sent once (a result's ids, whole in every turn, would be most of
   * the body), or `whole` for a service that does not read that form: an older rollserve, which
   * reads results whole in their camelCase form (today's service reads that too).
   */
  async commit(nodeId: string, commits: readonly NodeCommit[], { signal, whole = false }: { signal?: AbortSignal; whole?: boolean } = {}): Promise<NodeCommitStatus[]> {
    const results = commits.map((commit) => ({ ...commit, result: whole ? toLegacyResult(commit.result) : encodeResult(commit.result) }));
    const answer = await this.#call('POST', `${this.#node(nodeId)}/results`, NodeCommitAnswer, { results }, signal ? { signal } : {});
    return answer.results.map((r) => r.status);
  }

  /** One policy turn; no time limit of its own (generation takes what it takes): aborting `signal` ends it. */
  async modelTurn(nodeId: string, call: NodeModelRequest, signal: AbortSignal): Promise<ModelTurn> {
    return fromWireModelTurn(await this.#call('POST', `${this.#node(nodeId)}/model`, WireModelTurn, call, { signal, extraMs: 24 * 3_600_000 }));
  }

  deregister(nodeId: string): Promise<{ released: number }> {
    return this.#call('DELETE', this.#node(nodeId), Released);
  }

  async nodes(): Promise<NodeView[]> {
    return (await this.#call('GET', '/v1/nodes', NodeList)).nodes;
  }

  async close(): Promise<void> {
    await this.#agent.close();
  }
}
