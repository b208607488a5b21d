import type { CallModel } from './agent-loop.ts';
import { LlmBackendPool, TokenConversation } from '../llm/index.ts';
import { chatCompletion } from '../llm/chat-completion.ts';
import { Weights } from '../llm/weights.ts';
import type { RolloutTask } from '../protocol/rollout.ts';
import type { ChatCompletionOptions, LlmBackendConfig } from '../llm/types.ts';

/** Sends one request of a rollout to its backend (a pool's `send`, or a node's route), resending as the pool does. */
export type SendToBackend = <R extends { latencyMs: number }>(
  call: (backend: LlmBackendConfig, options: ChatCompletionOptions) => Promise<R>,
  signal: AbortSignal,
) => Promise<R>;

/**
 * A rollout's policy turns through `send`, past the pause gate of `weights`: chat completions, or
 * token-in generation keeping the conversation as token ids. Each turn records the version its
 * backend serves as its request is sent. The service's turns and those a node sends itself are
 * made here alike, so their token ids, logprobs and versions are the same.
 */
export function policyCaller(rolloutId: string, policy: RolloutTask['policy'], weights: Weights, send: SendToBackend): CallModel {
  const { max_tokens, ...sampling } = policy.sampling;
  // Token-in generation keeps the rollout's conversation as token ids across its turns.
  const tokens = policy.generation === 'tokens' ? new TokenConversation() : null;
  return async (request, signal) => {
    const chat = {
      messages: request.messages,
      model: policy.model,
      ...(request.tools.length > 0 ? { tools: request.tools } : {}),
      sampling: { ...sampling, ...(max_tokens === undefined ? {} : { max_tokens }) },
    };
    // Each request records the version its backend serves as it is sent (a pause keeps updates
    // from landing mid-generation): the turn keeps its generation's, the last request's.
    const generated = await weights.generate(rolloutId, signal, (gated, started) =>
      tokens
        ? tokens.turn((call) => send((backend, o) => (started(backend.id), call(backend, o)), gated), chat)
        : send((backend, o) => (started(backend.id), chatCompletion(backend, chat, o)), gated),
    );
    const result = generated.value;
    return {
      content: result.message.content,
      reasoning: result.message.reasoning ?? null,
      toolCalls: result.message.toolCalls,
      finishReason: result.finishReason,
      promptTokenIds: result.promptTokenIds,
      generationTokenIds: result.generationTokenIds,
      generationLogprobs: result.generationLogprobs,
      usage: { promptTokens: result.usage.promptTokens, completionTokens: result.usage.completionTokens },
      backend: result.backendId,
      latencyMs: result.latencyMs,
      weightVersion: generated.version,
      pausedMs: generated.pausedMs,
    };
  };
}

/** Where the policy's turns go: one sticky caller per rollout. */
export interface ModelProvider {
  forRollout(rolloutId: string, policy: RolloutTask['policy']): CallModel;
  release(rolloutId: string): void;
  /**
   * The backend a rollout's turns go to when a node calls it itself (see PoolModelProvider.route);
   * only where the provider routes turns itself.
   */
  route?(
    rolloutId: string,
    policy: RolloutTask['policy'],
    options?: { failed?: string | undefined; wait?: boolean; signal?: AbortSignal | undefined },
  ): Promise<{ backend: LlmBackendConfig; headers: Record<string, string> } | undefined>;
  /** The ids of the backends turns may go to now. */
  backendIds?(): string[];
  /**
   * The weight versions and the pause gate of weight updates, where the provider routes turns
   * itself (the service's pool; a node's turns go through the service's).
   */
  readonly weights?: Weights;
  /** Pause time a rollout's turns have waited so far (left out of its time limit). */
  pausedMs?(rolloutId: string): number;
}

/**
 * The service's policy access: the shared backend pool (backends added at run time), or, for a
 * task that names its own `base_url`, a pool of that one server. Either way a rollout sticks to
 * one backend for all its turns.
 */
