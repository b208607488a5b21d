// `@rollserve/core/gym`: an environment as a NeMo Gym resources server (the Hono app, its launch
// from a NeMo Gym config, /aggregate_metrics) and the serving underneath (bind policy, body reading,
// FastAPI-shaped errors, sessions).
export * from '../gym/index.ts';
export * from '../server/index.ts';
export { loadEnvironment } from '../spec/load-environment.ts';
