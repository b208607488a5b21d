import type { Agent } from 'undici';
import { RolloutError } from '../errors.ts';
import { createLlmAgent } from '../llm/chat-completion.ts';
import { LlmBackendError } from '../llm/llm-error.ts';
import type { ChatCompletionOptions, LlmBackendConfig } from '../llm/types.ts';
import { Weights } from '../llm/weights.ts';
import { DIRECT_BACKENDS_FEATURE, type NodeClaim, type NodeGeneration, type NodeRoute, type NodeWeights } from '../protocol/nodes.ts';
import type { RolloutTask } from '../protocol/rollout.ts';
import type { CallModel } from '../runner/agent-loop.ts';
import { policyCaller } from '../runner/model-provider.ts';
import type { ModelProvider } from '../runner/runner.ts';
import { isRetryable, withRetry, type NodeClient } from './client.ts';
import type { RemoteModelProvider } from './remote-models.ts';

// As the service's pool: a call's sends, counting resends after no response, and its time limit.
const MAX_SENDS = 4;
const REQUEST_TIMEOUT_MS = 600_000;
const CONNECT_TIMEOUT_MS = 5_000;

export interface DirectModelsOptions {
  client: NodeClient;
  nodeId: string;
  /** The turns of a rollout whose service does not hand out routes (an older one): through /model. */
  remote: RemoteModelProvider;
  /** The attempt of the lease under which the node runs a rollout (undefined: not held). */
  attemptOf(rolloutId: string): number | undefined;
  /** Called when the service does not know the node (it restarted) or its credential: resolves once registered again. */
  reregister(): Promise<void>;
  /** Called when the service says the node does not hold the rollout (409): its lease is lost. */
  leaseLost(rolloutId: string): void;
  /** Every turn in flight has ended after a pause was heard of: the service should hear so now. */
  drained(): void;
}

/**
 * The policy of a rollout node that sends its turns to the backends itself. The service picks each
 * rollout's backend (least in flight across the service and every node, sticky for the rollout) and
 * hands it over as a route with the claim (or when asked: no route yet, the backend removed, or it
 * gave no response, which is said, so the service takes it out of rotation); the turns are made by
 * the same code as the service's (runner/model-provider.ts's policyCaller over the llm/ clients),
 * so their token ids, logprobs and records are the same. The weight state comes from the service
 * with the registration, claims and heartbeats: a local Weights gate records each turn's version
 * and holds turns during a pause (aborting or finishing those in flight as the pause says), and the
 * heartbeats tell the service when none is in flight. Against a service that hands out no routes,
 * every turn goes through /model (RemoteModelProvider).
 */
export class DirectModelProvider implements ModelProvider {
  /** The weight state as last heard from the service, and the pause gate of this node's turns. */
  readonly weights = new Weights();
  readonly #options: DirectModelsOptions;
  readonly #routes = new Map<string, NodeRoute>();
  readonly #agents = new Map<string, Agent>();
  /** Epoch of the weight state heard last (states from crossing answers: the greatest wins). */
  #epoch = 0;
  /** The service's backends as last heard (a route to another is asked for again). */
  #backends: ReadonlySet<string> | undefined;
  /** Turns in flight when the pause now on was heard of. */
  #inFlightAtPause = 0;

  constructor(options: DirectModelsOptions) {
    this.#options = options;
  }

  /** Whether the service takes up this node's direct calls (as its last registration answered). */
  get direct(): boolean {
    return this.#options.client.serviceFeatures.includes(DIRECT_BACKENDS_FEATURE);
  }

