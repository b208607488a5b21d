import { spawn } from 'node:child_process';
import { chownSync, closeSync, mkdirSync, openSync, readSync, statSync } from 'node:fs';
import { chmod, lstat, readdir, rename, rm } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { basename, dirname, join } from 'node:path';
import PQueue from 'p-queue';
import { missingTool, run, toolEnv } from '../tools.ts';
import type { UnpackJob } from './kind.ts';

// An OCI image's layers unpacked by GNU tar, then stacked into one root filesystem here, in place
// of `umoci raw unpack` (which stays the fallback: oci.ts). Unpacking is bound by creating files
// (hundreds of microseconds of kernel time each on this CI's ext4), which one process does one at
// a time, so the layers are extracted at once, each into a directory of its own, and a large
// uncompressed layer is split into contiguous runs of its entries (cut at entry boundaries found
// by reading its headers alone), several tar processes (each fed its run by dd) writing into the
// layer's one directory.
// A run is cut only where nothing crosses it: no name twice, no entry under a symlink, file or
// hard link of the layer, no hard link to another run, no directory its owner cannot write (a tar
// process restores a directory's mode when it is done, while another may still write into it).
//
// The tools run as the unpacking uid in the staging directory; GNU tar refuses `..` members, strips
// absolute names and leaves symlinks to absolute or `..` targets until the end of its archive. The
// rest is done here, as the service, over what the tools left: the layers stacked lowest first (the
// lowest layer's directory becomes the root; an upper layer's entries are renamed in, a whole
// directory when the root has none there, entry by entry where both have a directory), after its
// whiteouts removed what they name below (`.wh.<name>` one entry, `.wh..wh..opq` a directory's
// entries; they apply to lower layers only). Nothing here follows a symlink: every entry is
// lstat'ed, a whiteout or a directory merge reaches only through real directories of the root,
// and an entry of an upper layer replaces a lower symlink instead of writing through it (umoci
// would resolve a path through the lower symlink inside the root: `a -> /etc` below and `a/x`
// above make `/etc/x` there, `/a/x` here; both stay inside the root).
//
// What tar does not do as umoci would makes the image fall back to umoci: a media type it does not
// know (tar, gzip and zstd layers are its), or any tar error but a device node it may not make
// (the seal removes them anyway; umoci leaves an empty file in their place): a `..` member, a hard
// link to a file of another layer, a write under a symlink of the same archive.

const PARALLEL_MAX = 4;
/** Bytes read at once while reading a layer's headers. */
const WINDOW = 64 * 1024;
/** A layer with fewer entries is extracted by one tar. */
const SPLIT_MIN_ENTRIES = 2000;

const COMPRESSION: Record<string, '' | 'gzip' | 'zstd'> = {
  'application/vnd.oci.image.layer.v1.tar': '',
  'application/vnd.oci.image.layer.v1.tar+gzip': 'gzip',
  'application/vnd.oci.image.layer.v1.tar+zstd': 'zstd',
  'application/vnd.oci.image.layer.nondistributable.v1.tar': '',
  'application/vnd.oci.image.layer.nondistributable.v1.tar+gzip': 'gzip',
  'application/vnd.oci.image.layer.nondistributable.v1.tar+zstd': 'zstd',
  'application/vnd.docker.image.rootfs.diff.tar.gzip': 'gzip',
  'application/vnd.docker.image.rootfs.foreign.diff.tar.gzip': 'gzip',
};

export interface LayerDescriptor {
  mediaType?: string;
  digest: string;
}

/** How the layers were unpacked into `job.rootfs` (`tar`, with the layers split into runs), or why they were left to umoci. */
export type LayersOutcome = { unpackedWith: string } | { fallback: string };

/**
 * Unpacks the layers of a layout (`blobs/<alg>/<hex>`) into `job.rootfs`; answers how, or why not
 * when umoci must do it instead (nothing is then left in the staging directory but what was there).
 */
