export { agentScript } from './agent.ts';
export { buildBwrapArgs, buildEnterArgs, DEFAULT_HOST_ROOT_DIRS, INPUT_MOUNT, ownNamespaces, scanRoot } from './args.ts';
export type { BwrapArgsInput, BwrapEnterInput, EnterableNamespace, RootEntry } from './args.ts';
export { bwrapAvailable, createBwrapProvider } from './provider.ts';
export type { BwrapProviderOptions } from './provider.ts';
