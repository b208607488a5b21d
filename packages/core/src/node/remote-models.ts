import { RolloutError } from '../errors.ts';
import type { CallModel } from '../runner/agent-loop.ts';
import type { ModelProvider } from '../runner/runner.ts';
import type { RolloutTask } from '../protocol/rollout.ts';
import { isRetryable, withRetry, type NodeClient } from './client.ts';

export interface RemoteModelsOptions {
  client: NodeClient;
  /** The node's id (fixed for its life). */
  nodeId: string;
  /** The attempt of the lease under which the node runs a rollout (undefined: not held). */
  attemptOf(rolloutId: string): number | undefined;
  /** Called when the service does not know the node (it restarted) or its credential: resolves once registered again. */
  reregister(): Promise<void>;
  /** Called when the service says the node does not hold the rollout (409): its lease is lost. */
  leaseLost(rolloutId: string): void;
}

/**
 * The policy of a rollout node: each turn goes to the central service (POST /v1/nodes/{id}/model),
 * which routes it through its LLM backends, least in flight and sticky per rollout. A turn the
 * service could not be reached for is sent again until the rollout is aborted (lease loss aborts
 * it); aborting the rollout aborts the request, and with it the service's call to the backend.
 */
export class RemoteModelProvider implements ModelProvider {
  /** Pause time each rollout's turns waited at the service (a weight update), known once each turn is back. */
  readonly #paused = new Map<string, number>();

  constructor(private readonly options: RemoteModelsOptions) {}

  pausedMs(rolloutId: string): number {
    return this.#paused.get(rolloutId) ?? 0;
  }

  forRollout(rolloutId: string, _policy: RolloutTask['policy']): CallModel {
    const { client, nodeId } = this.options;
    return (request, signal) => {
      let registeredAgain = false;
      return withRetry(
        async () => {
          const attempt = this.options.attemptOf(rolloutId);
          if (attempt === undefined) throw new RolloutError({ code: 'CANCELLED', message: `rollout "${rolloutId}" is no longer held by this node` });
          try {
            const turn = await client.modelTurn(nodeId, { rollout_id: rolloutId, attempt, messages: request.messages, tools: request.tools }, signal);
            if (turn.pausedMs > 0) this.#paused.set(rolloutId, (this.#paused.get(rolloutId) ?? 0) + turn.pausedMs);
            return turn;
          } catch (error) {
            // an unknown node (the service restarted) or a credential not taken: register again, then try once more
            if (RolloutError.isInstance(error) && (error.code === 'NOT_FOUND' || error.code === 'UNAUTHORIZED') && !registeredAgain) {
              registeredAgain = true;
              await this.options.reregister();
              throw new RolloutError({ code: 'UNAVAILABLE', message: 'registered again', retryable: true });
            }
            if (RolloutError.isInstance(error) && error.code === 'CONFLICT') this.options.leaseLost(rolloutId);
            throw error;
          }
        },
        // a backend's own failure (502/504) is the service's answer after its retries: the turn's error
        { signal, retryable: (error) => isRetryable(error) && RolloutError.isInstance(error) && error.code === 'UNAVAILABLE' },
      );
    };
  }

  release(rolloutId: string): void {
    // The service forgets a rollout's backend when its lease ends.
    this.#paused.delete(rolloutId);
  }
}
