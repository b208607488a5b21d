import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, closeSync, createReadStream, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, realpathSync, renameSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { promisify } from 'node:util';
import { RolloutError } from '../../errors.ts';
import { parseImageReference } from './reference.ts';
import { sifRootPartition } from './sif.ts';
import type { ImageConfig, ParsedImageReference, ResolvedImage, ResolveImageOptions } from './types.ts';

const run = promisify(execFile);

/*
 * The cache: `<cacheDir>/<digest>/` holds `rootfs/` and `image.json` (the digest, the config and
 * the seal). An entry is unpacked into `<cacheDir>/.tmp-*` and renamed into place complete, so a
 * half-unpacked image is never used; `<entry>.lock` (O_EXCL, holding the pid) makes processes
 * unpack an image once, and in one process concurrent first uses share one promise.
 * `<cacheDir>/.sources/` remembers the sha256 of image files by path, size, mtime and inode, so a
 * second resolve reads no image file.
 *
 * The cache is the service's alone: the directory is mode 0700 and everything in it belongs to
 * the service's user (nothing is handed to a sandbox uid); sandboxes see an image root only
 * through their overlay (read-only lower layer), under a root service through an idmapped clone
 * (overlay.ts). Unpacking seals the root before it is renamed into place (sealRootfs): device
 * nodes, fifos and sockets are removed, setuid/setgid bits and group/other write bits cleared.
 * Unpacking runs with umoci's --rootless even as root (no device nodes, no ownership from the
 * image), and under a root service as an unprivileged uid (`unpackAs`, the sandbox's: 65534) in
 * a staging directory of its own: the cache directory is then 0711 (that uid may enter its
 * staging directory, list nothing), every entry 0700; only when the tools are done does the
 * service take the files (chown), seal them and rename the entry into place.
 */

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

const inFlight = new Map<string, Promise<CacheRecord>>();
const remembered = new Map<string, { stamp: string; entry: string; record: CacheRecord }>();

const imageError = (reference: string, message: string, cause?: unknown): RolloutError =>
  new RolloutError({ code: 'UNPROCESSABLE', message: `image ${JSON.stringify(reference)}: ${message}`, cause, details: { image: reference } });

/**
 * Resolves an image reference to an unpacked root filesystem in the cache, unpacking it on first
 * use. A reference that cannot be read is a BAD_REQUEST RolloutError; a missing or corrupt image
 * an UNPROCESSABLE one (422); a missing unpack tool (umoci, skopeo, unsquashfs) UNAVAILABLE.
 *
 * @example
 * const image = await resolveImage('oci:/images/sweb.eval.django-11099:latest');
 * // image.rootfs: the read-only root; image.config: { env, workdir, user }
 */
export async function resolveImage(reference: string, options: ResolveImageOptions = {}): Promise<ResolvedImage> {
  const parsed = parseImageReference(reference);
  const cacheDir = options.cacheDir ?? defaultImageCacheDir();
  const stamp = sourceStamp(reference, parsed);
  const memoKey = `${cacheDir}\0${reference}`;
  const memo = remembered.get(memoKey);
  // at every use the entry is checked against the source's digest (the cache key) and its seal
  if (memo !== undefined && memo.stamp === stamp && readRecord(memo.entry, memo.record.digest) !== undefined) {
    return { reference, digest: memo.record.digest, rootfs: join(memo.entry, 'rootfs'), config: memo.record.config, unpacked: false };
  }
  ensureCacheDir(cacheDir);
  const digest = await imageDigest(reference, parsed, cacheDir, stamp);
  const entry = join(cacheDir, digest.replace(':', '-'));
  let unpacked = false;
  let record = readRecord(entry, digest);
  if (record === undefined) {
    let pending = inFlight.get(entry);
    if (pending === undefined) {
      const unpackAs = process.getuid?.() === 0 ? (options.unpackAs ?? DEFAULT_UNPACK_USER) : undefined;
      const started = unpackOnce(reference, parsed, digest, cacheDir, entry, options.lockTimeoutMs ?? 600_000, unpackAs);
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
  return { reference, digest, rootfs: join(entry, 'rootfs'), config: record.config, unpacked };
}

const checkedDirs = new Set<string>();

function ensureCacheDir(cacheDir: string): void {
  if (checkedDirs.has(cacheDir)) return;
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
  checkedDirs.add(cacheDir);
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
  const path = parsed.kind === 'oci' ? join(parsed.path, 'index.json') : parsed.path;
  try {
    const stat = statSync(path);
    if (!stat.isFile()) throw imageError(reference, `${path} is not a file`);
    return `${stat.size}:${stat.mtimeMs}:${stat.ino}`;
  } catch (error) {
    if (RolloutError.isInstance(error)) throw error;
    throw imageError(reference, parsed.kind === 'oci' ? `no OCI image layout at ${parsed.path} (no index.json)` : `no image file at ${parsed.path}`, error);
  }
}

async function imageDigest(reference: string, parsed: ParsedImageReference, cacheDir: string, stamp: string): Promise<string> {
  if (parsed.kind === 'oci') return ociManifest(reference, parsed.path, parsed.tag).digest;
  const sources = join(cacheDir, '.sources');
  const note = join(sources, `${createHash('sha256').update(parsed.path).digest('hex')}.json`);
  try {
    const known = JSON.parse(readFileSync(note, 'utf8')) as { stamp: string; digest: string };
    if (known.stamp === stamp) return known.digest;
  } catch {
    // not hashed yet
  }
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(parsed.path)) hash.update(chunk as Buffer);
  const digest = `sha256:${hash.digest('hex')}`;
  mkdirSync(sources, { recursive: true, mode: 0o700 });
  const temp = `${note}.${randomBytes(4).toString('hex')}`;
  writeFileSync(temp, JSON.stringify({ stamp, digest }));
  renameSync(temp, note);
  return digest;
}

interface Descriptor {
  mediaType?: string;
  digest: string;
  annotations?: Record<string, string>;
  platform?: { architecture?: string; os?: string };
}

const REF_NAME = 'org.opencontainers.image.ref.name';
const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);
const GO_ARCH: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ppc64: 'ppc64le', s390x: 's390x' };