export async function unpackLayers(job: UnpackJob, layout: string, layers: readonly LayerDescriptor[]): Promise<LayersOutcome> {
  const blobs: Array<{ path: string; compression: '' | 'gzip' | 'zstd' }> = [];
  for (const layer of layers) {
    const compression = COMPRESSION[layer.mediaType ?? ''];
    const match = /^([a-z0-9]+):([a-f0-9]{32,128})$/.exec(layer.digest);
    if (compression === undefined || match === null) return { fallback: `layer media type ${JSON.stringify(layer.mediaType)}` };
    blobs.push({ path: join(layout, 'blobs', match[1]!, match[2]!), compression });
  }
  if (blobs.length === 0) return { fallback: 'no layers' };
  const dirs = blobs.map((_, i) => join(job.staging, `layer-${i}`));
  // bound by creating files in the kernel, not by CPU: more writers than cores still gain (on this
  // CI's 2 cores under load, 4 tar processes unpacked a 218 MB layer in 7-17 s where 2 took 20-28 s)
  const workers = Math.min(PARALLEL_MAX, 2 * availableParallelism());
  const split: string[] = [];
  try {
    // the runs of each layer: a large uncompressed one is split when it may be
    const tasks: Array<{ layer: number; blob: string; compression: '' | 'gzip' | 'zstd'; bytes: number; range?: { start: number; end: number } }> = [];
    for (const [i, blob] of blobs.entries()) {
      const runs = blob.compression === '' ? await splitLayer(blob.path, workers) : undefined;
      if (runs === undefined) tasks.push({ layer: i, blob: blob.path, compression: blob.compression, bytes: statSync(blob.path).size });
      else {
        split.push(`layer ${i} in ${runs.length} runs`);
        for (const range of runs) tasks.push({ layer: i, blob: blob.path, compression: '', bytes: range.end - range.start, range });
      }
    }
    tasks.sort((a, b) => b.bytes - a.bytes);
    for (const dir of dirs) {
      mkdirSync(dir, { mode: 0o700 });
      if (job.unpackAs !== undefined) chownSync(dir, job.unpackAs.uid, job.unpackAs.gid);
    }
    const queue = new PQueue({ concurrency: workers });
    const failures: string[] = [];
    // the largest first (a compressed layer's bytes count for more than they say, alike for all);
    // every tar is done before anything else happens to the directories
    const settled = await Promise.allSettled(
      tasks.map((task) =>
        queue.add(async () => {
          if (failures.length > 0) return;
          const failure = await extract(job, task.blob, task.compression, dirs[task.layer]!, task.range);
          if (failure !== undefined) failures.push(failure);
        }),
      ),
    );
    for (const outcome of settled) if (outcome.status === 'rejected') throw outcome.reason;
    if (failures.length > 0) return { fallback: failures[0]! };
    await stack(dirs, job.rootfs);
    return { unpackedWith: split.length === 0 ? 'tar' : `tar (${split.join(', ')})` };
  } catch (error) {
    job.signal?.throwIfAborted();
    return { fallback: error instanceof Error ? error.message : String(error) };
  } finally {
    await Promise.all(dirs.map((dir) => removeTree(dir)));
  }
}

/**
 * Removes a directory tree; one an unprivileged service cannot (a directory of the image its
 * owner may not write, as tar restores it) is made writable first (no symlink followed).
 */
