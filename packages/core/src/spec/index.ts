export * from './context.ts';
export * from './environment.ts';
export * from './tool.ts';
export * from './invoke-tool.ts';
export * from './builtin-tools.ts';
export * from './load-environment.ts';
