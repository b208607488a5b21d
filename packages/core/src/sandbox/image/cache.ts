import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { linkSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { RolloutError } from '../../errors.ts';
import { processIdentity } from '../staging.ts';

/*
 * What several processes of one host (a service and its rollout nodes) sharing one image cache
 * agree on, through files of the cache directory only (no process knows the others):
 *
 * - Lock files hold "<pid> <start time>" of their holder (made whole by link(2), so a lock is never
 *   seen empty); a lock whose holder is gone (by pid and start time: a reused pid does not match)
 *   is taken over. `<entry>.lock` is an entry's: its unpack, or its eviction. `.evict.lock` lets
 *   one process at a time evict. `.unpacks/<n>.lock` are the host's unpack slots: at most that
 *   many first uses unpack at once, whichever processes they are in.
 * - A use of an entry (a sandbox on it) is a file `.uses/<entry>/<pid>-<start>-<random>` holding
 *   its process's identity, removed when the sandbox closes; a use whose process is gone counts
 *   for nothing. The directory's mtime, which every use changes, is the entry's last use (LRU).
 * - Eviction: over the cap, the least recently used entries without a live use go, each under its
 *   entry lock: renamed out of the way first, its uses checked again after the rename (a use taken
 *   in between puts it back), then removed. A use is taken before its entry is read, so one of the
 *   two always sees the other: the evictor sees the use, or the user finds the entry gone and
 *   unpacks it again.
 */

const run = promisify(execFile);

/** The entries of a cache: one directory per digest. */
const ENTRY = /^sha256-[0-9a-f]{64}$/;

function identity(): string {
  return processIdentity('self') ?? `${process.pid} 0`;
}

function holderGone(file: string): boolean {
  let owner: string;
  try {
    owner = readFileSync(file, 'latin1').slice(0, 64).trim();
  } catch {
    return false; // gone already: the caller tries again
  }
  const pid = Number(owner.split(' ')[0]);
  if (!Number.isInteger(pid) || pid <= 0) return true;
  // a lock of the older form holds the pid alone
  if (!owner.includes(' ')) {
    try {
      process.kill(pid, 0);
      return false;
    } catch (error) {
      return (error as NodeJS.ErrnoException).code === 'ESRCH';
    }
  }
  return processIdentity(pid) !== owner;
}

/** Takes `lock` when free (or left by a process that is gone); false when another process holds it. */
export function tryLock(lock: string): boolean {
  const temp = `${lock}.${randomBytes(6).toString('hex')}`;
  writeFileSync(temp, identity(), { mode: 0o600 });
  try {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        linkSync(temp, lock);
        return true;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      }
      if (!holderGone(lock)) return false;
      try {
        unlinkSync(lock);
      } catch {
        // another waiter took it away first
      }
    }
    return false;
  } finally {
    unlinkSync(temp);
  }
}

export function unlock(lock: string): void {
  try {
    unlinkSync(lock);
  } catch {
    // already gone
  }
}

