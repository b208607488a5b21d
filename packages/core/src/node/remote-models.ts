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
  /** Pause time each rollout's turns waited at the service (a weight update), as the service said with each turn. */
  readonly #paused = new Map<string, number>();
  /** When each rollout's turn under way was sent. */
  readonly #sent = new Map<string, number>();
  /**
   * Pauses of generation as heartbeats told of them ([start, end), end Infinity while on): a turn
   * under way waits through them at the service, which says how long only once it answers, and
   * the rollout's deadline must not pass meanwhile.
   */
  #pauses: Array<[number, number]> = [];

  constructor(private readonly options: RemoteModelsOptions) {}

  pausedMs(rolloutId: string): number {
    const told = this.#paused.get(rolloutId) ?? 0;
    const sent = this.#sent.get(rolloutId);
    if (sent === undefined) return told;
    // the turn under way: its overlap with the pauses heard of (the service's own count replaces it once the turn is back)
    const now = performance.now();
    let waiting = 0;
    for (const [start, end] of this.#pauses) waiting += Math.max(0, Math.min(end, now) - Math.max(start, sent));
    return told + waiting;
  }

  /** What the service's heartbeat answer says of a pause of generation. */
  generationPaused(paused: boolean): void {
    const last = this.#pauses.at(-1);
    const on = last !== undefined && last[1] === Number.POSITIVE_INFINITY;
    if (paused && !on) this.#pauses = [...this.#pauses.slice(-15), [performance.now(), Number.POSITIVE_INFINITY]];
    else if (!paused && on) last[1] = performance.now();
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
            this.#sent.set(rolloutId, performance.now());
            let turn: Awaited<ReturnType<typeof client.modelTurn>>;
            try {
              turn = await client.modelTurn(nodeId, { rollout_id: rolloutId, attempt, messages: request.messages, tools: request.tools }, signal);
            } finally {
              this.#sent.delete(rolloutId);
            }
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
    this.#sent.delete(rolloutId);
  }
}
