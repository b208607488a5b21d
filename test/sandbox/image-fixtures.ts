import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync, chmodSync } from 'node:fs';
import { dirname, join } from 'node:path';

/*
 * Images made from files the test writes: a small root filesystem (the host's dash as /bin/sh,
 * a few coreutils and the libraries `ldd` names), then an OCI image layout of it written by hand
 * (layer tar, config, manifest, index.json, digests from node:crypto), a squashfs of it
 * (mksquashfs) and a SIF around that squashfs.
 */

const TOOLS = ['cat', 'ls', 'mkdir', 'dirname', 'id', 'env', 'rm', 'touch', 'pwd', 'sleep', 'head', 'true', 'tr', 'wc', 'sha256sum'];

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
}

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
  const layer = execFileSync('tar', ['-C', rootfs, '--numeric-owner', '--sort=name', '-cf', '-', '.'], { maxBuffer: 512 * 1024 * 1024 });
  const layerBlob = blob(layer);
  const configBlob = blob(
    JSON.stringify({
      architecture: 'amd64',
      os: 'linux',
      config: {
        ...(config.env === undefined ? {} : { Env: config.env }),
        ...(config.workdir === undefined ? {} : { WorkingDir: config.workdir }),
        ...(config.user === undefined ? {} : { User: config.user }),
      },
      rootfs: { type: 'layers', diff_ids: [layerBlob.digest] },
    }),
  );
  const manifest = blob(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...configBlob },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', ...layerBlob }],
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

/** A squashfs of `rootfs` at `file`. */
export function makeSquashfs(rootfs: string, file: string): void {
  execFileSync('mksquashfs', [rootfs, file, '-noappend', '-quiet', '-no-progress', '-all-root'], { stdio: 'ignore' });
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
