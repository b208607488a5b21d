import { readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { imageError, safeRead, tool } from '../tools.ts';
import type { ImageConfig } from '../types.ts';
import type { ImageKindHandler, UnpackJob } from './kind.ts';
import { removeTree, unpackLayers } from './oci-layers.ts';

// `oci:<dir>[:tag]`, an OCI image layout: keyed by its manifest's digest, unpacked with umoci
// (an untagged one, which umoci cannot name, through a layout of our own).

interface Descriptor {
  mediaType?: string;
  digest: string;
  annotations?: Record<string, string>;
  platform?: { architecture?: string; os?: string };
}

interface RawConfig {
  Env?: string[];
  WorkingDir?: string;
  User?: string;
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
export function ociManifest(reference: string, layout: string, tag: string | undefined): { digest: string; tag: string | undefined } {
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

/** The image config and layers of the manifest a descriptor names (following an index to this platform). */
function ociImage(reference: string, layout: string, manifestDigest: string): { config: RawConfig; layers: Descriptor[] } {
  let manifest = readBlob(reference, layout, manifestDigest) as { mediaType?: string; manifests?: Descriptor[]; config?: Descriptor; layers?: Descriptor[] };
  if (Array.isArray(manifest.manifests) || (manifest.mediaType !== undefined && INDEX_TYPES.has(manifest.mediaType))) {
    const arch = GO_ARCH[process.arch] ?? process.arch;
    const entry = manifest.manifests?.find((m) => m.platform?.os === 'linux' && m.platform.architecture === arch);
    if (entry === undefined) throw imageError(reference, `no linux/${arch} image in the index`);
    manifest = readBlob(reference, layout, entry.digest) as typeof manifest;
  }
  if (manifest.config?.digest === undefined) throw imageError(reference, 'the manifest has no config');
  const config = readBlob(reference, layout, manifest.config.digest) as { config?: RawConfig };
  const layers = Array.isArray(manifest.layers) ? manifest.layers : [];
  if (layers.some((layer) => typeof layer?.digest !== 'string')) throw imageError(reference, 'the manifest names a layer without a digest');
  return { config: config.config ?? {}, layers };
}

/** Copies an image skopeo reads (`oci:<dir>`, `docker-archive:<file>`) into a layout of our own in the staging directory, as tag `image`. */
export async function copyToLayout(job: UnpackJob, source: string): Promise<{ layout: string; tag: string }> {
  const layout = join(job.staging, 'layout');
  await tool(job.reference, ['skopeo', '--insecure-policy', 'copy', '--quiet', source, `oci:${layout}:image`], 'read the image', job.unpackAs);
  return { layout, tag: 'image' };
}

/**
 * Unpacks a tagged image of a layout (a layout of our own is removed after): its layers by tar,
 * stacked here (oci-layers.ts), else by umoci.
 */
export async function unpackLayout(job: UnpackJob, layout: string, tag: string): Promise<(rootfs: string) => ImageConfig> {
  const manifest = ociManifest(job.reference, layout, tag);
  const { config: raw, layers } = ociImage(job.reference, layout, manifest.digest);
  const outcome = await unpackLayers(job, layout, layers);
  job.report?.('unpackedWith' in outcome ? outcome.unpackedWith : `umoci (${outcome.fallback})`);
  if ('fallback' in outcome) {
    await removeTree(job.rootfs);
    await tool(job.reference, ['umoci', 'raw', 'unpack', '--rootless', '--image', `${layout}:${tag}`, job.rootfs], 'unpack the image', job.unpackAs, job.signal);
  }
  if (layout !== job.parsed.path) await rm(layout, { recursive: true, force: true });
  return (rootfs) => {
    const config: ImageConfig = { env: envMap(raw.Env ?? []), ...(raw.WorkingDir ? { workdir: raw.WorkingDir } : {}) };
    const user = raw.User ? mapUser(rootfs, raw.User) : undefined;
    if (user !== undefined && user.uid !== 0) config.user = user;
    return config;
  };
}

export const oci: ImageKindHandler = {
  source: (parsed) => ({ path: join(parsed.path, 'index.json'), missing: `no OCI image layout at ${parsed.path} (no index.json)` }),
  digest: (reference, parsed) => ociManifest(reference, parsed.path, parsed.tag).digest,
  async unpack(job) {
    const tag = ociManifest(job.reference, job.parsed.path, job.parsed.tag).tag;
    const { layout, tag: named } = tag === undefined ? await copyToLayout(job, `oci:${job.parsed.path}`) : { layout: job.parsed.path, tag };
    return unpackLayout(job, layout, named);
  },
};

function envMap(list: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const item of list) {
    const eq = item.indexOf('=');
    if (eq > 0) env[item.slice(0, eq)] = item.slice(eq + 1);
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
