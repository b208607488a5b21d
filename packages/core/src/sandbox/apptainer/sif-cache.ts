import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { RolloutError } from '../../errors.ts';
import { evictToCap, holdEntry, takeUnpackSlot, touchEntry, tryLock, unlock } from '../image/cache.ts';
import { runProcess } from '../process.ts';
import { BASE_ENV } from '../types.ts';
import { normalizeImage } from './args.ts';
import { pickHostEnv } from './sandbox.ts';

/*
 * Apptainer's images made into SIF files once per host, ahead of their first use (the provider's
 * prefetch): what `instance start docker://…` (or `oci:`, `docker-archive:`, `oci-archive:`, …)
 * would otherwise do at every INIT (pull or read the layers, build a SIF) is done once by
 * `apptainer build <sif> <source>` into the cache, and an instance of the image starts from the
 * cached SIF. The cache is the bwrap image cache's sibling, `<imageCacheDir>/sif/`, one entry per
 * source (`sha256-<key>/image.sif`), agreed on by the processes of one host through cache.ts's
 * files: an entry's lock (one build of it on the host), the host's unpack slots of the image
 * cache (`<imageCacheDir>/.unpacks/`: builds and bwrap unpacks share one bound), a use per running
 * instance (`.uses/`), and eviction of the least recently used under the cap, never one in use.
 */

/** Sources apptainer builds a SIF from (after normalizeImage); a SIF file or a directory is used as it is. */
const BUILT = ['docker://', 'oras://', 'library://', 'shub://', 'oci:', 'oci-archive:', 'docker-archive:'];

export function isBuiltImage(image: string): boolean {
  const source = normalizeImage(image);
  return BUILT.some((prefix) => source.startsWith(prefix));
}

/**
 * The cache key of a source: a registry reference by its text (a tag is built once; pin a digest,
 * `docker://…@sha256:…`, for an exact image), a local layout by its `index.json`, an archive by
 * its size and modification time (a changed file is built again).
 */
export function sifKey(image: string): string {
  const source = normalizeImage(image);
  let stamp = '';
  if (!source.includes('://')) {
    const rest = source.slice(source.indexOf(':') + 1);
    try {
      if (source.startsWith('oci:')) {
        // `oci:<dir>[:<tag>]`: the tag after the last `:` past the last `/`
        const colon = rest.lastIndexOf(':');
        const dir = colon > rest.lastIndexOf('/') ? rest.slice(0, colon) : rest;
        stamp = createHash('sha256').update(readFileSync(join(dir, 'index.json'))).digest('hex');
      } else {
        const stat = statSync(rest);
        stamp = `${stat.size} ${stat.mtimeMs}`;
      }
    } catch {
      stamp = 'missing'; // its build says what is wrong
    }
  }
  return createHash('sha256').update(`${source}\0${stamp}`).digest('hex');
}

interface SifRecord {
  reference: string;
  key: string;
  bytes: number;
}

export interface SifCacheOptions {
  /** The image cache: SIFs go to `<imageCacheDir>/sif/`; the unpack slots are the image cache's. */
  imageCacheDir: string;
  /** Builds (and bwrap unpacks) at once on this host. */
  maxConcurrentUnpacks: number;
  /** The SIFs' cap in bytes (least recently used first, never one in use); undefined: none. */
  maxCacheBytes?: number | undefined;
  /** How long a build (and the wait for another process's) may take. */
  timeoutMs: number;
}

/** A cached SIF an instance runs on; `release` when the instance is gone. */
export interface HeldSif {
  path: string;
  release: () => void;
}

export class SifCache {
  readonly #options: SifCacheOptions;
  readonly #dir: string;
  /** Builds under way in this process, by entry. */
  readonly #building = new Map<string, Promise<void>>();
  readonly #removals = new Set<Promise<void>>();

  constructor(options: SifCacheOptions) {
    this.#options = options;
    this.#dir = join(options.imageCacheDir, 'sif');
  }

  get dir(): string {
    return this.#dir;
  }

  #entry(image: string): string {
    return join(this.#dir, `sha256-${sifKey(image)}`);
  }

