import type { RolloutService } from '../service.ts';

/** What `POST /v1/llm-backends` and the service's pool agree on. */
export interface BackendRegistry {
  add(backend: { id?: string; baseUrl: string; model?: string; apiKey?: string; maxConcurrency?: number }): { id: string };
  remove(id: string): boolean;
  list(): unknown[];
}

export interface RolloutApiOptions {
  /** Required as `Authorization: Bearer <token>` on every route but `GET /health` when set. */
  token?: string;
  /** The LLM backends managed at run time. */
  backends?: BackendRegistry;
  /** The model name `/process` uses when its body names none. */
  defaultModel?: string;
}

/** What every route module of the rollout API is built from. */
export interface ApiContext {
  service: RolloutService;
  options: RolloutApiOptions;
}
