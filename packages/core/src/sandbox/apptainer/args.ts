import { DEFAULT_RESOURCES, SOCKET_MOUNT, type SandboxBind, type SandboxResources } from '../types.ts';

export function normalizeImage(image: string): string {
  if (image.includes('://')) return image;
  if (image.startsWith('/') || image.startsWith('./') || image.startsWith('../') || image.endsWith('.sif')) return image;
  return `docker://${image}`;
}

export interface ApptainerStartInput {
  binary: string;
  image: string;
  name: string;
  workspaceHost: string;
  workdir: string;
  socketHost: string;
  network: boolean;
  binds?: SandboxBind[];
  resources?: SandboxResources;
  applyResourceLimits?: boolean;
  extraStartArgs?: string[];
}

/** `apptainer instance start ...`. Pure: unit-tested as is. */
export function buildInstanceStartArgv(input: ApptainerStartInput): string[] {
  const argv = [input.binary, 'instance', 'start', '--containall', '--writable-tmpfs', '--no-home'];
  if (!input.network) argv.push('--net', '--network', 'none');
  argv.push('--bind', `${input.workspaceHost}:${input.workdir}`, '--bind', `${input.socketHost}:${SOCKET_MOUNT}`);
  for (const bind of input.binds ?? []) argv.push('--bind', `${bind.host}:${bind.sandbox}${bind.readOnly ? ':ro' : ''}`);
  if (input.applyResourceLimits === true) {
    if (input.resources?.cpus !== undefined) argv.push('--cpus', String(input.resources.cpus));
    if (input.resources?.memoryMib !== undefined) argv.push('--memory', `${input.resources.memoryMib}M`);
  }
  argv.push(...(input.extraStartArgs ?? []), normalizeImage(input.image), input.name);
  return argv;
}

export interface ApptainerExecInput {
  binary: string;
  name: string;
  /** Working directory inside the instance. */
  cwd?: string;
  /** A host file of `KEY='value'` lines (the container starts with a clean environment). */
  envFile?: string;
  extraExecArgs?: string[];
  command: string[];
}

/** `apptainer exec [--pwd] [--env-file] instance://<name> <command...>`. Pure. */
export function buildExecArgv(input: ApptainerExecInput): string[] {
  return [
    input.binary,
    'exec',
    ...(input.cwd === undefined ? [] : ['--pwd', input.cwd]),
    ...(input.envFile === undefined ? [] : ['--env-file', input.envFile]),
    ...(input.extraExecArgs ?? []),
    `instance://${input.name}`,
    ...input.command,
  ];
}

export function buildInstanceStopArgv(binary: string, name: string): string[] {
  return [binary, 'instance', 'stop', name];
}

