export * from './agent.ts';
export * from './client.ts';
export * from './remote-models.ts';
