// The rollout API lives in ./api/ (one module per group of routes); this keeps the old import path.
export { createRolloutApi, toWireGroup, toWireResult, toWireStatus, toWireView } from './api/index.ts';
export type { ApiContext, BackendRegistry, RolloutApiOptions, WireGroup, WireResult, WireStatus, WireView } from './api/index.ts';
