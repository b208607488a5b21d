import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chownSync, existsSync, mkdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RolloutError } from '../../errors.ts';
import { createSandboxCgroup } from '../cgroup.ts';
import { isImageReference, overlayPrefix, overlayRoot, resolveImage, type ResolvedImage } from '../image/index.ts';
import { BASE_ENV, DEFAULT_RESOURCES, DEFAULT_WORKDIR, type SandboxProvider, type SandboxSpec } from '../types.ts';
import { agentScript } from './agent.ts';
import { buildBwrapArgs, DEFAULT_HOST_ROOT_DIRS, DEVICES, scanRoot, type RootEntry } from './args.ts';
import { BwrapSandbox } from './sandbox.ts';

export interface BwrapProviderOptions {
  /** The bwrap binary. @default 'bwrap' */
  bwrapPath?: string;
  /**
   * Host uid and gid the sandbox runs as when the service runs as root (root is exempt from
   * RLIMIT_NPROC). Ignored otherwise: an unprivileged service runs sandboxes as itself.
   * @default { uid: 65534, gid: 65534 }
   */
  user?: { uid: number; gid: number };
  /**
   * Where the per-sandbox temporary directories go; it must be searchable by the sandbox uid (the
   * bind mounts are made as that uid). @default os.tmpdir()
   */
  tmpDir?: string;
  /**
   * The image cache (see `resolveImage`); it and its parents must be searchable by the sandbox uid.
   * @default $ROLLSERVE_IMAGE_CACHE, else `<os.tmpdir()>/rollserve-images`
   */
  imageCacheDir?: string;
  /** Top-level host directories bound read-only when the spec has no image. */
  hostRootDirs?: string[];
  /**
   * Give each sandbox a cgroup (memory and processes of the sandbox as a whole) where one can be
   * had (`cgroupSupport()`). @default true
   */
  cgroups?: boolean;
  /** How long `create` waits for the sandbox to run. @default 10_000 */
  readyTimeoutMs?: number;
  /**
   * Sandboxes kept started ahead of demand (for specs without image, network, binds, resources or
   * a custom workdir): `create` then only hands one out. `provider.close()` ends them.
   * @default 0
   */
  warm?: number;
}


/** The ids a sandbox on an image whose user is root runs as (see `start`). */
const IMAGE_ROOT_IDS = { uid: 65534, gid: 65534 };

/** Whether bwrap is usable here (a binary on PATH and user namespaces allowed). */
export function bwrapAvailable(bwrapPath = 'bwrap'): boolean {
  if (process.platform !== 'linux') return false;
  if (bwrapPath.includes('/')) return existsSync(bwrapPath);
  return (process.env.PATH ?? '').split(':').some((dir) => dir !== '' && existsSync(join(dir, bwrapPath)));
}

/** Specs a warm (pre-started) sandbox can serve: the defaults, plus env and files. */
function poolable(spec: SandboxSpec): boolean {
  return (
    spec.image === undefined &&
    spec.network !== true &&
    spec.binds === undefined &&
    spec.resources === undefined &&
    (spec.workdir === undefined || spec.workdir === DEFAULT_WORKDIR)
  );
}

