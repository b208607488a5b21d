export * from './agent-loop.ts';
export * from './messages.ts';
export * from './model-provider.ts';
export * from './rewards/index.ts';
export { RolloutRunner, type EnvironmentSetups, type RolloutRunnerOptions, type RunnerJob, type RunningRollout } from './runner.ts';
