import { SOCKET_MOUNT, type ResolvedSandboxResources, type SandboxBind } from '../types.ts';

/**
 * A bare name becomes `docker://<name>`; `.sif`, paths and `scheme://` URIs are kept (NeMo Gym's
 * rule), and so are apptainer's local transports on a path (`oci:`, `oci-archive:`,
 * `docker-archive:`, as the bwrap provider names them); `sif:<path>` is the path.
 */
export function normalizeImage(image: string): string {
  if (image.includes('://')) return image;
  const local = /^(oci|oci-archive|docker-archive|sif):(\.{0,2}\/.*)$/.exec(image);
  if (local !== null) return local[1] === 'sif' ? local[2]! : image;
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
  /** The sandbox's limits (`resolveSandboxSpec`); the per-process ones go to `limitWrapper` instead. */
  resources: ResolvedSandboxResources;
  /**
   * Give the instance a cgroup (needs cgroup delegation) for the limits of the instance as a
   * whole: memory (`--memory`, no swap beyond it), processes (`--pids-limit`), CPUs (`--cpus`).
   */
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
    const { totalMemoryMib, maxProcesses, cpus } = input.resources;
    // (the starter and the processes `exec` brings in count too)
    argv.push('--memory', `${totalMemoryMib}M`, '--memory-swap', `${totalMemoryMib}M`, '--pids-limit', String(maxProcesses + 64));
    if (cpus !== undefined) argv.push('--cpus', String(cpus));
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