export function createBwrapProvider(options: BwrapProviderOptions = {}): SandboxProvider {
  const bwrapPath = options.bwrapPath ?? 'bwrap';
  const isRoot = process.getuid?.() === 0;
  const user = isRoot ? (options.user ?? { uid: 65534, gid: 65534 }) : undefined;
  const readyTimeoutMs = options.readyTimeoutMs ?? 10_000;
  const warm = options.warm ?? 0;
  let hostEntries: RootEntry[] | undefined;
  const pool: BwrapSandbox[] = [];
  let filling = 0;
  let providerClosed = false;

  async function start(requested: SandboxSpec): Promise<BwrapSandbox> {
    let image: ResolvedImage | undefined;
    let spec = requested;
    if (spec.image !== undefined && isImageReference(spec.image)) {
      image = await resolveImage(spec.image, {
        ...(options.imageCacheDir === undefined ? {} : { cacheDir: options.imageCacheDir }),
        ...(user === undefined ? {} : { owner: user }),
      });
      // the image's Env under the spec's, so that exec and entering processes (PTY, kernel) have it
      spec = { ...spec, env: { ...image.config.env, ...spec.env } };
    }
    const id = `rs-${randomBytes(6).toString('hex')}`;
    const base = join(options.tmpDir ?? tmpdir(), `rollserve-${id}`);
    const inputHost = join(base, 'in');
    const workdir = spec.workdir ?? image?.config.workdir ?? DEFAULT_WORKDIR;
    const layerDir = join(base, 'layer');
    // an image: bwrap starts inside the namespace that holds the sandbox's overlay (image/overlay.ts)
    const overlay = image === undefined ? undefined : overlayPrefix(image.rootfs, layerDir, { ...DEFAULT_RESOURCES, ...spec.resources }.workspaceMib * 1024 * 1024);
    // synchronous on purpose: tiny syscalls beat thread-pool round trips
    mkdirSync(base, { mode: 0o700 });
    try {
      mkdirSync(inputHost, { mode: 0o755 });
      if (image !== undefined) mkdirSync(layerDir, { mode: 0o700 });
      // bwrap makes its mounts as the sandbox uid: it must be able to reach the input directory
      if (user !== undefined) chownSync(base, user.uid, user.gid);
    } catch (error) {
      await rm(base, { recursive: true, force: true });
      throw error;
    }
    const resources = { ...DEFAULT_RESOURCES, ...spec.resources };
    const cgroup = options.cgroups === false ? undefined : createSandboxCgroup(`rollserve-${id}`, {
      memoryBytes: resources.totalMemoryMib * 1024 * 1024,
      // the agent and the processes entering from outside count too
      maxProcesses: resources.maxProcesses + 64,
    });
    const root = spec.image ?? '/';
    let entries: RootEntry[];
    if (image !== undefined) entries = [];
    else if (spec.image === undefined) entries = hostEntries ??= scanRoot('/', options.hostRootDirs ?? DEFAULT_HOST_ROOT_DIRS);
    else entries = scanRoot(spec.image);
    const args = buildBwrapArgs({
      root,
      entries,
      workdir,
      inputHost,
      network: spec.network ?? false,
      ...(spec.resources === undefined ? {} : { resources: spec.resources }),
      ...(spec.binds === undefined ? {} : { binds: spec.binds }),
      devices: DEVICES.filter((device) => existsSync(`/dev/${device}`)),
      env: BASE_ENV,
      command: ['/bin/sh', '-c', agentScript(spec.resources)],
      ...(image === undefined ? {} : { writableRoot: overlayRoot(layerDir) }),
      // Never root inside: a process entering the sandbox (nsenter) gets every capability of its
      // user namespace back when it execs as root there, and could undo the sandbox's mounts.
      // The image's files belong to whichever uid the sandbox has, so an image's root runs as
      // nobody (65534, in nearly every image's passwd) with the same access to them.
      ...(image === undefined ? {} : { ids: image.config.user ?? IMAGE_ROOT_IDS }),
    });
    const argv = [...(overlay ?? []), bwrapPath, ...args];
    // as root, Node itself drops to the sandbox uid (libuv also clears the supplementary groups):
    // one exec less than `setpriv` on the hot path
    const init = spawn(argv[0]!, argv.slice(1), {
      env: { ...BASE_ENV },
      cwd: '/',
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
      ...(user === undefined ? {} : { uid: user.uid, gid: user.gid }),
    });
    const sandbox = new BwrapSandbox(id, workdir, spec, init, user, cgroup, inputHost, [base]);
    try {
      const initPid = await waitReady(init, readyTimeoutMs);
      sandbox.started(initPid);
    } catch (error) {
      await sandbox.abort();
      throw error;
    }
    return sandbox;
  }

  function refill(): void {
    while (!providerClosed && pool.length + filling < warm) {
      filling++;
      start({}).then(
        (sandbox) => {
          filling--;
          if (providerClosed) void sandbox.close();
          else pool.push(sandbox);
        },
        () => {
          filling--;
        },
      );
    }
  }
  refill();

  return {
    name: 'bwrap',
    async create(spec: SandboxSpec = {}) {
      let sandbox: BwrapSandbox | undefined;
      if (warm > 0 && poolable(spec)) {
        while (sandbox === undefined && pool.length > 0) {
          const candidate = pool.shift()!;
          if (candidate.alive()) sandbox = candidate;
          else void candidate.close();
        }
        refill();
        sandbox?.adopt(spec);
      }
      sandbox ??= await start(spec);
      await sandbox.writeSpecFiles();
      return sandbox;
    },
    async close() {
      providerClosed = true;
      await Promise.all(pool.splice(0).map((sandbox) => sandbox.close()));
    },
  };
}

/** Resolves with the sandbox init's host pid once it runs (bwrap's --info-fd, then the init's "R"). */
function waitReady(init: ChildProcess, timeoutMs: number): Promise<number> {
  return new Promise((resolve, reject) => {
    let info = '';
    let ready = false;
    let initPid: number | undefined;
    let stderr = '';
    const infoStream = init.stdio[3] as NodeJS.ReadableStream;
    const done = (error?: Error): void => {
      clearTimeout(timer);
      init.stdout!.removeListener('data', onStdout);
      infoStream.removeListener('data', onInfo);
      init.removeListener('exit', onExit);
      init.removeListener('error', onError);
      if (error !== undefined) reject(error);
      else resolve(initPid!);
    };
    const check = (): void => {
      if (ready && initPid !== undefined) done();
    };
    const onInfo = (chunk: Buffer): void => {
      info += chunk.toString('utf8');
      const match = /"child-pid"\s*:\s*(\d+)/.exec(info);
      if (match !== null) {
        initPid = Number(match[1]);
        check();
      }
    };
    const onStdout = (chunk: Buffer): void => {
      if (chunk.includes('R')) {
        ready = true;
        check();
      }
    };
    const fail = (message: string, cause?: unknown): RolloutError =>
      new RolloutError({ code: 'SANDBOX', message, cause, retryable: true });
    const onExit = (code: number | null): void => {
      // give stderr a moment to arrive
      setTimeout(() => done(fail(`bwrap exited with ${code} before the sandbox ran: ${stderr.trim()}`)), 5);
    };
    const onError = (error: Error): void => done(fail(`cannot start bwrap: ${error.message}`, error));
    const timer = setTimeout(() => done(fail(`sandbox not ready after ${timeoutMs} ms: ${stderr.trim()}`)), timeoutMs);
    init.stderr!.on('data', (chunk: Buffer) => {
      stderr += chunk.toString('utf8');
    });
    infoStream.on('data', onInfo);
    init.stdout!.on('data', onStdout);
    init.once('exit', onExit);
    init.once('error', onError);
  });
}

