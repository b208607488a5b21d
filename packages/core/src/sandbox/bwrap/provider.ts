import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chownSync, existsSync, mkdirSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Writable } from 'node:stream';
import { RolloutError } from '../../errors.ts';
import { cgroupCpuSupport, cgroupSupport, createSandboxCgroup } from '../cgroup.ts';
import { isImageReference, overlayPrefix, overlayRoot, resolveImage, rootOverlayPrefix, type ResolvedImage } from '../image/index.ts';
import { inodeShares, openFilesWithin, resolveSandboxSpec, shmMib } from '../limits.ts';
import { childrenOf } from '../process.ts';
import { markSandboxDir, mountPointDir } from '../staging.ts';
import { BASE_ENV, DEFAULT_WORKDIR, type ResolvedSandboxSpec, type SandboxLimitSupport, type SandboxProvider, type SandboxSpec } from '../types.ts';
import { agentScript } from './agent.ts';
import { ARGS_FD, buildBwrapArgs, bwrapArgsOnFd, DEFAULT_HOST_ROOT_DIRS, DEVICES, scanRoot, type BwrapArgsInput, type RootEntry } from './args.ts';
import { tmpfsMountsAvailable, tmpfsPrefix, type TmpfsMount } from './mounts.ts';
import { KernelForkServers } from './fork-server.ts';
import { Spawner, SPAWNER_ALIVE_FD, spawnerAvailable, type InitProcess } from './spawner.ts';
import { BwrapSandbox, removeCgroup } from './sandbox.ts';

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
   * bind mounts are made as that uid). @default /dev/shm where it is a tmpfs, no TMPDIR is set and
   * the sandboxes' tmpfs mounts can be made (the directories are empty mount points then), else
   * os.tmpdir() (staging.ts mountPointDir)
   */
  tmpDir?: string;
  /**
   * The image cache (see `resolveImage`): the service's alone (mode 0700); sandboxes see an image
   * only through their overlay. @default $ROLLSERVE_IMAGE_CACHE, else `<os.tmpdir()>/rollserve-images`
   */
  imageCacheDir?: string;
  /**
   * The image cache's cap in bytes: least recently used images go, never one a sandbox runs on
   * (see `resolveImage`'s maxCacheBytes). @default $ROLLSERVE_IMAGE_CACHE_MAX, else no cap
   */
  imageCacheMaxBytes?: number;
  /** First uses (unpacks) of images at once on this host. @default $ROLLSERVE_IMAGE_UNPACKS, else 2 */
  maxConcurrentUnpacks?: number;
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
   * Sandboxes kept started ahead of demand, per spec (its network, workdir and resources; not
   * for an image or binds): `create` then only hands one out, never one handed out before, with
   * the spec's env and files. A number: that many for each spec asked for, and for the default
   * spec from the start. 'auto': for a spec asked for again within 10 s, as many as the demand of
   * the last 2 s needs while sandboxes start, at most two per core over all specs; none once a
   * spec is not asked for during 10 s (an idle provider keeps nothing running). Warm sandboxes
   * are the provider's: `provider.close()` ends them. `createSandboxProvider()` (the service's
   * and NeMo Gym's default) passes 'auto'.
   * @default 0
   */
  warm?: number | 'auto';
  /**
   * Start Python kernels (`Sandbox.forkKernel`) as forks of a fork server per interpreter that
   * has imported the kernel and IPython once (fork-server.ts), in sandboxes without image or
   * binds. @default true
   */
  kernelForkServer?: boolean;
}


/** Files the output tmpfs may hold: the exec channel's two per command in flight, the kernel's socket. */
const OUTPUT_INODES = 4096;
/** Files the input tmpfs may hold: a command's script and stdin per command in flight, staged files. */
const INPUT_INODES = 4096;
/** What an overlay's writable layer holds besides the sandbox's files (its root, upper, work, root and work/work). */
const OVERLAY_INODES = 8;

/** The ids a sandbox on an image whose user is root runs as (see `start`). */
const IMAGE_ROOT_IDS = { uid: 65534, gid: 65534 };