function readBlob(reference: string, layout: string, digest: string): unknown {
  const match = /^([a-z0-9]+):([a-f0-9]{32,128})$/.exec(digest);
  if (match === null) throw imageError(reference, `malformed digest ${JSON.stringify(digest)}`);
  const path = join(layout, 'blobs', match[1]!, match[2]!);
  let data: Buffer;
  try {
    data = readFileSync(path);
  } catch (error) {
    throw imageError(reference, `blob ${digest} is missing from ${layout}`, error);
  }
  try {
    return JSON.parse(data.toString('utf8'));
  } catch (error) {
    throw imageError(reference, `blob ${digest} is not JSON`, error);
  }
}

/** The manifest descriptor a tag names in an OCI layout (the only one when no tag is given). */
function ociManifest(reference: string, layout: string, tag: string | undefined): { digest: string; tag: string | undefined } {
  let index: { manifests?: Descriptor[] };
  try {
    index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as { manifests?: Descriptor[] };
  } catch (error) {
    throw imageError(reference, `no readable OCI index at ${join(layout, 'index.json')}`, error);
  }
  const manifests = Array.isArray(index.manifests) ? index.manifests : [];
  let chosen: Descriptor | undefined;
  if (tag !== undefined) chosen = manifests.find((m) => m.annotations?.[REF_NAME] === tag);
  else if (manifests.length === 1) chosen = manifests[0];
  else chosen = manifests.find((m) => m.annotations?.[REF_NAME] === 'latest');
  if (chosen === undefined || typeof chosen.digest !== 'string') {
    const tags = manifests.map((m) => m.annotations?.[REF_NAME]).filter((t) => t !== undefined);
    throw imageError(
      reference,
      tag === undefined ? `the layout holds ${manifests.length} images; name one by tag (${tags.join(', ')})` : `no tag "${tag}" in ${layout} (tags: ${tags.join(', ') || 'none'})`,
    );
  }
  // the digest names the cache entry: nothing but a digest may (no "/", no "..")
  if (!/^[a-z0-9]+:[a-f0-9]{32,128}$/.test(chosen.digest)) throw imageError(reference, `malformed manifest digest ${JSON.stringify(chosen.digest)}`);
  return { digest: chosen.digest, tag: chosen.annotations?.[REF_NAME] };
}

/** The image config of the manifest a descriptor names (following an index to this platform). */
function ociConfig(reference: string, layout: string, manifestDigest: string): { Env?: string[]; WorkingDir?: string; User?: string } {
  let manifest = readBlob(reference, layout, manifestDigest) as { mediaType?: string; manifests?: Descriptor[]; config?: Descriptor };
  if (Array.isArray(manifest.manifests) || (manifest.mediaType !== undefined && INDEX_TYPES.has(manifest.mediaType))) {
    const arch = GO_ARCH[process.arch] ?? process.arch;
    const entry = manifest.manifests?.find((m) => m.platform?.os === 'linux' && m.platform.architecture === arch);
    if (entry === undefined) throw imageError(reference, `no linux/${arch} image in the index`);
    manifest = readBlob(reference, layout, entry.digest) as typeof manifest;
  }
  if (manifest.config?.digest === undefined) throw imageError(reference, 'the manifest has no config');
  const config = readBlob(reference, layout, manifest.config.digest) as { config?: { Env?: string[]; WorkingDir?: string; User?: string } };
  return config.config ?? {};
}

