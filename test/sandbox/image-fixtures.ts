import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { dirname, join } from 'node:path';

/*
 * Images made from files the test writes: a small root filesystem (the host's dash as /bin/sh,
 * a few coreutils and the libraries `ldd` names), then an OCI image layout of it written by hand
 * (layer tar, config, manifest, index.json, digests from node:crypto), a squashfs of it
 * (mksquashfs) and a SIF around that squashfs.
 */

const TOOLS = ['cat', 'grep', 'stat', 'ls', 'mkdir', 'dirname', 'id', 'env', 'rm', 'touch', 'pwd', 'sleep', 'head', 'true', 'tr', 'wc', 'sha256sum'];

/** A root filesystem in `dir` with /bin/sh and a few tools; `files` are added (path → text). */
export function makeRootfs(dir: string, files: Record<string, string> = {}): void {
  const copy = (from: string, to: string): void => {
    mkdirSync(dirname(join(dir, to)), { recursive: true });
    if (!existsSync(join(dir, to))) copyFileSync(from, join(dir, to));
  };
  const binaries: Array<[string, string]> = [['/bin/dash', '/bin/sh']];
  for (const tool of TOOLS) {
    const found = ['/bin', '/usr/bin'].map((d) => join(d, tool)).find((p) => existsSync(p));
    if (found !== undefined) binaries.push([found, `/bin/${tool}`]);
  }
  for (const [from, to] of binaries) {
    copy(from, to);
    chmodSync(join(dir, to), 0o755);
    const libs = execFileSync('ldd', [from], { encoding: 'utf8' }).match(/\/[^\s)]+/g) ?? [];
    for (const lib of libs) if (lib !== from) copy(lib, lib);
  }
  mkdirSync(join(dir, 'etc'), { recursive: true });
  writeFileSync(join(dir, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nworker:x:1234:2345:worker:/home/worker:/bin/sh\n');
  writeFileSync(join(dir, 'etc/group'), 'root:x:0:\nworkers:x:2345:\n');
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
}

export interface OciConfigInput {
  env?: string[];
  workdir?: string;
  user?: string;
  tag?: string;
  /** Layers over the rootfs's (tar archives, e.g. from makeTar). */
  extraLayers?: Buffer[];
  /** Paths of the rootfs left out of its layer (`./opt/env`: put in an extra layer instead). */
  exclude?: string[];
  /** How every layer is compressed (its media type says so). @default none */
  compression?: 'gzip' | 'zstd';
}

/** An entry of a hand-made tar layer. */
export interface TarEntry {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'hardlink' | 'char' | 'block' | 'fifo';
  /** Permission bits, setuid/setgid/sticky included. @default 0o644 (0o755 for dirs) */
  mode?: number;
  content?: string;
  target?: string;
  major?: number;
  minor?: number;
}

/**
 * A ustar archive of `entries`, written byte by byte: a layer can then hold what the test's user
 * could not create on disk (device nodes, files of other owners), as a hostile image would.
 */
export function makeTar(entries: TarEntry[]): Buffer {
  const TYPES = { file: '0', hardlink: '1', symlink: '2', char: '3', block: '4', dir: '5', fifo: '6' } as const;
  const blocks: Buffer[] = [];
  for (const entry of entries) {
    const header = Buffer.alloc(512);
    const content = Buffer.from(entry.type === 'file' ? (entry.content ?? '') : '');
    const octal = (value: number, width: number, at: number) => header.write(`${value.toString(8).padStart(width - 1, '0')}\0`, at, 'latin1');
    header.write(entry.name, 0, 100, 'utf8');
    octal(entry.mode ?? (entry.type === 'dir' ? 0o755 : 0o644), 8, 100);
    octal(0, 8, 108);
    octal(0, 8, 116);
    octal(content.length, 12, 124);
    octal(1_700_000_000, 12, 136);
    header.write(TYPES[entry.type], 156, 'latin1');
    if (entry.target !== undefined) header.write(entry.target, 157, 100, 'utf8');
    header.write('ustar\0', 257, 'latin1');
    header.write('00', 263, 'latin1');
    octal(entry.major ?? 0, 8, 329);
    octal(entry.minor ?? 0, 8, 337);
    header.fill(' ', 148, 156);
    let sum = 0;
    for (const byte of header) sum += byte;
    header.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
    blocks.push(header, content, Buffer.alloc((512 - (content.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

/**
 * What a hostile image carries, as tar entries over a makeRootfs root: device nodes of the host's
 * first disk and of /dev/mem's class, a fifo, a setuid-root and a setgid binary, a world-writable
 * directory and file.
 */
export const HOSTILE_ENTRIES: TarEntry[] = [
  { name: 'hostile/', type: 'dir' },
  { name: 'hostile/disk', type: 'block', mode: 0o666, major: 8, minor: 0 },
  { name: 'hostile/vda', type: 'block', mode: 0o666, major: 254, minor: 0 },
  { name: 'hostile/mem', type: 'char', mode: 0o666, major: 1, minor: 1 },
  { name: 'hostile/null', type: 'char', mode: 0o666, major: 1, minor: 3 },
  { name: 'hostile/pipe', type: 'fifo', mode: 0o666 },
  { name: 'hostile/suid', type: 'file', mode: 0o4755, content: '#!/bin/sh\necho suid\n' },
  { name: 'hostile/sgid', type: 'file', mode: 0o2755, content: '#!/bin/sh\necho sgid\n' },
  { name: 'hostile/shared/', type: 'dir', mode: 0o777 },
  { name: 'hostile/shared/open-file', type: 'file', mode: 0o666, content: 'anyone may write\n' },
  { name: 'hostile/sticky/', type: 'dir', mode: 0o1777 },
];

function sha256(data: Buffer | string): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Writes an OCI image layout of `rootfs` (one uncompressed layer) to `layout`; returns the manifest digest. */
export function makeOciLayout(rootfs: string, layout: string, config: OciConfigInput = {}): string {
  mkdirSync(join(layout, 'blobs/sha256'), { recursive: true });
  const blob = (data: Buffer | string): { digest: string; size: number } => {
    const hex = sha256(data);
    writeFileSync(join(layout, 'blobs/sha256', hex), data);
    return { digest: `sha256:${hex}`, size: Buffer.byteLength(data) };
  };
  const exclude = (config.exclude ?? []).map((path) => `--exclude=${path}`);
  const layer = execFileSync('tar', ['-C', rootfs, '--numeric-owner', '--sort=name', ...exclude, '-cf', '-', '.'], { maxBuffer: 512 * 1024 * 1024 });
  const compress = (tar: Buffer): Buffer => (config.compression === undefined ? tar : execFileSync(config.compression, ['-c', '-q'], { input: tar, maxBuffer: 512 * 1024 * 1024 }));
  const layers = [layer, ...(config.extraLayers ?? [])];
  const layerBlobs = layers.map((tar) => blob(compress(tar)));
  const layerBlob = layerBlobs[0]!;
  const configBlob = blob(
    JSON.stringify({
      architecture: 'amd64',
      os: 'linux',
      config: {
        ...(config.env === undefined ? {} : { Env: config.env }),
        ...(config.workdir === undefined ? {} : { WorkingDir: config.workdir }),
        ...(config.user === undefined ? {} : { User: config.user }),
      },
      rootfs: { type: 'layers', diff_ids: layers.map((tar) => `sha256:${sha256(tar)}`) },
    }),
  );
  const manifest = blob(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...configBlob },
      layers: layerBlobs.map((b) => ({ mediaType: `application/vnd.oci.image.layer.v1.tar${config.compression === undefined ? '' : `+${config.compression}`}`, ...b })),
    }),
  );
  writeFileSync(join(layout, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  writeFileSync(
    join(layout, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: 'application/vnd.oci.image.manifest.v1+json',
          ...manifest,
          annotations: { 'org.opencontainers.image.ref.name': config.tag ?? 'latest' },
        },
      ],
    }),
  );
  return manifest.digest;
}

/** mksquashfs pseudo definitions of HOSTILE_ENTRIES: no device node is made on the host. */
export function hostilePseudoArgs(): string[] {
  const kinds = { dir: 'd', file: 'f', char: 'c', block: 'b', fifo: 'i', symlink: 's', hardlink: 'l' } as const;
  const pseudo: string[] = [];
  for (const entry of HOSTILE_ENTRIES) {
    const name = entry.name.replace(/\/$/, '');
    const mode = (entry.mode ?? (entry.type === 'dir' ? 0o755 : 0o644)).toString(8);
    const rest =
      entry.type === 'char' || entry.type === 'block' ? ` ${entry.major} ${entry.minor}` : entry.type === 'file' ? ` printf '%b' ${JSON.stringify(entry.content ?? '')}` : entry.type === 'fifo' ? ' f' : '';
    pseudo.push('-p', `${name} ${kinds[entry.type]} ${mode} 0 0${rest}`);
  }
  pseudo.push('-p', 'hostile/socket i 666 0 0 s');
  return pseudo;
}

/** A squashfs of `rootfs` at `file`; `hostile` adds HOSTILE_ENTRIES (and a socket). */
export function makeSquashfs(rootfs: string, file: string, options: { hostile?: boolean } = {}): void {
  const pseudo = options.hostile === true ? hostilePseudoArgs() : [];
  execFileSync('mksquashfs', [rootfs, file, '-noappend', '-quiet', '-no-progress', '-all-root', ...pseudo], { stdio: 'ignore' });
}

/**
 * Squashfs images `<dir>/<name>.sqfs`, one per name: a root filesystem whose /data/marker names its
 * image and whose /data/payload (~512 KB, different in each) gives every image its own digest.
 */
export function makeMarkedSquashfsImages(dir: string, names: readonly string[]): Record<string, string> {
  const images: Record<string, string> = {};
  for (const name of names) {
    const rootfs = join(dir, `rootfs-${name}`);
    makeRootfs(rootfs, { 'data/marker': `image ${name}\n` });
    writeFileSync(join(rootfs, 'data/payload'), createHash('sha512').update(name).digest().toString('hex').repeat(4096));
    images[name] = join(dir, `${name}.sqfs`);
    makeSquashfs(rootfs, images[name]);
    rmSync(rootfs, { recursive: true, force: true });
  }
  return images;
}

/**
 * A SIF holding `squashfs` as its primary system partition (github.com/apptainer/sif layout: a
 * 128-byte header, packed 585-byte descriptors, the data).
 */
export function makeSif(squashfs: string, file: string): void {
  const data = readFileSync(squashfs);
  const descriptorsOffset = 4096;
  const dataOffset = 32768;
  const header = Buffer.alloc(128);
  header.write('#!/usr/bin/env run-singularity\n', 0, 'latin1');
  header.write('SIF_MAGIC\0', 32, 'latin1');
  header.write('01\0', 42, 'latin1');
  header.write('02\0', 45, 'latin1');
  header.writeBigInt64LE(47n, 80); // free descriptors
  header.writeBigInt64LE(48n, 88); // total descriptors
  header.writeBigInt64LE(BigInt(descriptorsOffset), 96);
  header.writeBigInt64LE(48n * 585n, 104);
  header.writeBigInt64LE(BigInt(dataOffset), 112);
  header.writeBigInt64LE(BigInt(data.length), 120);
  const table = Buffer.alloc(48 * 585);
  table.writeInt32LE(0x4004, 0); // partition
  table[4] = 1; // used
  table.writeUInt32LE(1, 5);
  table.writeBigInt64LE(BigInt(dataOffset), 17);
  table.writeBigInt64LE(BigInt(data.length), 25);
  table.writeBigInt64LE(BigInt(data.length), 33);
  table.write('rootfs', 73, 'latin1');
  table.writeInt32LE(1, 201); // squashfs
  table.writeInt32LE(2, 205); // primary system partition
  table.write('02\0', 209, 'latin1');
  const out = Buffer.alloc(dataOffset + data.length);
  header.copy(out, 0);
  table.copy(out, descriptorsOffset);
  data.copy(out, dataOffset);
  writeFileSync(file, out);
}