/** Whether bwrap is usable here (a binary on PATH and user namespaces allowed). */
export function bwrapAvailable(bwrapPath = 'bwrap'): boolean {
  if (process.platform !== 'linux') return false;
  if (bwrapPath.includes('/')) return existsSync(bwrapPath);
  return (process.env.PATH ?? '').split(':').some((dir) => dir !== '' && existsSync(join(dir, bwrapPath)));
}

/**
 * The pool a spec's sandboxes come from: sandboxes started for one spec serve any spec with the
 * same key (env and files are handed over, see `adopt`). None for an image or binds. Whether the
 * spec gave a limit only a cgroup keeps is part of it: a sandbox that started without its cgroup
 * (see `cgroupUnjoinable`) must not serve a spec that requires one.
 */
function poolKey(spec: ResolvedSandboxSpec): string | undefined {
  if (spec.image !== undefined || spec.binds !== undefined) return undefined;
  const needsCgroup = spec.given.has('totalMemoryMib') || spec.given.has('cpus');
  return JSON.stringify([spec.network === true, spec.workdir ?? DEFAULT_WORKDIR, spec.resources, needsCgroup]);
}

/** An 'auto' pool with no demand for this long is emptied; a spec asked for again within it gets one. */
const IDLE_MS = 10_000;
/** The window over which an 'auto' pool counts its demand. */
const DEMAND_WINDOW_MS = 2_000;

interface WarmPool {
  /** The spec its sandboxes start with (no env, no files). */
  spec: ResolvedSandboxSpec;
  sandboxes: BwrapSandbox[];
  filling: number;
  /** When `create` asked (within DEMAND_WINDOW_MS), for 'auto'. */
  asks: number[];
  /**
   * 'auto': the spec was asked for twice within IDLE_MS. A spec asked for once keeps nothing
   * ahead: where every rollout's spec is its own, a warm sandbox would be a start for nothing.
   */
  repeated: boolean;
  /** When `create` last asked (for `repeated` and the idle sweep). */
  lastAsk: number;
  /** Wall time of a start, moving average (ms), for 'auto'. */
  startMs: number;
}