async function tool(reference: string, argv: string[], what: string, as?: { uid: number; gid: number }): Promise<void> {
  try {
    await run(argv[0]!, argv.slice(1), { maxBuffer: 16 * 1024 * 1024, env: toolEnv(as), cwd: '/', ...(as === undefined ? {} : { uid: as.uid, gid: as.gid }) });
  } catch (error) {
    const e = error as NodeJS.ErrnoException & { stderr?: string; stdout?: string };
    if (e.code === 'ENOENT') {
      throw new RolloutError({
        code: 'UNAVAILABLE',
        message: `${argv[0]} is not installed; images need umoci, skopeo and squashfs-tools (apt-get install umoci skopeo squashfs-tools)`,
        cause: error,
      });
    }
    const detail = `${e.stderr ?? ''}${e.stdout ?? ''}`.trim().split('\n').slice(-5).join('\n');
    throw imageError(reference, `cannot ${what}: ${detail || e.message}`, error);
  }
}

/** The unpack tools' environment: the service's, without a HOME another uid cannot use. */
function toolEnv(as: { uid: number; gid: number } | undefined): NodeJS.ProcessEnv {
  return as === undefined ? { ...process.env, LC_ALL: 'C' } : { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C', HOME: '/', TMPDIR: '/tmp' };
}

async function unpackOnce(
  reference: string,
  parsed: ParsedImageReference,
  digest: string,
  cacheDir: string,
  entry: string,
  lockTimeoutMs: number,
  unpackAs: { uid: number; gid: number } | undefined,
): Promise<{ record: CacheRecord; fresh: boolean }> {
  const lock = `${entry}.lock`;
  const deadline = Date.now() + lockTimeoutMs;
  for (;;) {
    const done = readRecord(entry, digest);
    if (done !== undefined) return { record: done, fresh: false };
    try {
      closeSync(openSync(lock, 'wx', 0o644));
      writeFileSync(lock, String(process.pid));
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
    if (lockHolderGone(lock)) {
      try {
        unlinkSync(lock);
      } catch {
        // another waiter took it away first
      }
      continue;
    }
    // (a holder that died left its temp directory: removed by the next one to take the lock)
    if (Date.now() > deadline) throw new RolloutError({ code: 'UNAVAILABLE', message: `image ${reference}: still being unpacked by another process (${lock})`, retryable: true });
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const tempPrefix = `.tmp-${basename(entry)}-`;
  const temp = join(cacheDir, `${tempPrefix}${randomBytes(6).toString('hex')}`);
  try {
    // we hold the lock: any temp directory of this entry is left from a process that died
    for (const name of readdirSync(cacheDir)) {
      if (name.startsWith(tempPrefix)) await rm(join(cacheDir, name), { recursive: true, force: true });
    }
    const done = readRecord(entry, digest);
    if (done !== undefined) return { record: done, fresh: false };
    // an entry without a valid sealed record is not one of ours (entries appear complete, by rename)
    await rm(entry, { recursive: true, force: true });
    mkdirSync(temp, { mode: 0o700 });
    if (unpackAs !== undefined) chownSync(temp, unpackAs.uid, unpackAs.gid);
    const rootfs = join(temp, 'rootfs');
    let config: ImageConfig;
    let rawConfig: { Env?: string[]; WorkingDir?: string; User?: string } | undefined;
    if (parsed.kind === 'sif' || parsed.kind === 'squashfs') {
      let offset = 0;
      if (parsed.kind === 'sif') {
        const partition = sifRootPartition(parsed.path);
        if ('error' in partition) throw imageError(reference, `not a usable SIF: ${partition.error}`);
        offset = partition.offset;
      }
      // device nodes, fifos and sockets are not made at all (as root unsquashfs would make them;
      // otherwise it fails on them): the sealed root holds none anyway
      const specials = await squashfsSpecials(reference, parsed.path, offset, unpackAs);
      await tool(
        reference,
        ['unsquashfs', '-no-progress', '-quiet', '-no-xattrs', '-offset', String(offset), ...(specials.length > 0 ? ['-excludes'] : []), '-dest', rootfs, parsed.path, ...specials],
        'unpack the squashfs',
        unpackAs,
      );
    } else {
      let layout = parsed.path;
      let tag = parsed.kind === 'oci' ? ociManifest(reference, layout, parsed.tag).tag : undefined;
      if (tag === undefined) {
        // archives (and untagged layouts, which umoci cannot name) become a layout of our own
        layout = join(temp, 'layout');
        tag = 'image';
        const source = parsed.kind === 'oci' ? `oci:${parsed.path}` : `${parsed.kind}:${parsed.path}`;
        await tool(reference, ['skopeo', '--insecure-policy', 'copy', '--quiet', source, `oci:${layout}:${tag}`], 'read the image', unpackAs);
      }
      const manifest = ociManifest(reference, layout, tag);
      const raw = ociConfig(reference, layout, manifest.digest);
      await tool(reference, ['umoci', 'raw', 'unpack', '--rootless', '--image', `${layout}:${tag!}`, rootfs], 'unpack the image', unpackAs);
      if (layout !== parsed.path) await rm(layout, { recursive: true, force: true });
      rawConfig = raw;
    }
    // the unpacking uid is done: the service takes the files (no symlink followed), then reads them
    if (unpackAs !== undefined) await tool(reference, ['chown', '-R', '-P', `${process.getuid!()}:${process.getgid!()}`, temp], 'take ownership of the image');
    chmodSync(temp, 0o700);
    if (rawConfig === undefined) config = { env: singularityEnv(rootfs) };
    else {
      config = { env: envMap(rawConfig.Env ?? []), ...(rawConfig.WorkingDir ? { workdir: rawConfig.WorkingDir } : {}) };
      const user = rawConfig.User ? mapUser(rootfs, rawConfig.User) : undefined;
      if (user !== undefined && user.uid !== 0) config.user = user;
    }
    const sealReport = await sealRootfs(reference, rootfs);
    const record: CacheRecord = { reference, digest, config, sealed: SEAL_VERSION, sealReport };
    writeFileSync(join(temp, 'image.json'), JSON.stringify(record, null, 2));
    renameSync(temp, entry);
    return { record, fresh: true };
  } finally {
    await rm(temp, { recursive: true, force: true });
    try {
      unlinkSync(lock);
    } catch {
      // already gone
    }
  }
}

/**
 * Seals an unpacked root before it enters the cache: device nodes, fifos and sockets are removed
 * (an image has no business handing the host a device, and a sandbox's /dev is its own), setuid
 * and setgid bits are cleared (nothing in a sandbox gains privilege by exec), and group and other
 * write bits are cleared (no other user may change a shared root; inside a sandbox its uid owns
 * the files, so its own writes are unaffected). `find` does the walk: one process, off the event
 * loop, on roots of a million files. Symlinks are left as they are: they resolve inside the
 * sandbox's root, and the service reads the root only through safeRead.
 */
async function sealRootfs(reference: string, rootfs: string): Promise<SealReport> {
  const find = async (args: string[], what: string): Promise<string[]> => {
    try {
      const { stdout } = await run('find', [rootfs, '-xdev', ...args], { maxBuffer: 256 * 1024 * 1024, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C' } });
      return stdout.split('\0').filter((line) => line !== '');
    } catch (error) {
      const e = error as NodeJS.ErrnoException & { stderr?: string };
      throw imageError(reference, `cannot seal the image (${what}): ${(e.stderr ?? e.message).trim().split('\n').slice(-3).join('\n')}`, error);
    }
  };
  const removed = await find(['(', '-type', 'b', '-o', '-type', 'c', '-o', '-type', 'p', '-o', '-type', 's', ')', '-print0', '-delete'], 'removing device nodes, fifos and sockets');
  const setid = await find(['!', '-type', 'l', '-perm', '/6000', '-print0', '-exec', 'chmod', 'ug-s', '{}', '+'], 'clearing setuid and setgid bits');
  const writable = await find(['!', '-type', 'l', '-perm', '/022', '-print0', '-exec', 'chmod', 'go-w', '{}', '+'], 'clearing group and other write bits');
  // what is left is checked, not assumed: a seal that did not take fails the image
  const left = await find(['(', '-type', 'b', '-o', '-type', 'c', '-o', '-type', 'p', '-o', '-type', 's', '-o', '(', '!', '-type', 'l', '-perm', '/6022', ')', ')', '-print0'], 'checking the seal');
  if (left.length > 0) throw imageError(reference, `cannot seal the image: ${left.slice(0, 5).map((p) => p.slice(rootfs.length)).join(', ')} still unsafe`);
  return { removed: removed.slice(0, 100).map((path) => path.slice(rootfs.length) || '/'), setid: setid.length, writable: writable.length };
}

/** The device nodes, fifos and sockets of a squashfs (its paths, from `unsquashfs -lln`). */
async function squashfsSpecials(reference: string, file: string, offset: number, as: { uid: number; gid: number } | undefined): Promise<string[]> {
  let listing: string;
  try {
    ({ stdout: listing } = await run('unsquashfs', ['-lln', '-offset', String(offset), file], {
      maxBuffer: 512 * 1024 * 1024,
      env: toolEnv(as),
      cwd: '/',
      ...(as === undefined ? {} : { uid: as.uid, gid: as.gid }),
    }));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return []; // reported by the unpack itself
    const e = error as NodeJS.ErrnoException & { stderr?: string };
    throw imageError(reference, `cannot unpack the squashfs: ${(e.stderr ?? e.message).trim().split('\n').slice(-3).join('\n')}`, error);
  }
  const specials: string[] = [];
  for (const line of listing.split('\n')) {
    if (!/^[bcps]/.test(line)) continue;
    const at = line.indexOf(' squashfs-root/');
    if (at >= 0) specials.push(line.slice(at + ' squashfs-root/'.length));
  }
  return specials;
}

/**
 * A file of an unpacked root read by the service (its passwd, group, environment script): only
 * when it is a regular file whose real path stays inside the root. An image's symlink leads to
 * the host's files when followed from outside the sandbox, so one that leaves the root is not read.
 */
function safeRead(rootfs: string, path: string): string | undefined {
  try {
    const real = realpathSync(join(rootfs, path));
    const root = realpathSync(rootfs);
    if (!real.startsWith(`${root}/`) || !statSync(real).isFile()) return undefined;
    return readFileSync(real, 'utf8');
  } catch {
    return undefined;
  }
}

function lockHolderGone(lock: string): boolean {
  let pid: number;
  try {
    pid = Number(readFileSync(lock, 'utf8'));
  } catch {
    return false;
  }
  if (!Number.isInteger(pid) || pid <= 0) {
    // written between open and write: give it a moment, unless it has been like this long
    try {
      return Date.now() - statSync(lock).mtimeMs > 10_000;
    } catch {
      return false;
    }
  }
  try {
    process.kill(pid, 0);
    return false;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ESRCH';
  }
}

function envMap(list: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const item of list) {
    const eq = item.indexOf('=');
    if (eq > 0) env[item.slice(0, eq)] = item.slice(eq + 1);
  }
  return env;
}

/**
 * The variables of an Apptainer image that docker2singularity wrote as plain `export K="V"` lines
 * (`/.singularity.d/env/10-docker2singularity.sh`); anything that needs a shell to expand is left.
 */
function singularityEnv(rootfs: string): Record<string, string> {
  const env: Record<string, string> = {};
  const text = safeRead(rootfs, '.singularity.d/env/10-docker2singularity.sh');
  if (text === undefined) return env;
  for (const line of text.split('\n')) {
    const match = /^export ([A-Za-z_][A-Za-z0-9_]*)="([^"$`\\]*)"$/.exec(line.trim());
    if (match !== null) env[match[1]!] = match[2]!;
  }
  return env;
}

/** `User` (`name`, `uid`, `name:group`, `uid:gid`) against the image's passwd and group files. */
function mapUser(rootfs: string, user: string): { uid: number; gid: number } | undefined {
  const [name = '', group] = user.split(':');
  const table = (file: string): string[][] => (safeRead(rootfs, join('etc', file)) ?? '').split('\n').map((line) => line.split(':'));
  const passwd = table('passwd');
  let uid: number | undefined;
  let gid: number | undefined;
  if (/^\d+$/.test(name)) {
    uid = Number(name);
    const row = passwd.find((r) => r[2] === name);
    gid = row?.[3] === undefined ? uid : Number(row[3]);
  } else {
    const row = passwd.find((r) => r[0] === name);
    if (row?.[2] === undefined) return undefined;
    uid = Number(row[2]);
    gid = Number(row[3]);
  }
  if (group !== undefined) {
    if (/^\d+$/.test(group)) gid = Number(group);
    else {
      const row = table('group').find((r) => r[0] === group);
      if (row?.[2] === undefined) return undefined;
      gid = Number(row[2]);
    }
  }
  return Number.isInteger(uid) && Number.isInteger(gid) ? { uid, gid: gid! } : undefined;
}
