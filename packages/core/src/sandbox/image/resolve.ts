import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, createReadStream, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { RolloutError } from '../../errors.ts';
import { IMAGE_KINDS } from './kinds/index.ts';
import { parseImageReference } from './reference.ts';
import { evictToCap, holdEntry, measureBytes, parseSize, takeUnpackSlot, touchEntry, tryLock, unlock } from './cache.ts';
import { processIdentity } from '../staging.ts';
import { imageError, run } from './tools.ts';
import type { ImageConfig, ParsedImageReference, ResolvedImage, ResolveImageOptions } from './types.ts';

/*
 * The cache: `<cacheDir>/<digest>/` holds `rootfs/` and `image.json` (the digest, the config and
 * the seal). An entry is unpacked into `<cacheDir>/.tmp-*` and renamed into place complete, so a
 * half-unpacked image is never used; `<entry>.lock` (a lock file naming its holder: cache.ts)
 * makes processes unpack an image once, and in one process concurrent first uses share one
 * promise. `<cacheDir>/.sources/` remembers the sha256 of image files by path, size, mtime and
 * inode, so a second resolve reads no image file. A file not hashed yet is hashed while it is
 * unpacked: the unpack starts at once into `<cacheDir>/.stage-<pid>-<start>-*` (an early unpack,
 * within an unpack slot) and is renamed into its entry once the digest is known and the entry's
 * lock held, or dropped when the cache holds the entry already; `.sources/<path hash>.json.lock`
 * lets one process of the host do that while the others wait for its digest. The cap, the uses
 * that keep an entry from eviction (`.uses/`) and the host's unpack slots (`.unpacks/`) are
 * cache.ts's.
 *
 * The cache is the service's alone: the directory is mode 0700 and everything in it belongs to
 * the service's user (nothing is handed to a sandbox uid); sandboxes see an image root only
 * through their overlay (read-only lower layer), under a root service through an idmapped clone
 * (overlay.ts). Unpacking seals the root before it is renamed into place (sealRootfs): device
 * nodes, fifos and sockets are removed, setuid/setgid bits and group/other write bits cleared.
 * The tools take no ownership from the image (an OCI
 * image's layers by GNU tar, `--no-same-owner`, each layer in a directory of its own, several
 * at once, stacked by the service with the OCI whiteouts, never through a symlink:
 * kinds/oci-layers.ts; `umoci raw unpack --rootless` for what tar does not do; unsquashfs for
 * squashfs and SIF), and under a root service they run as an unprivileged uid (`unpackAs`, the
 * sandbox's: 65534) in a staging directory of its own: the cache directory is then 0711 (that uid
 * may enter its staging directory, list nothing), every entry 0700; only when the tools are done
 * does the service stack the layers, take the files (chown), seal them and rename the entry into
 * place. The record says how an OCI image was unpacked (`unpackedWith`).
 */

/** The cache's cap: `$ROLLSERVE_IMAGE_CACHE_MAX` (`200G`, `500M`, bytes), else none. */
export function defaultMaxCacheBytes(): number | undefined {
  return parseSize(process.env.ROLLSERVE_IMAGE_CACHE_MAX, 'ROLLSERVE_IMAGE_CACHE_MAX');
}

/** Unpacks at once on this host per cache: `$ROLLSERVE_IMAGE_UNPACKS`, else 2. */
export function defaultMaxConcurrentUnpacks(): number {
  const fromEnv = Number(process.env.ROLLSERVE_IMAGE_UNPACKS);
  return Number.isInteger(fromEnv) && fromEnv > 0 ? fromEnv : 2;
}

export function defaultImageCacheDir(): string {
  const fromEnv = process.env.ROLLSERVE_IMAGE_CACHE;
  return fromEnv !== undefined && fromEnv !== '' ? fromEnv : join(tmpdir(), 'rollserve-images');
}