export async function removeTree(dir: string): Promise<void> {
  try {
    await rm(dir, { recursive: true, force: true });
  } catch {
    await run('find', [dir, '-type', 'd', '-exec', 'chmod', 'u+rwx', '{}', '+'], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C' } }).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  }
}

/** tar's complaints that do not fail a layer: a device node it may not make (the seal removes them), warnings. */
const HARMLESS = [/: Cannot mknod: Operation not permitted$/, /^tar: Exiting with failure status due to previous errors$/, /^tar: Removing leading `\/' from /, /: time stamp .* is .* in the future$/];

/**
 * One tar over a layer, or over a run of it (read by `dd` into its stdin: a run ends at an entry
 * boundary, which tar takes for the archive's end), into `dir`; answers what went wrong, if anything did.
 */
async function extract(job: UnpackJob, blob: string, compression: '' | 'gzip' | 'zstd', dir: string, range: { start: number; end: number } | undefined): Promise<string | undefined> {
  const options = {
    cwd: '/',
    env: toolEnv(job.unpackAs),
    ...(job.signal === undefined ? {} : { signal: job.signal }),
    ...(job.unpackAs === undefined ? {} : { uid: job.unpackAs.uid, gid: job.unpackAs.gid }),
  };
  const feeder =
    range === undefined
      ? undefined
      : spawn('dd', [`if=${blob}`, 'bs=1M', 'iflag=skip_bytes,count_bytes', `skip=${range.start}`, `count=${range.end - range.start}`, 'status=none'], { ...options, stdio: ['ignore', 'pipe', 'pipe'] });
  const args = ['-x', '--no-same-owner', '-p', '--no-acls', '--no-selinux', '--no-xattrs', '-C', dir, ...(compression === 'gzip' ? ['--gzip'] : compression === 'zstd' ? ['--zstd'] : []), '-f', feeder === undefined ? blob : '-'];
  const child = spawn('tar', args, { ...options, stdio: [feeder === undefined ? 'ignore' : feeder.stdout!, 'ignore', 'pipe'] });
  // the pipe is tar's alone now: dd sees it closed when tar is gone
  feeder?.stdout!.destroy();
  const finished = (process: ReturnType<typeof spawn>): Promise<{ code: number | null; stderr: string }> => {
    let stderr = '';
    process.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      if (stderr.length < 64 * 1024) stderr += chunk;
    });
    return new Promise((resolve, reject) => {
      process.once('error', reject);
      process.once('close', (code) => resolve({ code, stderr }));
    });
  };
  let tar: { code: number | null; stderr: string };
  let dd: { code: number | null; stderr: string } | undefined;
  try {
    [tar, dd] = await Promise.all([finished(child), feeder === undefined ? undefined : finished(feeder)]);
  } catch (error) {
    feeder?.kill();
    child.kill();
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw missingTool(feeder !== undefined && (error as { path?: string }).path === 'dd' ? 'dd' : 'tar', error);
    throw error;
  }
  job.signal?.throwIfAborted();
  if (dd !== undefined && dd.code !== 0) return `dd: ${dd.stderr.trim().split('\n').slice(-1)[0] ?? `exit status ${dd.code}`}`;
  if (tar.code === 0) return undefined;
  const lines = tar.stderr.split('\n').filter((line) => line !== '');
  if (tar.code === 2 && lines.every((line) => HARMLESS.some((pattern) => pattern.test(line)))) return undefined;
  return `tar: ${lines.filter((line) => !HARMLESS.some((pattern) => pattern.test(line))).slice(0, 3).join('; ') || `exit status ${tar.code}`}`;
}

/**
 * Byte ranges of an uncompressed layer, cut at entry boundaries, for `workers` tar processes at
 * once; undefined when it is small or may not be split (see the top of the file).
 */
export async function splitLayer(blob: string, workers: number): Promise<Array<{ start: number; end: number }> | undefined> {
  if (workers < 2) return undefined;
  const index = await indexTar(blob);
  if (index === undefined || index.entries.length < SPLIT_MIN_ENTRIES) return undefined;
  const { entries } = index;
  const byName = new Map<string, number>();
  for (const [i, entry] of entries.entries()) {
    if (byName.has(entry.name)) return undefined;
    byName.set(entry.name, i);
    if (entry.type === '5' && (entry.mode & 0o700) !== 0o700) return undefined;
  }
  for (const entry of entries) {
    // every ancestor named in the layer is a directory
    for (let at = entry.name.indexOf('/'); at > 0; at = entry.name.indexOf('/', at + 1)) {
      const parent = byName.get(entry.name.slice(0, at));
      if (parent !== undefined && entries[parent]!.type !== '5') return undefined;
    }
  }
  // runs of about equal cost: a file's creation, and its bytes
  const cost = (entry: TarEntry) => 1 + entry.size / 65536;
  const total = entries.reduce((sum, entry) => sum + cost(entry), 0);
  const run = new Array<number>(entries.length);
  let acc = 0;
  for (const [i, entry] of entries.entries()) {
    run[i] = Math.min(workers - 1, Math.floor((acc / total) * workers));
    acc += cost(entry);
  }
  // a hard link goes to its target's run (the runs after it start later)
  for (const [i, entry] of entries.entries()) {
    if (entry.type !== '1') continue;
    const target = byName.get(entry.link);
    if (target === undefined || target > i) return undefined;
    for (let j = target + 1; j <= i; j++) run[j] = run[target]!;
  }
  const ranges: Array<{ start: number; end: number }> = [];
  for (const [i, entry] of entries.entries()) {
    if (i === 0 || run[i] !== run[i - 1]) {
      if (ranges.length > 0) ranges[ranges.length - 1]!.end = entry.start;
      ranges.push({ start: entry.start, end: index.end });
    }
  }
  return ranges.length >= 2 ? ranges : undefined;
}

interface TarEntry {
  /** The name, normalised (no `./`, no leading or trailing `/`). */
  name: string;
  /** The typeflag ('0' file, '1' hard link, '2' symlink, '5' directory, ...). */
  type: string;
  mode: number;
  size: number;
  /** A hard link's target, normalised. */
  link: string;
  /** Where its headers begin (its pax or GNU long-name headers first). */
  start: number;
}

/**
 * The entries of an uncompressed tar, read from their headers alone (the data is skipped);
 * undefined for what the split does not handle (global pax headers, sparse or multi-volume
 * entries, `..` names, a header it cannot read).
 */
async function indexTar(blob: string): Promise<{ entries: TarEntry[]; end: number } | undefined> {
  const fd = openSync(blob, 'r');
  try {
    const entries: TarEntry[] = [];
    // headers are read through a window of the file: the small entries of a layer share one read
    const window = Buffer.alloc(WINDOW);
    let windowAt = 0;
    let windowLength = 0;
    let block = window.subarray(0, 0);
    const text = (from: number, length: number) => {
      const field = block.subarray(from, from + length);
      const nul = field.indexOf(0);
      return field.subarray(0, nul < 0 ? length : nul).toString('utf8');
    };
    const octal = (from: number, length: number): number | undefined => {
      if ((block[from]! & 0x80) !== 0) return undefined; // base-256: larger than this split needs to know
      const value = text(from, length).trim();
      return /^[0-7]+$/.test(value) ? Number.parseInt(value, 8) : value === '' ? 0 : undefined;
    };
    let offset = 0;
    let start = 0;
    let pax: Record<string, string> = {};
    let longName: string | undefined;
    let longLink: string | undefined;
    for (let n = 0; ; n++) {
      // the event loop gets a turn now and then: a layer has tens of thousands of entries
      if (n % 4000 === 3999) await new Promise((resolve) => setImmediate(resolve));
      if (offset < windowAt || offset + 512 > windowAt + windowLength) {
        windowAt = offset;
        windowLength = readSync(fd, window, 0, WINDOW, offset);
        if (windowLength < 512) return undefined;
      }
      block = window.subarray(offset - windowAt, offset - windowAt + 512);
      let sum = 0;
      for (let i = 0; i < 512; i++) sum += block[i]!;
      if (sum === 0) return { entries, end: offset };
      for (let i = 148; i < 156; i++) sum += 32 - block[i]!;
      // the checksum: a block that is not a header means the offsets are wrong
      if (octal(148, 8) !== sum) return undefined;
      const type = String.fromCharCode(block[156]! || 48);
      let size = octal(124, 12);
      if (size === undefined) return undefined;
      const dataEnd = offset + 512 + Math.ceil(size / 512) * 512;
      const readData = (): string | undefined => {
        const data = Buffer.alloc(size!);
        return readSync(fd, data, 0, size!, offset + 512) === size ? data.toString('utf8') : undefined;
      };
      if (type === 'x') {
        const data = readData();
        if (data === undefined) return undefined;
        for (const [key, value] of parsePax(data)) pax[key] = value;
        offset = dataEnd;
        continue;
      }
      if (type === 'L' || type === 'K') {
        const data = readData();
        if (data === undefined) return undefined;
        if (type === 'L') longName = data.replace(/\0.*$/s, '');
        else longLink = data.replace(/\0.*$/s, '');
        offset = dataEnd;
        continue;
      }
      if (!'01234567'.includes(type) || Object.keys(pax).some((key) => key.startsWith('GNU.sparse'))) return undefined;
      // a header-only entry with a size: readers disagree on whether data follows
      if ('123456'.includes(type) && size !== 0) return undefined;
      if (pax.size !== undefined) {
        if (!/^\d+$/.test(pax.size)) return undefined;
        size = Number(pax.size);
      }
      const ustar = block.subarray(257, 263).toString('latin1') === 'ustar\0';
      const prefix = ustar ? text(345, 155) : '';
      const raw = pax.path ?? longName ?? (prefix === '' ? text(0, 100) : `${prefix}/${text(0, 100)}`);
      const name = normalise(raw);
      const link = normalise(pax.linkpath ?? longLink ?? text(157, 100));
      const mode = octal(100, 8);
      // ('' is the layer's root, `./`)
      if (name === undefined || (name === '' && type !== '5') || mode === undefined || (type === '1' && link === undefined)) return undefined;
      entries.push({ name, type: type === '7' ? '0' : type, mode, size: type === '0' || type === '7' ? size : 0, link: link ?? '', start });
      offset = offset + 512 + Math.ceil(size / 512) * 512;
      start = offset;
      pax = {};
      longName = undefined;
      longLink = undefined;
    }
  } finally {
    closeSync(fd);
  }
}

/** A name without `./`, leading or trailing `/`; undefined when it has a `..`. */
function normalise(name: string): string | undefined {
  const parts = name.split('/').filter((part) => part !== '' && part !== '.');
  return parts.includes('..') ? undefined : parts.join('/');
}

/** The records of a pax extended header (`<length> <key>=<value>\n`). */
function parsePax(data: string): Array<[string, string]> {
  const records: Array<[string, string]> = [];
  const bytes = Buffer.from(data, 'utf8');
  let at = 0;
  while (at < bytes.length) {
    const space = bytes.indexOf(0x20, at);
    if (space < 0) break;
    const length = Number(bytes.subarray(at, space).toString('latin1'));
    if (!Number.isInteger(length) || length <= 0) break;
    const record = bytes.subarray(space + 1, at + length - 1).toString('utf8');
    const eq = record.indexOf('=');
    if (eq > 0) records.push([record.slice(0, eq), record.slice(eq + 1)]);
    at += length;
  }
  return records;
}

/**
 * Stacks the extracted layers (lowest first) into `rootfs`: the lowest one's directory becomes
 * it, each upper one's whiteouts remove what they name below, then its entries are moved in.
 */
export async function stack(dirs: readonly string[], rootfs: string): Promise<void> {
  const whiteouts = await findWhiteouts(dirs);
  await removeAll(dirs[0]!, whiteouts[0]!);
  await rename(dirs[0]!, rootfs);
  for (let i = 1; i < dirs.length; i++) {
    const layer = dirs[i]!;
    const own = whiteouts[i]!;
    for (const path of own) {
      const name = basename(path);
      const target = await realDirectory(rootfs, dirname(path));
      if (target === undefined) continue;
      if (name === '.wh..wh..opq') {
        for (const child of await readdir(target)) await rm(join(target, child), { recursive: true, force: true });
      } else {
        const gone = name.slice('.wh.'.length);
        if (gone !== '' && gone !== '.' && gone !== '..') await rm(join(target, gone), { recursive: true, force: true });
      }
    }
    await removeAll(layer, own);
    await moveInto(layer, rootfs);
  }
}

/** The whiteouts of each layer (paths relative to its directory), by one `find` over them all. */
async function findWhiteouts(dirs: readonly string[]): Promise<string[][]> {
  const { stdout } = await run('find', [...dirs, '-name', '.wh.*', '-print0', '-prune'], { maxBuffer: 256 * 1024 * 1024, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C' } });
  const found = dirs.map((): string[] => []);
  for (const path of stdout.split('\0')) {
    if (path === '') continue;
    const layer = dirs.findIndex((dir) => path.startsWith(`${dir}/`));
    if (layer >= 0) found[layer]!.push(path.slice(dirs[layer]!.length + 1));
  }
  // a whiteout of a directory before anything under it (opaque markers of subdirectories come after)
  for (const list of found) list.sort((a, b) => a.split('/').length - b.split('/').length || (a < b ? -1 : 1));
  return found;
}

async function removeAll(dir: string, paths: readonly string[]): Promise<void> {
  for (const path of paths) await rm(join(dir, path), { recursive: true, force: true });
}

/** `path` under `root` when each of its components is a directory (lstat: a symlink is not one). */
async function realDirectory(root: string, path: string): Promise<string | undefined> {
  let at = root;
  for (const part of path.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') return undefined;
    at = join(at, part);
    const stat = await lstat(at).catch(() => undefined);
    if (stat === undefined || !stat.isDirectory()) return undefined;
  }
  return at;
}

/** Moves the entries of `upper` into `lower`: merged where both are directories, else replacing (never through a symlink). */
async function moveInto(upper: string, lower: string): Promise<void> {
  for (const name of await readdir(upper)) {
    const from = join(upper, name);
    const to = join(lower, name);
    const above = await lstat(from);
    const below = await lstat(to).catch(() => undefined);
    if (below !== undefined && above.isDirectory() && below.isDirectory()) {
      await moveInto(from, to);
      // the upper layer's directory metadata wins
      await chmod(to, above.mode & 0o7777);
      continue;
    }
    if (below !== undefined) await rm(to, { recursive: true, force: true });
    await rename(from, to);
  }
}
