import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync, openSync, closeSync, unlinkSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { RolloutError } from '../../errors.ts';
import { parseImageReference } from './reference.ts';
import { sifRootPartition } from './sif.ts';
import type { ImageConfig, ParsedImageReference, ResolvedImage, ResolveImageOptions } from './types.ts';

const run = promisify(execFile);

/*
 * The cache: `<cacheDir>/<digest>[-u<uid>]/` holds `rootfs/` and `image.json` (the digest and the
 * config). An entry is unpacked into `<cacheDir>/.tmp-*` and renamed into place complete, so a
 * half-unpacked image is never used; `<entry>.lock` (O_EXCL, holding the pid) makes processes
 * unpack an image once, and in one process concurrent first uses share one promise.
 * `<cacheDir>/.sources/` remembers the sha256 of image files by path, size, mtime and inode, so a
 * second resolve reads no image file.
 */

export function defaultImageCacheDir(): string {
  const fromEnv = process.env.ROLLSERVE_IMAGE_CACHE;
  return fromEnv !== undefined && fromEnv !== '' ? fromEnv : join(tmpdir(), 'rollserve-images');
}

interface CacheRecord {
  reference: string;
  digest: string;
  config: ImageConfig;
}

/** The bwrap provider's default sandbox user under a root service. */
const DEFAULT_OWNER = { uid: 65534, gid: 65534 };

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
  const owner = process.getuid?.() === 0 ? (options.owner ?? DEFAULT_OWNER) : undefined;
  const stamp = sourceStamp(reference, parsed);
  const memoKey = `${cacheDir}\0${owner?.uid ?? ''}\0${reference}`;
  const memo = remembered.get(memoKey);
  if (memo !== undefined && memo.stamp === stamp && existsSync(join(memo.entry, 'image.json'))) {
    return { reference, digest: memo.record.digest, rootfs: join(memo.entry, 'rootfs'), config: memo.record.config, unpacked: false };
  }
  ensureCacheDir(cacheDir, owner);
  const digest = await imageDigest(reference, parsed, cacheDir, stamp);
  const entry = join(cacheDir, `${digest.replace(':', '-')}${owner === undefined ? '' : `-u${owner.uid}`}`);
  let unpacked = false;
  let record = readRecord(entry);
  if (record === undefined) {
    let pending = inFlight.get(entry);
    if (pending === undefined) {
      const started = unpackOnce(reference, parsed, digest, cacheDir, entry, owner, options.lockTimeoutMs ?? 600_000);
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

function ensureCacheDir(cacheDir: string, owner: { uid: number; gid: number } | undefined): void {
  const key = `${cacheDir}\0${owner?.uid ?? ''}`;
  if (checkedDirs.has(key)) return;
  mkdirSync(cacheDir, { recursive: true, mode: 0o755 });
  const stat = statSync(cacheDir);
  const uid = process.getuid?.();
  if (uid !== undefined && stat.uid !== uid) {
    throw new RolloutError({ code: 'SANDBOX', message: `the image cache ${cacheDir} belongs to uid ${stat.uid}, not to this service (uid ${uid})` });
  }
  // the sandbox's namespace mounts the image root as the sandbox uid: it must reach the cache
  if (owner !== undefined) {
    for (let dir = resolve(cacheDir); ; dir = dirname(dir)) {
      const { mode, uid: dirUid, gid: dirGid } = statSync(dir);
      const bit = dirUid === owner.uid ? 0o100 : dirGid === owner.gid ? 0o010 : 0o001;
      if ((mode & bit) === 0) {
        throw new RolloutError({
          code: 'SANDBOX',
          message: `the image cache ${cacheDir} is not reachable by the sandbox uid ${owner.uid}: ${dir} is not searchable by it (chmod o+x ${dir}, or choose another imageCacheDir)`,
        });
      }
      if (dir === '/') break;
    }
  }
  checkedDirs.add(key);
}

function readRecord(entry: string): CacheRecord | undefined {
  try {
    return JSON.parse(readFileSync(join(entry, 'image.json'), 'utf8')) as CacheRecord;
  } catch {
    return undefined;
  }
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
  mkdirSync(sources, { recursive: true, mode: 0o755 });
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

async function tool(reference: string, argv: string[], what: string): Promise<void> {
  try {
    await run(argv[0]!, argv.slice(1), { maxBuffer: 16 * 1024 * 1024, env: { ...process.env, LC_ALL: 'C' } });
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

async function unpackOnce(
  reference: string,
  parsed: ParsedImageReference,
  digest: string,
  cacheDir: string,
  entry: string,
  owner: { uid: number; gid: number } | undefined,
  lockTimeoutMs: number,
): Promise<{ record: CacheRecord; fresh: boolean }> {
  const lock = `${entry}.lock`;
  const deadline = Date.now() + lockTimeoutMs;
  for (;;) {
    const done = readRecord(entry);
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
    const done = readRecord(entry);
    if (done !== undefined) return { record: done, fresh: false };
    // an entry without its record is not one of ours (entries appear complete, by rename)
    await rm(entry, { recursive: true, force: true });
    mkdirSync(temp, { mode: 0o755 });
    const rootfs = join(temp, 'rootfs');
    let config: ImageConfig;
    if (parsed.kind === 'sif' || parsed.kind === 'squashfs') {
      let offset = 0;
      if (parsed.kind === 'sif') {
        const partition = sifRootPartition(parsed.path);
        if ('error' in partition) throw imageError(reference, `not a usable SIF: ${partition.error}`);
        offset = partition.offset;
      }
      await tool(reference, ['unsquashfs', '-no-progress', '-quiet', '-no-xattrs', '-offset', String(offset), '-dest', rootfs, parsed.path], 'unpack the squashfs');
      config = { env: singularityEnv(rootfs) };
    } else {
      let layout = parsed.path;
      let tag = parsed.kind === 'oci' ? ociManifest(reference, layout, parsed.tag).tag : undefined;
      if (tag === undefined) {
        // archives (and untagged layouts, which umoci cannot name) become a layout of our own
        layout = join(temp, 'layout');
        tag = 'image';
        const source = parsed.kind === 'oci' ? `oci:${parsed.path}` : `${parsed.kind}:${parsed.path}`;
        await tool(reference, ['skopeo', '--insecure-policy', 'copy', '--quiet', source, `oci:${layout}:${tag}`], 'read the image');
      }
      const manifest = ociManifest(reference, layout, tag);
      const raw = ociConfig(reference, layout, manifest.digest);
      await tool(reference, ['umoci', 'raw', 'unpack', '--rootless', '--image', `${layout}:${tag!}`, rootfs], 'unpack the image');
      if (layout !== parsed.path) await rm(layout, { recursive: true, force: true });
      config = { env: envMap(raw.Env ?? []), ...(raw.WorkingDir ? { workdir: raw.WorkingDir } : {}) };
      const user = raw.User ? mapUser(rootfs, raw.User) : undefined;
      if (user !== undefined && user.uid !== 0) config.user = user;
    }
    if (owner !== undefined) await tool(reference, ['chown', '-R', '-P', `${owner.uid}:${owner.gid}`, rootfs], 'hand the image to the sandbox user');
    const record: CacheRecord = { reference, digest, config };
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
  let text: string;
  try {
    text = readFileSync(join(rootfs, '.singularity.d/env/10-docker2singularity.sh'), 'utf8');
  } catch {
    return env;
  }
  for (const line of text.split('\n')) {
    const match = /^export ([A-Za-z_][A-Za-z0-9_]*)="([^"$`\\]*)"$/.exec(line.trim());
    if (match !== null) env[match[1]!] = match[2]!;
  }
  return env;
}

/** `User` (`name`, `uid`, `name:group`, `uid:gid`) against the image's passwd and group files. */
function mapUser(rootfs: string, user: string): { uid: number; gid: number } | undefined {
  const [name = '', group] = user.split(':');
  const table = (file: string): string[][] => {
    try {
      return readFileSync(join(rootfs, 'etc', file), 'utf8').split('\n').map((line) => line.split(':'));
    } catch {
      return [];
    }
  };
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