interface CacheRecord {
  reference: string;
  digest: string;
  config: ImageConfig;
  /** SEAL_VERSION once sealRootfs ran. */
  sealed?: number;
  /** What sealing removed or changed, for the log. */
  sealReport?: SealReport;
  /** Bytes the entry takes on disk (du), for the cache's cap. */
  bytes?: number;
  /** How it was unpacked, when its kind has more than one way (an OCI image: `tar`, or `umoci (<why not tar>)`). */
  unpackedWith?: string;
}

/** What sealRootfs did to an unpacked root. */
export interface SealReport {
  /** Device nodes, fifos and sockets removed (paths in the image; the first 100). */
  removed: string[];
  /** Files whose setuid/setgid bits were cleared. */
  setid: number;
  /** Files and directories whose group/other write bits were cleared. */
  writable: number;
}

/** Who unpacks under a root service: the bwrap provider's default sandbox user. */
const DEFAULT_UNPACK_USER = { uid: 65534, gid: 65534 };

/** Bumped when sealing changes: entries sealed by an older rule are unpacked again. */
const SEAL_VERSION = 1;

/**
 * Resolves image references to unpacked root filesystems in the cache (see resolveImage), and
 * holds what it remembers in between: the entries found for a reference, the unpacks in flight,
 * the cache directories checked. A provider owns one and closes it with itself.
 */
export interface ImageResolver {
  resolve(reference: string, options?: ResolveImageOptions): Promise<ResolvedImage>;
  /**
   * Waits for the resolves under way (an unpack's staging directory and lock are gone after) and
   * forgets what it remembered; later resolves are refused.
   */
  close(): Promise<void>;
}