export function createBwrapProvider(options: BwrapProviderOptions = {}): SandboxProvider {
  const bwrapPath = options.bwrapPath ?? 'bwrap';
  const isRoot = process.getuid?.() === 0;
  const user = isRoot ? (options.user ?? { uid: 65534, gid: 65534 }) : undefined;
  const readyTimeoutMs = options.readyTimeoutMs ?? 10_000;
  const warm = options.warm ?? 0;
  const maxAuto = 2 * availableParallelism();
  let hostEntries: RootEntry[] | undefined;
  const pools = new Map<string, WarmPool>();
  let idleTimer: NodeJS.Timeout | undefined;
  let providerClosed = false;
  const rootNames = (options.hostRootDirs ?? DEFAULT_HOST_ROOT_DIRS).filter((name) => existsSync(join('/', name)));
  const forkServers = options.kernelForkServer === false ? undefined : new KernelForkServers(new Set(rootNames));
  // bwrap and its prefix are started by the spawner (spawner.ts), not forked from this process
  const useSpawner = spawnerAvailable();
  let spawner: Spawner | undefined;
  const currentSpawner = (): Spawner | undefined => {
    if (!useSpawner || providerClosed) return undefined;
    if (spawner === undefined || !spawner.alive()) spawner = new Spawner();
    return spawner;
  };
  // a root service's bash tool shells are started by a spawner of their own, started at the
  // first: the sandboxes' spawner's loop waits in every sandbox's cgroup join (cgroup v1: up to
  // tens of ms under load), which a shell's start would wait behind
  let shellSpawner: Spawner | undefined;
  const currentShellSpawner = (): Spawner | undefined => {
    if (!useSpawner || providerClosed || !isRoot) return undefined;
    if (shellSpawner === undefined || !shellSpawner.alive()) shellSpawner = new Spawner();
    return shellSpawner;
  };

  const cgroups = options.cgroups !== false && cgroupSupport() !== null;
  const mountTmpfs = tmpfsMountsAvailable(user);
  const limits: SandboxLimitSupport = {
    memoryMib: 'RLIMIT_AS',
    maxFileSizeMib: 'RLIMIT_FSIZE',
    cpuSeconds: 'RLIMIT_CPU',
    maxOpenFiles: 'RLIMIT_NOFILE',
    maxProcesses: `RLIMIT_NPROC in the sandbox's user namespace${cgroups ? ' and the cgroup\'s pids.max' : ''}`,
    workspaceMib: 'tmpfs size',
    tmpMib: 'tmpfs size',
    outputMib: 'tmpfs size',
    ...(mountTmpfs ? { maxInodes: 'tmpfs nr_inodes' } : {}),
    ...(cgroups ? { totalMemoryMib: `cgroup v${cgroupSupport()} memory limit` } : {}),
    ...(cgroups && cgroupCpuSupport() ? { cpus: `cgroup v${cgroupSupport()} CPU quota` } : {}),
  };

  /** The image cache's options of this provider. */
  const imageOptions = {
    ...(options.imageCacheDir === undefined ? {} : { cacheDir: options.imageCacheDir }),
    ...(options.imageCacheMaxBytes === undefined ? {} : { maxCacheBytes: options.imageCacheMaxBytes }),
    ...(options.maxConcurrentUnpacks === undefined ? {} : { maxConcurrentUnpacks: options.maxConcurrentUnpacks }),
    // (as root the unpack tools run as the sandbox uid: no more privilege than the sandbox has)
    ...(user === undefined ? {} : { unpackAs: user }),
  };

  async function start(requested: ResolvedSandboxSpec): Promise<BwrapSandbox> {
    const openFiles = openFilesWithin(requested, 'bwrap');
    let image: ResolvedImage | undefined;
    let spec = requested;
    if (spec.image !== undefined && isImageReference(spec.image)) {
      // held while the sandbox runs on it: no eviction removes it (released when the sandbox closes)
      image = await resolveImage(spec.image, { hold: true, ...imageOptions });
      // the image's Env under the spec's, so that exec and entering processes (PTY, kernel) have it
      spec = { ...spec, env: { ...image.config.env, ...spec.env } };
    }
    try {
      return await startOn(spec, image, openFiles);
    } catch (error) {
      image?.release?.();
      throw error;
    }
  }

  /** Starts the sandbox on the resolved spec (and image, held: the sandbox releases it when it closes). */
  async function startOn(spec: ResolvedSandboxSpec, image: ResolvedImage | undefined, openFiles: number): Promise<BwrapSandbox> {
    const id = `rs-${randomBytes(6).toString('hex')}`;
    // mount points only (the sandbox's files are in its tmpfs mounts): on a tmpfs as well
    const base = join(options.tmpDir ?? (mountTmpfs ? mountPointDir() : undefined) ?? tmpdir(), `rollserve-${id}`);
    const workdir = spec.workdir ?? image?.config.workdir ?? DEFAULT_WORKDIR;
    const layerDir = join(base, 'layer');
    // an image: bwrap starts inside the namespace that holds the sandbox's overlay (image/overlay.ts)
    const resources = spec.resources;
    const mib = 1024 * 1024;
    // (as root: the image root, the service's, idmapped to the sandbox uid, then the drop to it)
    const overlay =
      image === undefined
        ? undefined
        : user === undefined
          ? overlayPrefix(image.rootfs, layerDir, resources.workspaceMib * mib)
          : rootOverlayPrefix(image.rootfs, layerDir, resources.workspaceMib * mib, user);
    // the tmpfs mounts, of their size and inode count (mounts.ts); +1: each mount's own root
    const shares = inodeShares(resources.maxInodes);
    const mountDir = join(base, 'mnt');
    // The service's files for the sandbox go to a tmpfs as well where one can be mounted: the
    // kernel shows a bind's path within its filesystem in mountinfo (a tmpfs root: "/"), so a
    // host directory bound in would name the service's temporary directory inside the sandbox.
    // Sized for the largest stdin a command can use (an upload fills the workspace or /tmp).
    const inputHost = mountTmpfs ? join(mountDir, 'in') : join(base, 'in');
    const tmpfs: Record<'workspace' | 'tmp' | 'shm' | 'output' | 'input', TmpfsMount> = {
      workspace: { dir: join(mountDir, 'workspace'), sizeBytes: resources.workspaceMib * mib, inodes: shares.workspace + 1, mode: '0755' },
      tmp: { dir: join(mountDir, 'tmp'), sizeBytes: resources.tmpMib * mib, inodes: shares.tmp + 1, mode: '1777' },
      shm: { dir: join(mountDir, 'shm'), sizeBytes: shmMib(resources) * mib, inodes: shares.shm + 1, mode: '1777' },
      output: { dir: join(mountDir, 'output'), sizeBytes: resources.outputMib * mib, inodes: OUTPUT_INODES, mode: '0755' },
      input: { dir: inputHost, sizeBytes: Math.max(resources.workspaceMib, resources.tmpMib) * mib, inodes: INPUT_INODES, mode: '0755' },
    };
    // A root service mounts them as root (mounts.ts): every one, owned by the sandbox uid but the
    // input tmpfs (root's: root writes there), then drops to it; on an image the input tmpfs
    // alone, before the overlay's setup (which drops), and the rest in the overlay's namespace.
    const rootInput = mountTmpfs && user !== undefined;
    const mounted = Object.values(tmpfs).filter((mount) => (image === undefined || mount !== tmpfs.workspace) && !(rootInput && mount === tmpfs.input));
    // on an image the workspace is a directory of the overlay, whose writable layer (upper and
    // work directories, the overlay's root: OVERLAY_INODES) gets the workspace's inode count
    const layer = image === undefined ? undefined : { dir: layerDir, sizeBytes: resources.workspaceMib * mib, inodes: shares.workspace + OVERLAY_INODES };
    // the last prefix stays as bwrap's parent and runs it as pid 1 of a pid namespace: nothing of
    // the sandbox outlives it, and it dies with its maker, the spawner (which dies with this
    // process) or this process (see tmpfsPrefix)
    const maker = currentSpawner();
    // as root the spawner forks the prefix as pid 1 of a pid namespace of its own: the guard is
    // then the spawner itself, with no process or fork of its own per sandbox
    const newPidNamespace = maker !== undefined && rootInput && image === undefined;
    const guard = newPidNamespace ? { maker: maker.pid!, aliveFd: SPAWNER_ALIVE_FD } : { maker: maker?.pid ?? process.pid, waitFd: ARGS_FD };
    // bwrap runs in the sandbox's directory: what tells removeStaleSandboxDirs it is in use (its
    // command line names no host path: bwrapArgsOnFd). The overlay's setup leaves it in /.
    // without an image the mount points are made in a small tmpfs on mountDir, in the prefix's
    // namespace (mounts.ts `scratch`): only base and mountDir are made on the host
    const scratch = mountTmpfs && image === undefined ? { dir: mountDir, inodes: 16, mode: '0700', ...(user === undefined ? {} : { owner: user }) } : undefined;
    const prefix = !mountTmpfs
      ? image === undefined
        ? []
        : ['/bin/sh', '-c', 'cd -- "$0" && exec "$@"', base]
      : rootInput && image === undefined
        ? tmpfsPrefix([], { unshare: false, cwd: base, guard, scratch: scratch!, asRoot: { mounts: [...mounted.map((mount) => ({ ...mount, owner: user! })), tmpfs.input], dropTo: user! } })
        : tmpfsPrefix(mounted, { unshare: image === undefined, cwd: base, guard, ...(scratch === undefined ? {} : { scratch }), ...(layer === undefined ? {} : { remount: layer }) });
    const rootPrefix = rootInput && image !== undefined ? tmpfsPrefix([], { unshare: false, asRoot: { mounts: [tmpfs.input] } }) : [];
    const writable: BwrapArgsInput['writable'] = !mountTmpfs
      ? { sizes: resources }
      : { mounted: { tmp: tmpfs.tmp.dir, shm: tmpfs.shm.dir, output: tmpfs.output.dir, ...(image === undefined ? { workspace: tmpfs.workspace.dir } : {}) } };
    const root = spec.image ?? '/';
    let entries: RootEntry[];
    if (image !== undefined) entries = [];
    else if (spec.image === undefined) entries = hostEntries ??= scanRoot('/', options.hostRootDirs ?? DEFAULT_HOST_ROOT_DIRS);
    else entries = scanRoot(spec.image);
    const command = ['/bin/sh', '-c', agentScript({ ...resources, maxOpenFiles: openFiles })];
    const args = buildBwrapArgs({
      root,
      entries,
      workdir,
      inputHost,
      network: spec.network ?? false,
      writable,
      ...(spec.binds === undefined ? {} : { binds: spec.binds }),
      devices: DEVICES.filter((device) => existsSync(`/dev/${device}`)),
      env: BASE_ENV,
      command,
      ...(image === undefined ? {} : { writableRoot: overlayRoot(layerDir) }),
      // Never root inside: a process entering the sandbox (nsenter) gets every capability of its
      // user namespace back when it execs as root there, and could undo the sandbox's mounts.
      // The image's files belong to whichever uid the sandbox has, so an image's root runs as
      // nobody (65534, in nearly every image's passwd) with the same access to them.
      ...(image === undefined ? {} : { ids: image.config.user ?? IMAGE_ROOT_IDS }),
    });
    const bwrap = bwrapArgsOnFd(args, command);
    // synchronous on purpose: tiny syscalls beat thread-pool round trips
    mkdirSync(base, { mode: 0o700 });
    try {
      markSandboxDir(base);
      if (!mountTmpfs) mkdirSync(inputHost, { mode: 0o755 });
      if (image !== undefined) mkdirSync(layerDir, { mode: 0o700 });
      if (mountTmpfs) {
        mkdirSync(mountDir, { mode: 0o700 });
        if (scratch === undefined) {
          for (const mount of mounted) mkdirSync(mount.dir, { mode: 0o700 });
          if (rootInput) mkdirSync(tmpfs.input.dir, { mode: 0o700 });
        }
      }
      // bwrap (and the tmpfs prefix) make their mounts as the sandbox uid: it must be able to
      // reach the input directory and the mount points (in the scratch tmpfs: its owner)
      if (user !== undefined) {
        chownSync(base, user.uid, user.gid);
        if (mountTmpfs && scratch === undefined) for (const dir of [mountDir, ...mounted.map((mount) => mount.dir)]) chownSync(dir, user.uid, user.gid);
      }
    } catch (error) {
      await rm(base, { recursive: true, force: true });
      throw error;
    }
    const cgroup = !cgroups ? undefined : createSandboxCgroup(`rollserve-${id}`, {
      memoryBytes: resources.totalMemoryMib * mib,
      // the agent and the processes entering from outside count too
      maxProcesses: resources.maxProcesses + 64,
      ...(resources.cpus === undefined ? {} : { cpus: resources.cpus }),
    });
    const needsCgroup = (['totalMemoryMib', 'cpus'] as const).find((limit) => spec.given.has(limit));
    if (cgroup === undefined && needsCgroup !== undefined) {
      await rm(base, { recursive: true, force: true });
      throw new RolloutError({
        code: 'SANDBOX',
        message: `the bwrap sandbox provider cannot keep the limit ${needsCgroup}${needsCgroup === 'cpus' ? '' : ' (total_memory_mib)'}: no cgroup could be made for this sandbox`,
        details: { limit: needsCgroup },
      });
    }
    // on an image the tmpfs prefix runs inside the overlay's namespace (it remounts the layer)
    const argv = image === undefined ? [...prefix, bwrapPath, ...bwrap.argv] : [...rootPrefix, ...overlay!, ...prefix, bwrapPath, ...bwrap.argv];
    // as root, the tmpfs prefix drops to the sandbox uid after mounting the input tmpfs, or where
    // it cannot run Node itself does (libuv also clears the supplementary groups): one exec less
    // than `setpriv` on the hot path; on an image the overlay's setup drops, after idmapping the
    // image root
    const dropTo = user === undefined || image !== undefined || rootInput ? undefined : user;
    let init: InitProcess;
    // the spawner puts its child in the cgroup (it waits for its options meanwhile)
    let cgroupError: string | undefined;
    if (maker !== undefined) {
      try {
        const spawned = await maker.spawn({ argv, env: { ...BASE_ENV }, cwd: base, user: dropTo, newPidNamespace, ...(cgroup === undefined ? {} : { cgroupProcs: cgroup.procsFiles }) });
        init = spawned;
        cgroupError = spawned.cgroupError;
      } catch (error) {
        // (a child the spawner's death took along may still be in it for a moment)
        if (cgroup !== undefined) void removeCgroup(cgroup);
        await rm(base, { recursive: true, force: true });
        throw error;
      }
    } else {
      init = spawn(argv[0]!, argv.slice(1), {
        env: { ...BASE_ENV },
        cwd: base,
        // 3: bwrap's --info-fd; ARGS_FD: its options (4 stays closed: see ARGS_FD)
        stdio: ['pipe', 'pipe', 'pipe', 'pipe', 'ignore', 'pipe'],
        ...(dropTo === undefined ? {} : { uid: dropTo.uid, gid: dropTo.gid }),
      });
    }
    const sandbox = new BwrapSandbox(id, workdir, { ...spec, resources: { ...resources, maxOpenFiles: openFiles } }, init, user, cgroup, { host: inputHost, mounted: mountTmpfs }, [base], image?.release);
    // the host's root as it is: a fork of the host's interpreter is the sandbox's
    if (spec.image === undefined && spec.binds === undefined) sandbox.forkServers = forkServers;
    sandbox.spawner = maker;
    if (maker !== undefined) sandbox.shellSpawner = currentShellSpawner;
    try {
      // bwrap waits for its options: it makes the sandbox's namespaces once it is in the cgroup,
      // so the cgroup namespace's root is the sandbox's cgroup and /proc/self/cgroup inside
      // shows "/", not the cgroup's name
      if (maker === undefined) sandbox.joinCgroup(init.pid);
      else if (cgroupError !== undefined) sandbox.cgroupUnjoinable(new Error(cgroupError));
      const optionsFd = (init.stdio as unknown as Array<Writable | null>)[ARGS_FD]!;
      optionsFd.on('error', () => {}); // bwrap gone before it read them: waitReady says why
      optionsFd.end(bwrap.options);
      const reported = await waitReady(init, readyTimeoutMs);
      // under the guard, bwrap names its child by its pid in the guard's namespace
      sandbox.started(mountTmpfs ? hostPidOf(init.pid!, reported, newPidNamespace) : reported);
    } catch (error) {
      await sandbox.abort();
      throw error;
    }
    return sandbox;
  }

  /** Warm sandboxes starting or closing, which `close` waits for. */
  const settling = new Set<Promise<unknown>>();
  const background = (work: Promise<unknown>): void => {
    const settled = work.catch(() => {}).finally(() => settling.delete(settled));
    settling.add(settled);
  };

  /** How many sandboxes `pool` keeps ready now. */
  function target(pool: WarmPool): number {
    if (warm !== 'auto') return warm;
    const now = performance.now();
    while (pool.asks.length > 0 && pool.asks[0]! < now - DEMAND_WINDOW_MS) pool.asks.shift();
    if (!pool.repeated || pool.asks.length === 0) return 0;
    // what arrives while one starts, and one more
    const rate = pool.asks.length / DEMAND_WINDOW_MS;
    return Math.min(maxAuto, Math.ceil(rate * pool.startMs) + 1);
  }

  /** Warm sandboxes of every pool, ready or starting ('auto' keeps at most maxAuto in all). */
  function warmCount(): number {
    let count = 0;
    for (const pool of pools.values()) count += pool.sandboxes.length + pool.filling;
    return count;
  }

  function refill(pool: WarmPool): void {
    const wanted = target(pool);
    let room = warm === 'auto' ? maxAuto - warmCount() : Infinity;
    while (!providerClosed && pool.sandboxes.length + pool.filling < wanted && room-- > 0) {
      pool.filling++;
      const started = performance.now();
      background(
        start(pool.spec).then(
          async (sandbox) => {
            pool.filling--;
            pool.startMs = 0.8 * pool.startMs + 0.2 * (performance.now() - started);
            if (providerClosed) await sandbox.close();
            else pool.sandboxes.push(sandbox);
          },
          () => {
            pool.filling--;
          },
        ),
      );
    }
    if (warm === 'auto' && idleTimer === undefined) {
      idleTimer = setInterval(shrink, IDLE_MS / 2);
      idleTimer.unref();
    }
  }

  /** 'auto': a pool asked for nothing during IDLE_MS is emptied (an idle provider keeps nothing running). */
  function shrink(): void {
    const now = performance.now();
    for (const [key, pool] of pools) {
      if (pool.filling > 0 || pool.lastAsk > now - IDLE_MS) continue;
      pools.delete(key);
      for (const sandbox of pool.sandboxes.splice(0)) background(sandbox.close());
    }
    if (pools.size === 0) {
      clearInterval(idleTimer);
      idleTimer = undefined;
    }
  }

  function poolOf(key: string, spec: ResolvedSandboxSpec): WarmPool {
    let pool = pools.get(key);
    if (pool === undefined) {
      // the pool's sandboxes start without the spec's env and files (adopt hands them over)
      const { env: _env, files: _files, ...rest } = spec;
      pool = { spec: rest as ResolvedSandboxSpec, sandboxes: [], filling: 0, asks: [], repeated: false, lastAsk: -Infinity, startMs: 30 };
      pools.set(key, pool);
    }
    return pool;
  }

  if (typeof warm === 'number' && warm > 0) {
    const spec = resolveSandboxSpec({});
    refill(poolOf(poolKey(spec)!, spec));
  }

  return {
    name: 'bwrap',
    limits: () => ({ ...limits }),
    async create(requested: SandboxSpec = {}) {
      const spec = resolveSandboxSpec(requested, { name: 'bwrap', limits });
      let sandbox: BwrapSandbox | undefined;
      const key = warm === 0 ? undefined : poolKey(spec);
      if (key !== undefined) {
        const pool = poolOf(key, spec);
        const now = performance.now();
        // (counted for 'auto' only, whose target() trims them: a fixed count would keep every ask)
        if (warm === 'auto') pool.asks.push(now);
        pool.repeated ||= now - pool.lastAsk < IDLE_MS;
        pool.lastAsk = now;
        while (sandbox === undefined && pool.sandboxes.length > 0) {
          const candidate = pool.sandboxes.shift()!;
          if (candidate.alive()) sandbox = candidate;
          else background(candidate.close());
        }
        if (sandbox !== undefined) {
          sandbox.adopt(spec);
          refill(pool);
        } else {
          // the pool's starts wait for this one: started beside it, they would slow it down
          try {
            sandbox = await start(spec);
          } finally {
            refill(pool);
          }
        }
      }
      sandbox ??= await start(spec);
      await sandbox.writeSpecFiles();
      return sandbox;
    },
    async prefetch(spec: SandboxSpec) {
      // unpacked into the cache and left there unheld: LRU like any idle image until a sandbox holds it
      if (spec.image !== undefined && isImageReference(spec.image)) await resolveImage(spec.image, imageOptions);
    },
    async close() {
      providerClosed = true;
      clearInterval(idleTimer);
      const pooled = [...pools.values()].flatMap((pool) => pool.sandboxes.splice(0));
      pools.clear();
      // (a warm sandbox still starting closes once it runs)
      await Promise.all([...pooled.map((sandbox) => sandbox.close()), ...settling, forkServers?.close()]);
      // (at once when no sandbox of its runs, else once the last one its callers hold has closed)
      await Promise.all([spawner?.close(), shellSpawner?.close()]);
    },
  };
}

