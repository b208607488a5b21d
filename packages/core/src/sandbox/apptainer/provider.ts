import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RolloutError } from '../../errors.ts';
import { openFilesWithin, resolveSandboxSpec } from '../limits.ts';
import { BASE_ENV, DEFAULT_WORKDIR, type ResolvedSandboxSpec, type SandboxLimitSupport, type SandboxProvider, type SandboxSpec } from '../types.ts';
import { defaultImageCacheDir, defaultMaxCacheBytes, defaultMaxConcurrentUnpacks } from '../image/index.ts';
import { buildInstanceStartArgv } from './args.ts';
import { ApptainerSandbox, pickHostEnv } from './sandbox.ts';
import { isBuiltImage, SifCache, type HeldSif } from './sif-cache.ts';

export interface ApptainerProviderOptions {
  /** A directory holding `apptainer` or `singularity` (NeMo Gym's `bin_path`). Else PATH is searched. */
  binDir?: string;
  /** An explicit binary; wins over `binDir`. */
  binary?: string;
  /** Where the per-sandbox staging directories go. @default os.tmpdir() */
  tmpDir?: string;
  /** Appended to `instance start` (NeMo Gym's `create.extra_start_args`). */
  extraStartArgs?: string[];
  /** Appended to `exec` (NeMo Gym's `exec.extra_exec_args`). */
  extraExecArgs?: string[];
  /**
   * Give each instance a cgroup: `--memory` (totalMemoryMib), `--pids-limit` (maxProcesses) and
   * `--cpus` (cpus). Needs cgroup delegation, often missing on HPC; without it those limits are
   * not kept (their defaults not applied, a spec giving one refused). @default false
   */
  applyResourceLimits?: boolean;
  /** How long `instance start` (an image pull included) may take, and a prefetch's build. @default 600_000 */
  startTimeoutMs?: number;
  /**
   * The image cache whose `sif/` holds the SIFs that `prefetch` builds from `docker://`, `oci:`,
   * `oci-archive:`, `docker-archive:`, `oras://`, `library://` and `shub://` images (an instance
   * of a cached one starts from its SIF); its unpack slots bound the builds. `false`: no SIF
   * cache and no prefetch (every instance starts from its source, as apptainer alone does).
   * @default $ROLLSERVE_IMAGE_CACHE, else `<os.tmpdir()>/rollserve-images` (the bwrap provider's)
   */
  imageCacheDir?: string | false;
  /** The SIFs' cap in bytes (least recently used go first, never one an instance runs on). @default $ROLLSERVE_IMAGE_CACHE_MAX, else none */
  imageCacheMaxBytes?: number;
  /** Builds (and bwrap unpacks) at once on this host. @default $ROLLSERVE_IMAGE_UNPACKS, else 2 */
  maxConcurrentUnpacks?: number;
}

/** `apptainer` or `singularity`, from `binDir` or PATH, whichever is found first. */
export function findApptainerBinary(options: Pick<ApptainerProviderOptions, 'binDir' | 'binary'> = {}): string | undefined {
  if (options.binary !== undefined) return existsSync(options.binary) ? options.binary : undefined;
  const dirs = options.binDir !== undefined ? [options.binDir] : (process.env.PATH ?? '').split(':').filter((d) => d !== '');
  for (const dir of dirs) {
    for (const name of ['apptainer', 'singularity']) {
      const path = join(dir, name);
      if (existsSync(path)) return path;
    }
  }
  return undefined;
}

/**
 * What an apptainer instance keeps: the per-process rlimits (set by `ulimit` inside, around every
 * command), and with `applyResourceLimits` its cgroup's memory, processes and CPUs. Never the
 * sizes and file counts of the workspace, `/tmp` and the output directory: the workspace is a
 * host directory and apptainer has no per-instance tmpfs size.
 */
export function apptainerLimits(options: Pick<ApptainerProviderOptions, 'applyResourceLimits'> = {}): SandboxLimitSupport {
  return {
    memoryMib: 'RLIMIT_AS (ulimit -v)',
    maxFileSizeMib: 'RLIMIT_FSIZE (ulimit -f)',
    cpuSeconds: 'RLIMIT_CPU (ulimit -t)',
    maxOpenFiles: 'RLIMIT_NOFILE (ulimit -n)',
    ...(options.applyResourceLimits === true
      ? { totalMemoryMib: 'the instance cgroup (--memory)', maxProcesses: 'the instance cgroup (--pids-limit)', cpus: 'the instance cgroup (--cpus)' }
      : {}),
  };
}

