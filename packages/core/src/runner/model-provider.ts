import type { CallModel } from './agent-loop.ts';
import { LlmBackendPool, TokenConversation } from '../llm/index.ts';
import { chatCompletion } from '../llm/chat-completion.ts';
import { Weights } from '../llm/weights.ts';
import type { RolloutTask } from '../protocol/rollout.ts';

/** Where the policy's turns go: one sticky caller per rollout. */
export interface ModelProvider {
  forRollout(rolloutId: string, policy: RolloutTask['policy']): CallModel;
  release(rolloutId: string): void;
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

  forRollout(rolloutId: string, policy: RolloutTask['policy']): CallModel {
    const entry = this.#poolFor(policy);
    const { pool } = entry;
    this.#rolloutPools.set(rolloutId, entry);
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
      const generated = await this.weights.generate(rolloutId, signal, (gated, started) =>
        tokens
          ? tokens.turn((call) => pool.send(rolloutId, (backend, o) => (started(backend.id), call(backend, o)), { signal: gated }), chat)
          : pool.send(rolloutId, (backend, o) => (started(backend.id), chatCompletion(backend, chat, o)), { signal: gated }),
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
