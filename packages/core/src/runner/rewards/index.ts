export * from './assign.ts';
export * from './group.ts';
export * from './normalize.ts';
export * from './settings.ts';
export * from './shaping.ts';
export * from './similarity.ts';
