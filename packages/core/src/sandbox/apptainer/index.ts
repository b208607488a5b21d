export { buildExecArgv, buildInstanceStartArgv, buildInstanceStopArgv, normalizeImage } from './args.ts';
export type { ApptainerExecInput, ApptainerStartInput } from './args.ts';
export { apptainerLimits, createApptainerProvider, findApptainerBinary } from './provider.ts';
export type { ApptainerProviderOptions } from './provider.ts';
