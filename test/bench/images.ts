import { execFileSync } from 'node:child_process';
import { chmodSync, cpSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBwrapProvider, resolveImage, type Sandbox } from '@rollserve/core/sandbox';
import { makeOciLayout, makeRootfs, makeSquashfs } from '../sandbox/image-fixtures.ts';
import { heading, latencyLine, percentile } from './stats.ts';

// Images on bwrap: first-use unpack of an OCI layout and a squashfs (a small root plus the host's
// Python standard library, for size), sandbox create on a cached image beside plain bwrap create
// in the same run (interleaved), and 64 image sandboxes at once (start, one command, stop).
//   pnpm bench images

const ROUNDS = 4;
const PER_ROUND = 50;

export default async function bench(): Promise<void> {
  heading('images: unpack on first use, start on a cached image, 64 at once');
  const dir = mkdtempSync(join(tmpdir(), 'rs-bench-images-'));
  chmodSync(dir, 0o755);
  const providers: Array<{ close?(): Promise<void> }> = [];
  try {
    const rootfs = join(dir, 'rootfs');
    makeRootfs(rootfs, { 'data/marker': 'image\n' });
    cpSync('/usr/lib/python3.11', join(rootfs, 'usr/lib/python3.11'), { recursive: true, verbatimSymlinks: true });
    const size = execFileSync('du', ['-sh', rootfs], { encoding: 'utf8' }).split('\t')[0];
    const files = execFileSync('sh', ['-c', `find ${rootfs} | wc -l`], { encoding: 'utf8' }).trim();
    makeOciLayout(rootfs, join(dir, 'layout'), { tag: 'v1', env: ['PATH=/bin'], workdir: '/work' });
    makeSquashfs(rootfs, join(dir, 'root.sqfs'));
    console.log(`image: ${size}, ${files} files`);

    for (const [label, image] of [['OCI layout (umoci)', `oci:${dir}/layout:v1`], ['squashfs (unsquashfs)', `squashfs:${dir}/root.sqfs`]] as const) {
      const cacheDir = join(dir, `cache-${label.split(' ')[0]}`);
      let started = performance.now();
      const first = await resolveImage(image, { cacheDir });
      const unpackMs = performance.now() - started;
      started = performance.now();
      const again = await resolveImage(image, { cacheDir });
      const againMs = performance.now() - started;
      if (!first.unpacked || again.unpacked) throw new Error('expected one unpack');
      console.log(`first use, ${label.padEnd(22)} unpack ${unpackMs.toFixed(0)} ms; second resolve ${againMs.toFixed(2)} ms`);
    }
    // what a per-sandbox copy of the root would cost instead of an overlay layer
    let started = performance.now();
    cpSync(rootfs, join(dir, 'copy'), { recursive: true, verbatimSymlinks: true });
    console.log(`for comparison, one copy of the root (per-sandbox copy instead of overlay): ${(performance.now() - started).toFixed(0)} ms`);
    rmSync(join(dir, 'copy'), { recursive: true, force: true });

    const imageCacheDir = join(dir, 'cache-OCI');
    const provider = createBwrapProvider({ imageCacheDir });
    providers.push(provider);
    const image = `oci:${dir}/layout:v1`;
    const plain: number[] = [];
    const onImage: number[] = [];
    const lifecycle = async (spec: { image?: string }, into: number[], warmup: boolean): Promise<void> => {
      const t = performance.now();
      const sandbox = await provider.create(spec);
      const elapsed = performance.now() - t;
      const result = await sandbox.exec('cat /data/marker 2>/dev/null || echo host');
      await sandbox.close();
      if (result.returnCode !== 0) throw new Error(`exec: ${JSON.stringify(result)}`);
      if (!warmup) into.push(elapsed);
    };
    for (let i = 0; i < 10; i++) {
      await lifecycle({}, plain, true);
      await lifecycle({ image }, onImage, true);
    }
    for (let round = 0; round < ROUNDS; round++) {
      for (let i = 0; i < PER_ROUND; i++) await lifecycle({}, plain, false);
      for (let i = 0; i < PER_ROUND; i++) await lifecycle({ image }, onImage, false);
    }
    console.log(`create, plain bwrap (host root)       ${latencyLine(plain)}`);
    console.log(`create, cached image (overlay layer)  ${latencyLine(onImage)}  (target p50 <= 20 ms)`);

    for (const [label, spec] of [['plain bwrap', {}], ['image', { image }]] as const) {
      started = performance.now();
      const startTimes: number[] = [];
      const results = await Promise.allSettled(
        Array.from({ length: 64 }, async () => {
          const t = performance.now();
          const sandbox: Sandbox = await provider.create(spec);
          startTimes.push(performance.now() - t);
          try {
            const result = await sandbox.exec('echo $$ > /tmp/pid && cat /tmp/pid');
            if (result.returnCode !== 0) throw new Error(result.stderr);
          } finally {
            await sandbox.close();
          }
        }),
      );
      const failed = results.filter((r) => r.status === 'rejected');
      console.log(
        `64 concurrent ${label.padEnd(11)} sandboxes: ${64 - failed.length}/64 ran, wall ${(performance.now() - started).toFixed(0)} ms, ` +
          `create p50 ${percentile(startTimes, 50).toFixed(0)} ms max ${percentile(startTimes, 100).toFixed(0)} ms`,
      );
      for (const failure of failed.slice(0, 3)) console.log(`  failed: ${(failure as PromiseRejectedResult).reason}`);
    }
  } finally {
    for (const provider of providers) await provider.close?.();
    rmSync(dir, { recursive: true, force: true });
  }
}