export function createImageResolver(): ImageResolver {
  /** Unpacks in flight, by entry: concurrent first uses of an image share one. */
  const inFlight = new Map<string, Promise<CacheRecord>>();
  /** The entry last found for a reference, by cache directory and reference, with its source's stamp then. */
  const remembered = new Map<string, { stamp: string; entry: string; record: CacheRecord }>();
  const checkedDirs = new Set<string>();
  /** Files being hashed, by cache directory, path and stamp: concurrent first uses hash (and unpack) once. */
  const hashes = new Map<string, Promise<string>>();
  /** The resolves under way, for close to wait for. */
  const running = new Set<Promise<unknown>>();
  let closed = false;

  const track = <T>(work: Promise<T>): Promise<T> => {
    running.add(work);
    const forget = () => void running.delete(work);
    work.then(forget, forget);
    return work;
  };
  /** Bytes of entries whose record does not say, measured once. */
  const measured = new Map<string, number>();
  const sizeOf = async (entry: string): Promise<number> => {
    try {
      const bytes = (JSON.parse(readFileSync(join(entry, 'image.json'), 'utf8')) as CacheRecord).bytes;
      if (bytes !== undefined) return bytes;
    } catch {
      // not a whole entry: measured like the others
    }
    let bytes = measured.get(entry);
    if (bytes === undefined) measured.set(entry, (bytes = await measureBytes(entry).catch(() => 0)));
    return bytes;
  };
  /** Brings the cache under its cap; the evicted entries' files are removed in the background (close waits). */
  const evict = async (cacheDir: string, maxBytes: number): Promise<void> => {
    const report = await evictToCap(cacheDir, maxBytes, sizeOf).catch(() => undefined);
    if (report !== undefined) void track(report.removed.catch(() => undefined));
  };

  const resolveOnce = async (reference: string, options: ResolveImageOptions): Promise<ResolvedImage> => {
    const parsed = parseImageReference(reference);
    const cacheDir = options.cacheDir ?? defaultImageCacheDir();
    const maxBytes = options.maxCacheBytes ?? defaultMaxCacheBytes();
    const stamp = sourceStamp(reference, parsed);
    const memoKey = `${cacheDir}\0${reference}`;
    const memo = remembered.get(memoKey);
    let digest: string;
    let entry: string;
    /** An unpack started before the digest was known (hashed meanwhile): the entry's, unless the cache holds it. */
    let early: EarlyUnpack | undefined;
    const lockTimeoutMs = options.lockTimeoutMs ?? 600_000;
    const unpackAs = process.getuid?.() === 0 ? (options.unpackAs ?? DEFAULT_UNPACK_USER) : undefined;
    const slots = options.maxConcurrentUnpacks ?? defaultMaxConcurrentUnpacks();
    if (memo !== undefined && memo.stamp === stamp) {
      ({ entry } = memo);
      digest = memo.record.digest;
    } else {
      if (!checkedDirs.has(cacheDir)) {
        ensureCacheDir(cacheDir);
        checkedDirs.add(cacheDir);
        await removeOrphanedStaging(cacheDir);
        // a cap lowered since the cache last grew
        if (maxBytes !== undefined) await evict(cacheDir, maxBytes);
      }
      const known = knownDigest(reference, parsed, cacheDir, stamp);
      if (known !== undefined) digest = known;
      else {
        // a file not hashed yet: hashing 200 MB takes most of a second, so the unpack starts at
        // once, beside the hash, in a staging directory of its own (one per source in this process)
        const hashKey = `${cacheDir}\0${parsed.path}\0${stamp}`;
        let hashing = hashes.get(hashKey);
        if (hashing === undefined) {
          // across the processes sharing the cache, one hashes and unpacks early (under the source's
          // lock, held until it holds the entry's); the others wait for it, then find its entry
          const sourceLock = `${sourceNote(cacheDir, parsed.path)}.lock`;
          mkdirSync(join(cacheDir, '.sources'), { recursive: true, mode: 0o700 });
          if (tryLock(sourceLock)) {
            early = startEarlyUnpack(reference, parsed, cacheDir, unpackAs, slots, Date.now() + lockTimeoutMs, sourceLock);
            hashing = hashSource(parsed.path, cacheDir, stamp);
          } else hashing = awaitSource(reference, parsed, cacheDir, stamp, sourceLock, Date.now() + lockTimeoutMs);
          hashes.set(hashKey, hashing);
          const forget = () => void hashes.delete(hashKey);
          hashing.then(forget, forget);
        }
        try {
          digest = await hashing;
        } catch (error) {
          if (early !== undefined) await early.discard();
          throw error;
        }
      }
      entry = join(cacheDir, digest.replace(':', '-'));
    }
    // the use is taken before the entry is read, and kept while it is read (and unpacked, and the
    // cache evicted after): an evictor sees it, or this finds the entry gone (cache.ts)
    const release = holdEntry(cacheDir, basename(entry));
    try {
      let unpacked = false;
      // at every use the entry is checked against the source's digest (the cache key) and its seal
      let record = readRecord(entry, digest);
      if (record === undefined) {
        let pending = inFlight.get(entry);
        if (pending === undefined) {
          const started = unpackOnce(reference, parsed, digest, cacheDir, entry, lockTimeoutMs, unpackAs, slots, early);
          early = undefined;
          pending = started.then((outcome) => outcome.record);
          inFlight.set(entry, pending);
          pending.then(
            () => inFlight.delete(entry),
            () => inFlight.delete(entry),
          );
          unpacked = (await started).fresh;
        }
        record = await pending;
      }
      remembered.set(memoKey, { stamp, entry, record });
      // the cache grew: back under its cap (this entry is held meanwhile)
      if (unpacked && maxBytes !== undefined) await evict(cacheDir, maxBytes);
      const resolved: ResolvedImage = { reference, digest, rootfs: join(entry, 'rootfs'), config: record.config, unpacked };
      if (options.hold !== true) {
        touchEntry(cacheDir, basename(entry));
        release();
        return resolved;
      }
      return { ...resolved, release };
    } catch (error) {
      release();
      throw error;
    } finally {
      // the cache held the image after all (or another resolve here unpacks it)
      if (early !== undefined) void track(early.discard());
    }
  };

  return {
    resolve: async (reference, options = {}) => {
      if (closed) throw new RolloutError({ code: 'SANDBOX', message: `image ${JSON.stringify(reference)}: the image resolver is closed` });
      return track(resolveOnce(reference, options));
    },
    close: async () => {
      closed = true;
      await Promise.allSettled([...running]);
      remembered.clear();
      checkedDirs.clear();
    },
  };
}