/**
 * The host pid of the sandbox's init, which bwrap's monitor reported as `nsPid` in the guard's
 * pid namespace: the monitor's child whose NSpid says so. The monitor is `pid` itself where the
 * spawner made that namespace, else the child of `pid`, the guard.
 */
function hostPidOf(pid: number, nsPid: number, monitorIsPid: boolean): number {
  for (const monitor of monitorIsPid ? [pid] : childrenOf(pid)) {
    for (const child of childrenOf(monitor)) {
      let status: string;
      try {
        status = readFileSync(`/proc/${child}/status`, 'latin1');
      } catch {
        continue;
      }
      // NSpid: this process's pid in our namespace, then in each nested one (the guard's, the sandbox's)
      const ids = /^NSpid:\s*(.*)$/m.exec(status)?.[1]?.trim().split(/\s+/) ?? [];
      if (ids[ids.length - 2] === String(nsPid)) return child;
    }
  }
  throw new RolloutError({ code: 'SANDBOX', message: `cannot find the sandbox's init (pid ${nsPid} in its guard's namespace) on the host`, retryable: true });
}

/** Resolves with the sandbox init's pid (as bwrap's --info-fd names it) once it runs (bwrap's --info-fd, then the init's "R"). */
function waitReady(init: InitProcess, timeoutMs: number): Promise<number> {
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

