// `@rollserve/core/service`: the rollout service and what it stands on: the wire formats, the
// runner and LLM access, the store, the HTTP API and OpenAPI document, and the Slurm
// watch. The store drivers (better-sqlite3, pg) and swagger-ui-dist are loaded when a store of that
// kind is opened or /docs is served, not when this door is imported.
export { createRolloutApi } from '../api/index.ts';
export type { ApiContext, BackendRegistry, RolloutApiOptions } from '../api/index.ts';
export * from '../api/openapi.ts';
export * from '../api/server.ts';
export * from '../llm/index.ts';
export * from '../protocol/index.ts';
export * from '../runner/index.ts';
export * from '../service/index.ts';
export * from '../slurm/index.ts';
export * from '../store/index.ts';