/** Waits for `lock` until `deadline` (then UNAVAILABLE, retryable, saying `what`). */
export async function lock(lockFile: string, deadline: number, what: string): Promise<void> {
  while (!tryLock(lockFile)) {
    if (Date.now() > deadline) throw new RolloutError({ code: 'UNAVAILABLE', message: `${what} (${lockFile})`, retryable: true });
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Takes one of the host's `slots` unpack slots of this cache, waiting for one to be free; returns
 * the lock to give back (unlock).
 */
export async function takeUnpackSlot(cacheDir: string, slots: number, deadline: number, what: string, signal?: AbortSignal): Promise<string> {
  const dir = join(cacheDir, '.unpacks');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  for (;;) {
    signal?.throwIfAborted();
    for (let i = 0; i < slots; i++) {
      const slot = join(dir, `${i}.lock`);
      if (tryLock(slot)) return slot;
    }
    if (Date.now() > deadline) throw new RolloutError({ code: 'UNAVAILABLE', message: `${what}: all ${slots} unpack slots of ${cacheDir} stayed busy`, retryable: true });
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const usesDir = (cacheDir: string, entryName: string): string => join(cacheDir, '.uses', entryName);

/**
 * Records a use of the entry `entryName` by this process (before the entry is read: see above);
 * returns the function that ends it (idempotent).
 */
export function holdEntry(cacheDir: string, entryName: string): () => void {
  const dir = usesDir(cacheDir, entryName);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = join(dir, `${process.pid}-${randomBytes(6).toString('hex')}`);
  writeFileSync(file, identity(), { mode: 0o600 });
  let held = true;
  return () => {
    if (!held) return;
    held = false;
    unlock(file);
  };
}

/** Marks the entry used now, without holding it (a resolve whose caller holds nothing). */
export function touchEntry(cacheDir: string, entryName: string): void {
  const dir = usesDir(cacheDir, entryName);
  try {
    const now = new Date();
    utimesSync(dir, now, now);
  } catch {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }
}

/** Whether a process alive holds a use of the entry; uses of processes gone are removed. */
function inUse(cacheDir: string, entryName: string): boolean {
  const dir = usesDir(cacheDir, entryName);
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return false;
  }
  let live = false;
  for (const name of names) {
    const file = join(dir, name);
    if (holderGone(file)) unlock(file);
    else live = true;
  }
  return live;
}

/** Bytes an entry takes on disk (du), as its record notes them once known. */
export async function measureBytes(dir: string): Promise<number> {
  const { stdout } = await run('du', ['-s', '-B1', '-x', dir], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C' } });
  return Number(stdout.split('\t')[0]);
}

function lastUse(cacheDir: string, entryName: string): number {
  for (const path of [usesDir(cacheDir, entryName), join(cacheDir, entryName)]) {
    try {
      return statSync(path).mtimeMs;
    } catch {
      // not used yet: the entry's own time
    }
  }
  return 0;
}

export interface EvictionReport {
  /** Entries removed (names), least recently used first. */
  evicted: string[];
  /** Bytes of the entries left. */
  bytes: number;
  /** Entries over the cap that could not go: in use, or being unpacked. */
  kept: string[];
  /** The removal of the evicted entries' files (already out of the cache's names). */
  removed: Promise<void>;
}

/**
 * Brings the cache under `maxBytes`, least recently used entries first, never an entry in use or
 * locked (being unpacked or evicted by another process). `sizeOf` gives an entry's bytes (its
 * record's, else measured). One process at a time evicts; one that finds another at it returns.
 * Resolves once the entries to go are out of the way (renamed); their files are removed after
 * (`removed`).
 */
export async function evictToCap(cacheDir: string, maxBytes: number, sizeOf: (entry: string) => Promise<number>): Promise<EvictionReport> {
  const report: EvictionReport = { evicted: [], bytes: 0, kept: [], removed: Promise.resolve() };
  const aside: string[] = [];
  const evictLock = join(cacheDir, '.evict.lock');
  if (!tryLock(evictLock)) return report;
  try {
    const entries: Array<{ name: string; bytes: number; used: number }> = [];
    for (const name of readdirSync(cacheDir)) {
      if (!ENTRY.test(name)) continue;
      try {
        if (!lstatSync(join(cacheDir, name)).isDirectory()) continue;
      } catch {
        continue;
      }
      entries.push({ name, bytes: await sizeOf(join(cacheDir, name)), used: lastUse(cacheDir, name) });
    }
    let total = entries.reduce((sum, entry) => sum + entry.bytes, 0);
    entries.sort((a, b) => a.used - b.used);
    for (const entry of entries) {
      if (total <= maxBytes) break;
      const path = join(cacheDir, entry.name);
      const entryLock = `${path}.lock`;
      if (inUse(cacheDir, entry.name) || !tryLock(entryLock)) {
        report.kept.push(entry.name);
        continue;
      }
      const away = join(cacheDir, `.evict-${entry.name}-${randomBytes(6).toString('hex')}`);
      try {
        renameSync(path, away);
        // a use taken between the check and the rename: it stays
        if (inUse(cacheDir, entry.name)) {
          renameSync(away, path);
          report.kept.push(entry.name);
          continue;
        }
      } finally {
        unlock(entryLock);
      }
      aside.push(away);
      total -= entry.bytes;
      report.evicted.push(entry.name);
    }
    report.bytes = total;
    // and what evictors that died left aside
    for (const name of readdirSync(cacheDir)) {
      if (name.startsWith('.evict-') && !name.endsWith('.lock') && !aside.includes(join(cacheDir, name))) {
        try {
          if (Date.now() - lstatSync(join(cacheDir, name)).ctimeMs > 60_000) aside.push(join(cacheDir, name));
        } catch {
          // removed by another process meanwhile
        }
      }
    }
    report.removed = Promise.all(aside.map((path) => rm(path, { recursive: true, force: true }))).then(() => undefined);
    return report;
  } finally {
    unlock(evictLock);
  }
}

/**
 * A size given as bytes or with a binary suffix (K, M, G, T; `B`, `iB` optional): `200G`,
 * `512MiB`, `1073741824`. Undefined for an empty string.
 */
export function parseSize(text: string | undefined, what: string): number | undefined {
  if (text === undefined || text.trim() === '') return undefined;
  const match = /^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$/i.exec(text);
  if (match === null) throw new RolloutError({ code: 'SANDBOX', message: `${what}: ${JSON.stringify(text)} is not a size (bytes, or a number with K, M, G or T)` });
  const power = ['', 'K', 'M', 'G', 'T'].indexOf(match[2]!.toUpperCase());
  return Math.floor(Number(match[1]) * 1024 ** power);
}