export function createApptainerProvider(options: ApptainerProviderOptions = {}): SandboxProvider {
  const limits = apptainerLimits(options);
  const binaryOrFail = (): string => {
    const binary = findApptainerBinary(options);
    if (binary === undefined) throw new RolloutError({ code: 'SANDBOX', message: 'neither apptainer nor singularity was found' });
    return binary;
  };
  const sifs =
    options.imageCacheDir === false
      ? undefined
      : new SifCache({
          imageCacheDir: options.imageCacheDir ?? defaultImageCacheDir(),
          maxConcurrentUnpacks: options.maxConcurrentUnpacks ?? defaultMaxConcurrentUnpacks(),
          maxCacheBytes: options.imageCacheMaxBytes ?? defaultMaxCacheBytes(),
          timeoutMs: options.startTimeoutMs ?? 600_000,
        });
  return {
    name: 'apptainer',
    limits: () => ({ ...limits }),
    async create(requested: SandboxSpec = {}) {
      const resolved = resolveSandboxSpec(requested, { name: 'apptainer', limits });
      const spec = { ...resolved, resources: { ...resolved.resources, maxOpenFiles: openFilesWithin(resolved, 'apptainer') } };
      const binary = binaryOrFail();
      if (spec.image === undefined) {
        throw new RolloutError({ code: 'SANDBOX', message: 'the apptainer provider needs spec.image' });
      }
      // a SIF prefetched (or being built) for the image: the instance starts from it, held meanwhile
      const sif: HeldSif | undefined = sifs !== undefined && isBuiltImage(spec.image) ? await sifs.ready(spec.image) : undefined;
      try {
        return await start(binary, spec, sif);
      } catch (error) {
        sif?.release();
        throw error;
      }
    },
    ...(sifs === undefined
      ? {}
      : {
          async prefetch(spec: SandboxSpec) {
            if (spec.image !== undefined && isBuiltImage(spec.image)) await sifs.ensure(binaryOrFail(), spec.image);
          },
          close: () => sifs.close(),
        }),
  };

  async function start(binary: string, spec: ResolvedSandboxSpec, sif: HeldSif | undefined): Promise<ApptainerSandbox> {
    const id = `rs-${randomBytes(6).toString('hex')}`;
    const name = `rollserve-${id}`;
    const base = join(options.tmpDir ?? tmpdir(), `rollserve-${id}`);
    const workspaceHost = join(base, 'workspace');
    const socketHost = join(base, 'sock');
    await mkdir(base, { mode: 0o700 });
    await Promise.all([mkdir(workspaceHost), mkdir(socketHost), mkdir(join(base, 'env'), { mode: 0o700 })]);
    const argv = buildInstanceStartArgv({
      binary,
      image: sif?.path ?? spec.image!,
      name,
      workspaceHost,
      workdir: spec.workdir ?? DEFAULT_WORKDIR,
      socketHost,
      network: spec.network ?? false,
      ...(spec.binds === undefined ? {} : { binds: spec.binds }),
      resources: spec.resources,
      ...(options.applyResourceLimits === undefined ? {} : { applyResourceLimits: options.applyResourceLimits }),
      ...(options.extraStartArgs === undefined ? {} : { extraStartArgs: options.extraStartArgs }),
    });
    // daemonize mode: the instance inherits the output fds, so they go to a file and only the
    // foreground process is awaited
    const log = join(base, 'start.log');
    const fd = openSync(log, 'w', 0o600);
    const code = await new Promise<number>((resolve) => {
      const child = spawn(argv[0]!, argv.slice(1), { env: { ...BASE_ENV, ...pickHostEnv() }, stdio: ['ignore', fd, fd], cwd: base });
      const timer = setTimeout(() => child.kill('SIGKILL'), options.startTimeoutMs ?? 600_000);
      child.on('error', () => resolve(127));
      child.on('exit', (c) => {
        clearTimeout(timer);
        resolve(c ?? 125);
      });
    });
    closeSync(fd);
    const sandbox = new ApptainerSandbox(id, spec.workdir ?? DEFAULT_WORKDIR, socketHost, spec, base, binary, name, options.extraExecArgs, sif?.release);
    const fail = async (message: string): Promise<never> => {
      await sandbox.close();
      throw new RolloutError({ code: 'SANDBOX', message, retryable: true });
    };
    if (code !== 0) await fail(`apptainer instance start failed (${code}): ${readFileSync(log, 'utf8').slice(-2000)}`);
    const probe = await sandbox.exec('printf apptainer-sandbox-ready', { timeoutMs: 30_000, cwd: '/' });
    if (probe.stdout !== 'apptainer-sandbox-ready') await fail(`apptainer instance not ready: ${probe.stderr.slice(-2000)}`);
    await sandbox.writeSpecFiles();
    return sandbox;
  }
}