  #whole(entry: string, key: string): boolean {
    try {
      return (JSON.parse(readFileSync(join(entry, 'image.json'), 'utf8')) as SifRecord).key === key && existsSync(join(entry, 'image.sif'));
    } catch {
      return false;
    }
  }

  /** Builds the SIF of `image` into the cache unless it is there (once on the host); holds nothing after. */
  async ensure(binary: string, image: string): Promise<void> {
    const entry = this.#entry(image);
    let pending = this.#building.get(entry);
    if (pending === undefined) {
      pending = this.#build(binary, image, entry);
      this.#building.set(entry, pending);
      const forget = () => void this.#building.delete(entry);
      pending.then(forget, forget);
    }
    await pending;
  }

  /**
   * The cached SIF of `image`, held for an instance, once any build of it under way on the host
   * has ended; undefined when the cache does not have it (the instance then starts from the
   * source, as apptainer alone would).
   */
  async ready(image: string): Promise<HeldSif | undefined> {
    const entry = this.#entry(image);
    await this.#building.get(entry)?.catch(() => undefined);
    const key = basename(entry).slice('sha256-'.length);
    if (!existsSync(this.#dir)) return undefined;
    // another process building it holds its lock: wait for the build to end
    const lockFile = `${entry}.lock`;
    const deadline = Date.now() + this.#options.timeoutMs;
    let took = false;
    while (!this.#whole(entry, key) && existsSync(lockFile)) {
      // taken only to see it free (a holder gone leaves it to be taken over)
      if ((took = tryLock(lockFile))) break;
      if (Date.now() > deadline) return undefined;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    if (took) unlock(lockFile);
    if (!this.#whole(entry, key)) return undefined;
    // the use first, then the entry read again: an evictor sees the use, or this sees it gone
    const release = holdEntry(this.#dir, basename(entry));
    if (!this.#whole(entry, key)) {
      release();
      return undefined;
    }
    return { path: join(entry, 'image.sif'), release };
  }

  async #build(binary: string, image: string, entry: string): Promise<void> {
    const key = basename(entry).slice('sha256-'.length);
    if (this.#whole(entry, key)) {
      touchEntry(this.#dir, basename(entry));
      return;
    }
    mkdirSync(this.#options.imageCacheDir, { recursive: true, mode: 0o700 });
    mkdirSync(this.#dir, { recursive: true, mode: 0o700 });
    const source = normalizeImage(image);
    const lockFile = `${entry}.lock`;
    const deadline = Date.now() + this.#options.timeoutMs;
    for (;;) {
      if (this.#whole(entry, key)) {
        touchEntry(this.#dir, basename(entry));
        return;
      }
      if (tryLock(lockFile)) break;
      if (Date.now() > deadline) throw new RolloutError({ code: 'UNAVAILABLE', message: `image ${JSON.stringify(image)}: still being built by another process (${lockFile})`, retryable: true });
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const tempPrefix = `.tmp-${basename(entry)}-`;
    const temp = join(this.#dir, `${tempPrefix}${randomBytes(6).toString('hex')}`);
    let slot: string | undefined;
    try {
      // we hold the lock: a temp directory of this entry is one a process that died left
      for (const name of readdirSync(this.#dir)) if (name.startsWith(tempPrefix)) await rm(join(this.#dir, name), { recursive: true, force: true });
      if (this.#whole(entry, key)) return;
      await rm(entry, { recursive: true, force: true });
      slot = await takeUnpackSlot(this.#options.imageCacheDir, this.#options.maxConcurrentUnpacks, deadline, `image ${image}`);
      mkdirSync(temp, { mode: 0o700 });
      const sif = join(temp, 'image.sif');
      const result = await runProcess([binary, 'build', sif, source], {
        env: { ...BASE_ENV, ...pickHostEnv() },
        cwd: temp,
        timeoutMs: Math.max(1, deadline - Date.now()),
        maxOutputBytes: 1 << 20,
      });
      if (result.code !== 0 || !existsSync(sif)) {
        const output = `${result.stderr.toString('utf8')}${result.stdout.toString('utf8')}`.trim().split('\n').slice(-5).join('\n');
        throw new RolloutError({ code: 'SANDBOX', message: `image ${JSON.stringify(image)}: apptainer build failed (${result.code}): ${output}`, retryable: true, details: { image } });
      }
      const record: SifRecord = { reference: source, key, bytes: statSync(sif).size };
      writeFileSync(join(temp, 'image.json'), JSON.stringify(record, null, 2));
      renameSync(temp, entry);
      touchEntry(this.#dir, basename(entry));
    } finally {
      await rm(temp, { recursive: true, force: true });
      if (slot !== undefined) unlock(slot);
      unlock(lockFile);
    }
    if (this.#options.maxCacheBytes === undefined) return;
    // held while the cache is brought under its cap: the SIF just built is not what goes
    const release = holdEntry(this.#dir, basename(entry));
    try {
      await this.#evict(this.#options.maxCacheBytes);
    } finally {
      release();
    }
  }

  async #evict(maxBytes: number): Promise<void> {
    const sizeOf = async (path: string): Promise<number> => {
      try {
        return (JSON.parse(readFileSync(join(path, 'image.json'), 'utf8')) as SifRecord).bytes;
      } catch {
        return 0;
      }
    };
    const report = await evictToCap(this.#dir, maxBytes, sizeOf).catch(() => undefined);
    if (report === undefined) return;
    const removed = report.removed.catch(() => undefined);
    this.#removals.add(removed);
    void removed.then(() => this.#removals.delete(removed));
  }

  /** Waits for the builds and removals under way. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.#building.values(), ...this.#removals]);
  }
}
