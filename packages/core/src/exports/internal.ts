// `@rollserve/core/internal`: every name of every room, for rollserve's own packages and tests.
// Not a stable API: what an environment, a tool or a deployment needs is in one of the other doors.
export { createRolloutApi } from '../api/index.ts';
export type { ApiContext, BackendRegistry, RolloutApiOptions } from '../api/index.ts';
export * from '../api/openapi.ts';
export * from '../api/server.ts';
export { warmUp } from '../api/warm-up.ts';
export * from '../errors.ts';
export * from '../gym/index.ts';
export * from '../llm/index.ts';
export * from '../node/index.ts';
export * from '../protocol/index.ts';
export * from '../runner/index.ts';
export * from '../sandbox/index.ts';
export * from '../server/index.ts';
export * from '../service/index.ts';
export * from '../slurm/index.ts';
export * from '../spec/index.ts';
export * from '../store/index.ts';
export * from '../tools/index.ts';
