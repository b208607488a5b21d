export * from './bind-policy.ts';
export * from './fastapi-errors.ts';
export * from './read-body.ts';
export * from './serve.ts';
export * from './session-store.ts';
