export * from './chat.ts';
export * from './nodes.ts';
export * from './python-text.ts';
export * from './responses.ts';
export * from './reward-components.ts';
export * from './rollout.ts';
export * from './sampling.ts';
export * from './training-view.ts';
export { isLegacyResult, toCurrentResult, toLegacyResult } from './legacy-result.ts';