/** The resolver behind resolveImage: the process's own, never closed. */
const shared = createImageResolver();

/**
 * Resolves an image reference to an unpacked root filesystem in the cache, unpacking it on first
 * use, with the process's shared resolver (createImageResolver makes one to own and close).
 * A reference that cannot be read is a BAD_REQUEST RolloutError; a missing or corrupt image an
 * UNPROCESSABLE one (422); a missing unpack tool (umoci, skopeo, unsquashfs) UNAVAILABLE.
 *
 * @example
 * const image = await resolveImage('oci:/images/sweb.eval.django-11099:latest');
 * // image.rootfs: the read-only root; image.config: { env, workdir, user }
 */
export function resolveImage(reference: string, options: ResolveImageOptions = {}): Promise<ResolvedImage> {
  return shared.resolve(reference, options);
}

function ensureCacheDir(cacheDir: string): void {
  // under root the unpacking uid must enter its staging directory: search, never read
  const mode = process.getuid?.() === 0 ? 0o711 : 0o700;
  mkdirSync(cacheDir, { recursive: true, mode });
  const stat = lstatSync(cacheDir);
  const uid = process.getuid?.();
  // lstat: a symlink planted where the cache goes (under /tmp by default) would lead it elsewhere
  if (!stat.isDirectory()) throw new RolloutError({ code: 'SANDBOX', message: `the image cache ${cacheDir} is not a directory (a symlink is refused: give its real path)` });
  if (uid !== undefined && stat.uid !== uid) {
    throw new RolloutError({ code: 'SANDBOX', message: `the image cache ${cacheDir} belongs to uid ${stat.uid}, not to this service (uid ${uid})` });
  }
  // the service's alone: no other user (a sandbox's uid included) reaches an image's files
  if ((stat.mode & 0o777) !== mode) chmodSync(cacheDir, mode);
}

/**
 * An entry's record when the entry is whole and sealed for `digest`: its record names that digest
 * and the current seal, and the entry and its root belong to the service and are writable by it
 * alone. Anything else is not used (and is unpacked again).
 */
function readRecord(entry: string, digest: string): CacheRecord | undefined {
  let record: CacheRecord;
  try {
    record = JSON.parse(readFileSync(join(entry, 'image.json'), 'utf8')) as CacheRecord;
  } catch {
    return undefined;
  }
  if (record.digest !== digest || record.sealed !== SEAL_VERSION) return undefined;
  const uid = process.getuid?.();
  for (const path of [entry, join(entry, 'rootfs')]) {
    try {
      const stat = lstatSync(path);
      if (!stat.isDirectory() || (uid !== undefined && stat.uid !== uid) || (stat.mode & 0o022) !== 0) return undefined;
    } catch {
      return undefined;
    }
  }
  return record;
}

/** Identifies the state of the image's source (what a cached digest was computed from). */
function sourceStamp(reference: string, parsed: ParsedImageReference): string {
  const { path, missing } = IMAGE_KINDS[parsed.kind].source(parsed);
  try {
    const stat = statSync(path);
    if (!stat.isFile()) throw imageError(reference, `${path} is not a file`);
    return `${stat.size}:${stat.mtimeMs}:${stat.ino}`;
  } catch (error) {
    if (RolloutError.isInstance(error)) throw error;
    throw imageError(reference, missing, error);
  }
}

/** The cache key when it is known without reading the image: named by the kind (an OCI manifest's digest), or noted for this stamp of the file. */
function knownDigest(reference: string, parsed: ParsedImageReference, cacheDir: string, stamp: string): string | undefined {
  const named = IMAGE_KINDS[parsed.kind].digest?.(reference, parsed);
  if (named !== undefined) return named;
  try {
    const known = JSON.parse(readFileSync(sourceNote(cacheDir, parsed.path), 'utf8')) as { stamp: string; digest: string };
    if (known.stamp === stamp) return known.digest;
  } catch {
    // not hashed yet
  }
  return undefined;
}

