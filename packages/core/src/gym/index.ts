export * from './launch.ts';
export * from './metrics.ts';
export * from './nemo-gym-config.ts';
export * from './pass-at-k.ts';
export * from './resources-server.ts';
