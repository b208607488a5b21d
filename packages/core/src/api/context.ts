import type { RolloutService } from '../service/service.ts';

/** What `POST /v1/llm-backends` and the service's pool agree on. */
export interface BackendRegistry {
  add(backend: { id?: string; baseUrl: string; model?: string; apiKey?: string; maxConcurrency?: number }): { id: string };
  remove(id: string): boolean;
  list(): unknown[];
}

export interface RolloutApiOptions {
  /** Required as `Authorization: Bearer <token>` on every route but `GET /health` when set. */
  token?: string;
  /**
   * Required instead of `token` on the rollout-node routes (registering, and every call of a node
   * under /v1/nodes/{id}), which then refuse `token`, as every other route refuses this one: a
   * trainer's token cannot act as a node, nor a node's as a trainer. Unset: `token` serves both.
   */
  nodeToken?: string;
  /** The LLM backends managed at run time. */
  backends?: BackendRegistry;
  /** The model name `/process` uses when its body names none. */
  defaultModel?: string;
  /**
   * The largest request body read, in bytes (`/v1/nodes/{id}/results`: 4 times as much, a node's
   * batch of results): a larger one is a 413, refused before it is read whole.
   * @default DEFAULT_MAX_BODY_BYTES (64 MiB)
   */
  maxBodyBytes?: number;
  /**
   * How long a result stream may stay silent before it sends a keep-alive (NDJSON: an empty line;
   * SSE: a `: keep-alive` comment), so that proxies and clients with idle time-outs keep it open.
   * @default DEFAULT_STREAM_KEEP_ALIVE_MS (15 s)
   */
  streamKeepAliveMs?: number;
}

export const DEFAULT_STREAM_KEEP_ALIVE_MS = 15_000;

/** What every route module of the rollout API is built from. */
export interface ApiContext {
  service: RolloutService;
  options: RolloutApiOptions;
}
