export * from './errors.ts';
export * from './gym/index.ts';
export * from './protocol/index.ts';
export * from './rollout/index.ts';
export * from './sandbox/index.ts';
export * from './spec/index.ts';
export * from './store/index.ts';
export * from './tools/index.ts';