  /** A weight state the service sent (see NodeWeights). */
  heard(state: NodeWeights): void {
    if (state.epoch < this.#epoch) return;
    // (the backends' list changes without the weights: any answer as new as the weights heard tells it)
    this.#backends = new Set(state.backends);
    if (state.epoch === this.#epoch) return;
    this.#epoch = state.epoch;
    const mode = this.weights.state().pause?.mode;
    if (state.pause && mode === undefined) this.#inFlightAtPause = this.weights.inFlight;
    if (state.pause && mode !== state.pause.mode) {
      // closes the gate, aborts ('abort') or waits for ('finish') what is in flight; then says so at once
      void this.weights.pause(state.pause.mode).then(() => this.#options.drained());
    }
    this.weights.restore({ newest: state.newest, default: state.default, backends: state.versions, pause: state.pause });
  }

  /** What the node's heartbeat tells the service of its turns (undefined: not calling backends itself). */
  generation(): NodeGeneration | undefined {
    if (!this.direct) return undefined;
    const paused = this.weights.paused;
    return { epoch: this.#epoch, paused, in_flight: this.weights.inFlight, in_flight_at_pause: paused ? this.#inFlightAtPause : 0 };
  }

  /** A claim came in: its route, if it brought one. */
  claimed(claim: NodeClaim): void {
    if (claim.route) this.#routes.set(claim.rollout_id, claim.route);
    else this.#routes.delete(claim.rollout_id);
  }

  /**
   * The node registered again (its service restarted, or lost it for a while): each rollout asks
   * for its route again at its next turn, so that the service counts it as its backend's load
   * again (sticky: the same backend while the service still has it).
   */
  registeredAgain(): void {
    this.#routes.clear();
  }

  generationPaused(paused: boolean): void {
    this.#options.remote.generationPaused(paused);
  }

  pausedMs(rolloutId: string): number {
    return this.weights.pausedMs(rolloutId) + this.#options.remote.pausedMs(rolloutId);
  }

  forRollout(rolloutId: string, policy: RolloutTask['policy']): CallModel {
    if (!this.direct) return this.#options.remote.forRollout(rolloutId, policy);
    return policyCaller(rolloutId, policy, this.weights, (call, signal) => this.#send(rolloutId, call, signal));
  }

  /** One request of a rollout on its route; sent again on a new route when the backend gives no response. */
  async #send<R extends { latencyMs: number }>(rolloutId: string, call: (backend: LlmBackendConfig, options: ChatCompletionOptions) => Promise<R>, signal: AbortSignal): Promise<R> {
    let failed: string | undefined;
    for (let sends = 1; ; sends++) {
      const route = await this.#routeOf(rolloutId, signal, failed);
      const { id, base_url: baseUrl, model, api_key: apiKey, max_concurrency: maxConcurrency } = route.backend;
      const backend: LlmBackendConfig = { id, baseUrl, ...(model === undefined ? {} : { model }), ...(apiKey === undefined ? {} : { apiKey }), ...(maxConcurrency === undefined ? {} : { maxConcurrency }) };
      try {
        return await call(backend, { signal, timeoutMs: REQUEST_TIMEOUT_MS, headers: route.headers, dispatcher: this.#agent(baseUrl, maxConcurrency) });
      } catch (error) {
        if (!LlmBackendError.isConnectFailure(error) || signal.aborted || sends >= MAX_SENDS) throw error;
        failed = id;
        this.#routes.delete(rolloutId);
      }
    }
  }

  /** The rollout's route: the one it has while its backend is the service's, else a new one from the service. */
  async #routeOf(rolloutId: string, signal: AbortSignal, failed: string | undefined): Promise<NodeRoute> {
    const held = this.#routes.get(rolloutId);
    const attempt = this.#options.attemptOf(rolloutId);
    if (attempt === undefined) throw new RolloutError({ code: 'CANCELLED', message: `rollout "${rolloutId}" is no longer held by this node` });
    if (held && held.attempt === attempt && failed === undefined && (this.#backends === undefined || this.#backends.has(held.backend.id))) return held;
    const { client, nodeId } = this.#options;
    let registeredAgain = false;
    const route = await withRetry(
      async () => {
        try {
          return await client.route(nodeId, { rollout_id: rolloutId, attempt, ...(failed === undefined ? {} : { failed }) }, signal);
        } catch (error) {
          // an unknown node (the service restarted) or a credential not taken: register again, then try once more
          if (RolloutError.isInstance(error) && (error.code === 'NOT_FOUND' || error.code === 'UNAUTHORIZED') && !registeredAgain) {
            registeredAgain = true;
            await this.#options.reregister();
            throw new RolloutError({ code: 'UNAVAILABLE', message: 'registered again', retryable: true });
          }
          if (RolloutError.isInstance(error) && error.code === 'CONFLICT') this.#options.leaseLost(rolloutId);
          throw error;
        }
      },
      { signal, retryable: (error) => isRetryable(error) && RolloutError.isInstance(error) && error.code === 'UNAVAILABLE' },
    );
    this.#routes.set(rolloutId, route);
    return route;
  }

  /** One keep-alive connection pool per backend, as the service keeps. */
  #agent(baseUrl: string, maxConcurrency: number | undefined): Agent {
    const key = `${baseUrl}\u0000${maxConcurrency ?? ''}`;
    let agent = this.#agents.get(key);
    if (!agent) {
      agent = createLlmAgent(maxConcurrency, CONNECT_TIMEOUT_MS);
      this.#agents.set(key, agent);
    }
    return agent;
  }

  release(rolloutId: string): void {
    this.#routes.delete(rolloutId);
    this.weights.forget(rolloutId);
    this.#options.remote.release(rolloutId);
  }

  async close(): Promise<void> {
    const agents = [...this.#agents.values()];
    this.#agents.clear();
    await Promise.all(agents.map((agent) => agent.destroy().catch(() => undefined)));
  }
}