const sourceNote = (cacheDir: string, path: string): string => join(cacheDir, '.sources', `${createHash('sha256').update(path).digest('hex')}.json`);

/** The sha256 of an image file, noted for its stamp (a second resolve reads no image file). */
async function hashSource(path: string, cacheDir: string, stamp: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path, { highWaterMark: 1024 * 1024 })) hash.update(chunk as Buffer);
  const digest = `sha256:${hash.digest('hex')}`;
  const note = sourceNote(cacheDir, path);
  mkdirSync(join(cacheDir, '.sources'), { recursive: true, mode: 0o700 });
  const temp = `${note}.${randomBytes(4).toString('hex')}`;
  writeFileSync(temp, JSON.stringify({ stamp, digest }));
  renameSync(temp, note);
  return digest;
}

/**
 * The digest of a file another process is hashing (and unpacking early): known once its lock is
 * free (its holder holds the entry's lock by then, or is done, or died); hashed here when that
 * process left no note.
 */
async function awaitSource(reference: string, parsed: ParsedImageReference, cacheDir: string, stamp: string, sourceLock: string, deadline: number): Promise<string> {
  while (!tryLock(sourceLock)) {
    if (Date.now() > deadline) throw new RolloutError({ code: 'UNAVAILABLE', message: `image ${reference}: still being read by another process (${sourceLock})`, retryable: true });
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  try {
    return knownDigest(reference, parsed, cacheDir, stamp) ?? (await hashSource(parsed.path, cacheDir, stamp));
  } finally {
    unlock(sourceLock);
  }
}

/** An unpack into a staging directory of its own, started before its cache entry is known. */
interface EarlyUnpack {
  /** The staging directory, unpacked (its root in `rootfs/`), and how the config is read. */
  result: Promise<{ temp: string; readConfig: (rootfs: string) => ImageConfig; unpackedWith: string | undefined }>;
  /** Gives back the source's lock (the entry's lock is held now, or the unpack dropped). Idempotent. */
  release(): void;
  /** Kills the tools and removes the staging directory (once the cache is found to hold the image). */
  discard(): Promise<void>;
}

/** Staging directories of early unpacks: `.stage-<pid>-<start time>-<random>`, removed by the next process when theirs is gone. */
const STAGE = /^\.stage-(\d+)-(\d+)-[0-9a-f]+$/;

/**
 * Starts unpacking an image before its digest is known: within one of the host's unpack slots
 * (given back as soon as the tool is done, so that it is never held while waiting for an entry's
 * lock), into `<cacheDir>/.stage-*`.
 */
function startEarlyUnpack(
  reference: string,
  parsed: ParsedImageReference,
  cacheDir: string,
  unpackAs: { uid: number; gid: number } | undefined,
  slots: number,
  deadline: number,
  sourceLock: string,
): EarlyUnpack {
  const controller = new AbortController();
  const self = (processIdentity('self') ?? `${process.pid} 0`).replace(' ', '-');
  const temp = join(cacheDir, `.stage-${self}-${randomBytes(6).toString('hex')}`);
  const result = (async () => {
    const slot = await takeUnpackSlot(cacheDir, slots, deadline, `image ${reference}`, controller.signal);
    try {
      mkdirSync(temp, { mode: 0o700 });
      if (unpackAs !== undefined) chownSync(temp, unpackAs.uid, unpackAs.gid);
      let unpackedWith: string | undefined;
      const readConfig = await IMAGE_KINDS[parsed.kind].unpack({ reference, parsed, staging: temp, rootfs: join(temp, 'rootfs'), unpackAs, signal: controller.signal, report: (how) => (unpackedWith = how) });
      return { temp, readConfig, unpackedWith };
    } finally {
      unlock(slot);
    }
  })();
  // a failure is the adopter's to report (or nobody's, once discarded)
  result.catch(() => undefined);
  let discarded: Promise<void> | undefined;
  let held = true;
  // once: the lock may be another process's after
  const release = (): void => {
    if (held) unlock(sourceLock);
    held = false;
  };
  return {
    result,
    release,
    discard: () =>
      (discarded ??= (async () => {
        release();
        controller.abort();
        await result.catch(() => undefined);
        await rm(temp, { recursive: true, force: true });
      })()),
  };
}

/** Removes the staging directories of early unpacks whose process is gone. */
async function removeOrphanedStaging(cacheDir: string): Promise<void> {
  for (const name of readdirSync(cacheDir)) {
    const match = STAGE.exec(name);
    if (match === null || processIdentity(Number(match[1])) === `${match[1]} ${match[2]}`) continue;
    await rm(join(cacheDir, name), { recursive: true, force: true }).catch(() => undefined);
  }
}

async function unpackOnce(
  reference: string,
  parsed: ParsedImageReference,
  digest: string,
  cacheDir: string,
  entry: string,
  lockTimeoutMs: number,
  unpackAs: { uid: number; gid: number } | undefined,
  slots: number,
  early: EarlyUnpack | undefined,
): Promise<{ record: CacheRecord; fresh: boolean }> {
  const lockFile = `${entry}.lock`;
  const deadline = Date.now() + lockTimeoutMs;
  for (;;) {
    const done = readRecord(entry, digest);
    if (done !== undefined) {
      await early?.discard();
      return { record: done, fresh: false };
    }
    // (a holder that died left its temp directory: removed by the next one to take the lock)
    if (tryLock(lockFile)) {
      early?.release();
      break;
    }
    if (Date.now() > deadline) {
      await early?.discard();
      throw new RolloutError({ code: 'UNAVAILABLE', message: `image ${reference}: still being unpacked by another process (${lockFile})`, retryable: true });
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  let slot: string | undefined;
  const tempPrefix = `.tmp-${basename(entry)}-`;
  let temp = join(cacheDir, `${tempPrefix}${randomBytes(6).toString('hex')}`);
  try {
    // we hold the lock: any temp directory of this entry is left from a process that died
    for (const name of readdirSync(cacheDir)) {
      if (name.startsWith(tempPrefix)) await rm(join(cacheDir, name), { recursive: true, force: true });
    }
    const done = readRecord(entry, digest);
    if (done !== undefined) {
      await early?.discard();
      return { record: done, fresh: false };
    }
    // an entry without a valid sealed record is not one of ours (entries appear complete, by rename)
    await rm(entry, { recursive: true, force: true });
    let readConfig: (rootfs: string) => ImageConfig;
    let unpackedWith: string | undefined;
    if (early !== undefined) {
      // unpacked already (its slot given back), or failing as this one would
      ({ temp, readConfig, unpackedWith } = await early.result);
    } else {
      // first uses of different images on this host (every process sharing the cache) are bounded
      slot = await takeUnpackSlot(cacheDir, slots, deadline, `image ${reference}`);
      mkdirSync(temp, { mode: 0o700 });
      if (unpackAs !== undefined) chownSync(temp, unpackAs.uid, unpackAs.gid);
      readConfig = await IMAGE_KINDS[parsed.kind].unpack({ reference, parsed, staging: temp, rootfs: join(temp, 'rootfs'), unpackAs, report: (how) => (unpackedWith = how) });
      unlock(slot);
      slot = undefined;
    }
    const rootfs = join(temp, 'rootfs');
    // the unpacking uid is done: the service takes the files (no symlink followed) as it seals
    // them, then reads them
    const { report: sealReport, bytes } = await sealRootfs(reference, temp, unpackAs === undefined ? undefined : { uid: process.getuid!(), gid: process.getgid!() });
    chmodSync(temp, 0o700);
    const config = readConfig(rootfs);
    const record: CacheRecord = { reference, digest, config, sealed: SEAL_VERSION, sealReport, bytes, ...(unpackedWith === undefined ? {} : { unpackedWith }) };
    writeFileSync(join(temp, 'image.json'), JSON.stringify(record, null, 2));
    renameSync(temp, entry);
    return { record, fresh: true };
  } finally {
    if (early !== undefined) await early.discard();
    await rm(temp, { recursive: true, force: true });
    if (slot !== undefined) unlock(slot);
    unlock(lockFile);
  }
}

/**
 * Seals an unpacked root before it enters the cache: device nodes, fifos and sockets are removed
 * (an image has no business handing the host a device, and a sandbox's /dev is its own), setuid
 * and setgid bits are cleared (nothing in a sandbox gains privilege by exec), and group and other
 * write bits are cleared (no other user may change a shared root; inside a sandbox its uid owns
 * the files, so its own writes are unaffected); with `owner` (a root service) every file is
 * chowned to it (no symlink followed). `find` does the walks over the staging directory `temp`
 * (the root in `rootfs/`): one process, off the event loop, on roots of a million files; one walk
 * changes, a second checks what is left and counts the bytes the entry takes (du's count: each
 * inode's blocks once). Symlinks are left as they are: they resolve inside the sandbox's root, and
 * the service reads the root only through safeRead.
 */
async function sealRootfs(reference: string, temp: string, owner: { uid: number; gid: number } | undefined): Promise<{ report: SealReport; bytes: number }> {
  const rootfs = join(temp, 'rootfs');
  const find = async (args: string[], what: string): Promise<string[]> => {
    try {
      const { stdout } = await run('find', [temp, '-xdev', ...args], { maxBuffer: 1024 * 1024 * 1024, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C' } });
      return stdout.split('\0').filter((line) => line !== '');
    } catch (error) {
      const e = error as NodeJS.ErrnoException & { stderr?: string };
      throw imageError(reference, `cannot seal the image (${what}): ${(e.stderr ?? e.message).trim().split('\n').slice(-3).join('\n')}`, error);
    }
  };
  const special = ['(', '-type', 'b', '-o', '-type', 'c', '-o', '-type', 'p', '-o', '-type', 's', ')'];
  const plain = ['(', '-type', 'f', '-o', '-type', 'd', ')'];
  const changed = await find(
    [
      ...(owner === undefined ? [] : ['(', '(', ...plain, '-o', '-type', 'l', ')', '-exec', 'chown', '-h', `${owner.uid}:${owner.gid}`, '{}', '+', ')', ',']),
      '(', ...special, '-printf', 'D%p\\0', '-delete', ')', ',',
      '(', ...plain, '-perm', '/6000', '-printf', 'S%p\\0', ')', ',',
      '(', ...plain, '-perm', '/022', '-printf', 'W%p\\0', ')', ',',
      '(', ...plain, '-perm', '/6022', '-exec', 'chmod', 'go-w,ug-s', '{}', '+', ')',
    ],
    'removing device nodes, fifos and sockets, clearing setuid, setgid and group/other write bits',
  );
  const removed = changed.filter((line) => line.startsWith('D')).map((line) => line.slice(1));
  // what is left is checked, not assumed: a seal that did not take fails the image
  const checked = await find(['(', ...special, '-o', '(', '!', '-type', 'l', '-perm', '/6022', ')', ')', '-printf', 'U%p\\0', ',', '-printf', 'B%i %b\\0'], 'checking the seal');
  const left = checked.filter((line) => line.startsWith('U')).map((line) => line.slice(1));
  if (left.length > 0) throw imageError(reference, `cannot seal the image: ${left.slice(0, 5).map((p) => p.slice(rootfs.length)).join(', ')} still unsafe`);
  const blocks = new Map<string, number>();
  for (const line of checked) {
    if (!line.startsWith('B')) continue;
    const [inode = '', count = '0'] = line.slice(1).split(' ');
    blocks.set(inode, Number(count));
  }
  let bytes = 0;
  for (const count of blocks.values()) bytes += count * 512;
  return {
    report: {
      removed: removed.slice(0, 100).map((path) => path.slice(rootfs.length) || '/'),
      setid: changed.filter((line) => line.startsWith('S')).length,
      writable: changed.filter((line) => line.startsWith('W')).length,
    },
    bytes,
  };
}