export class PoolModelProvider implements ModelProvider {
  /** Pools of servers named by tasks (`base_url`), closed when their last rollout is done. */
  readonly #direct = new Map<string, { pool: LlmBackendPool; rollouts: number }>();
  readonly #rolloutPools = new Map<string, { pool: LlmBackendPool; key?: string }>();

  readonly weights: Weights;

  constructor(
    readonly pool: LlmBackendPool,
    weights?: Weights,
  ) {
    this.weights = weights ?? new Weights();
  }

  pausedMs(rolloutId: string): number {
    return this.weights.pausedMs(rolloutId);
  }

  #poolFor(policy: RolloutTask['policy']): { pool: LlmBackendPool; key?: string } {
    if (!policy.base_url) return { pool: this.pool };
    const key = `${policy.base_url}\u0000${policy.api_key ?? ''}`;
    let direct = this.#direct.get(key);
    if (!direct) {
      const pool = new LlmBackendPool();
      pool.add({ id: policy.base_url, baseUrl: policy.base_url, ...(policy.api_key ? { apiKey: policy.api_key } : {}) });
      direct = { pool, rollouts: 0 };
      this.#direct.set(key, direct);
    }
    direct.rollouts++;
    return { pool: direct.pool, key };
  }

  /** The rollout's pool, chosen once (by its task's `base_url`, or the shared one). */
  #entryFor(rolloutId: string, policy: RolloutTask['policy']): { pool: LlmBackendPool; key?: string } {
    let entry = this.#rolloutPools.get(rolloutId);
    if (!entry) {
      entry = this.#poolFor(policy);
      this.#rolloutPools.set(rolloutId, entry);
    }
    return entry;
  }

  forRollout(rolloutId: string, policy: RolloutTask['policy']): CallModel {
    const { pool } = this.#entryFor(rolloutId, policy);
    return policyCaller(rolloutId, policy, this.weights, (call, signal) => pool.send(rolloutId, call, { signal }));
  }

  /**
   * The backend a rollout's turns go to when a node sends them itself: the rollout stuck to it
   * (least in flight, counted until `release`) as its own turns would be. `failed`: a backend
   * that gave the node no response (taken out of rotation if the service's own probe gets none either). Without `wait`, undefined when no
   * backend is healthy now; with it, waits for one as a turn would.
   */
  async route(
    rolloutId: string,
    policy: RolloutTask['policy'],
    { failed, wait = false, signal }: { failed?: string | undefined; wait?: boolean; signal?: AbortSignal | undefined } = {},
  ): Promise<{ backend: LlmBackendConfig; headers: Record<string, string> } | undefined> {
    const { pool } = this.#entryFor(rolloutId, policy);
    if (failed !== undefined) await pool.failed(failed, `a node's request to ${failed} got no response`);
    const backend = wait ? await pool.acquire(rolloutId, { signal }) : pool.tryAcquire(rolloutId);
    return backend && { backend, headers: pool.requestHeaders(rolloutId) };
  }

  /** The ids of the backends turns may go to now (the shared pool's and those of tasks' own `base_url`s). */
  backendIds(): string[] {
    return [...this.pool.list().map((backend) => backend.id), ...[...this.#direct.values()].flatMap((direct) => direct.pool.list().map((backend) => backend.id))];
  }

  release(rolloutId: string): void {
    const entry = this.#rolloutPools.get(rolloutId);
    if (!entry) return;
    this.#rolloutPools.delete(rolloutId);
    this.weights.forget(rolloutId);
    entry.pool.release(rolloutId);
    const direct = entry.key === undefined ? undefined : this.#direct.get(entry.key);
    if (direct && --direct.rollouts === 0) {
      this.#direct.delete(entry.key!);
      void direct.pool.close();
    }
  }

  async close(): Promise<void> {
    await Promise.all([this.pool.close(), ...[...this.#direct.values()].map((direct) => direct.pool.close())]);
  }
}
