import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defineEnvironment } from '@rollserve/core';
import { bwrapAvailable, createBwrapProvider, createImageResolver } from '@rollserve/core/sandbox';
import { missingCommands, startFakePolicy, startTestRolloutService } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { makeMarkedSquashfsImages } from './image-fixtures.ts';

// Images readied ahead of the rollouts that need them: while a rollout holds the one INIT slot,
// the ones queued behind it have their images unpacked into the cache (the runner's prefetch,
// provider.prefetch), so that their INIT starts on a cached image; under a small cap, a prefetch
// never evicts the image a running sandbox is on. Images are squashfs files built here.

const tools = missingCommands(['unsquashfs', 'mksquashfs', 'du']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : tools.length > 0 ? `missing ${tools.join(', ')}` : undefined;

/** Held by the rollout on image `a` in seedSession until the test lets it go. */
let releaseA: () => void = () => undefined;
let gateA = Promise.resolve();
/** The rollouts that reached seedSession (their INIT began), in order, with the cache entries there then. */
const seeded: Array<{ image: string; entries: string[] }> = [];
let cacheOf: () => string[] = () => [];

const imageEnv = defineEnvironment({
  name: 'image-prefetch',
  domain: 'other',
  description: 'A sandbox on the row image; seedSession of image a waits for the test',
  row: z.looseObject({ image: z.string() }),
  sandbox: { spec: (row: { image: string }) => ({ image: row.image }) },
  async seedSession(row: { image: string }, ctx) {
    await ctx.tools.sandbox();
    seeded.push({ image: row.image, entries: cacheOf() });
    if (row.image.endsWith('/a.sqfs')) await gateA;
    return {};
  },
  verify: () => ({ reward: 1 }),
});

describe.skipIf(skip !== undefined)('images prefetched for rollouts waiting for INIT', () => {
  let dir: string;
  let sandboxDir: string;
  const images: Record<string, string> = {};
  const entryOf = (name: string): string => `sha256-${createHash('sha256').update(readFileSync(images[name]!)).digest('hex')}`;
  let entryBytes: number;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rs-images-prefetch-test-'));
    chmodSync(dir, 0o755);
    sandboxDir = join(dir, 'sandboxes');
    mkdirSync(sandboxDir, { mode: 0o755 });
    Object.assign(images, makeMarkedSquashfsImages(dir, ['a', 'b', 'd']));
    const scratch = join(dir, 'scratch-cache');
    const resolver = createImageResolver();
    await resolver.resolve(`squashfs:${images.a}`, { cacheDir: scratch });
    await resolver.close();
    entryBytes = (JSON.parse(readFileSync(join(scratch, entryOf('a'), 'image.json'), 'utf8')) as { bytes: number }).bytes;
  }, 120_000);

  afterAll(() => {
    const left = dir === undefined ? [] : readdirSync(sandboxDir);
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
    expect(left).toEqual([]);
  });

  const entries = (cache: string): string[] => (existsSync(cache) ? readdirSync(cache).filter((name) => name.startsWith('sha256-')).sort() : []);
  const uses = (cache: string, entry: string): string[] => (existsSync(join(cache, '.uses', entry)) ? readdirSync(join(cache, '.uses', entry)) : []);

  /**
   * The rollout on `a` is submitted first and holds the one INIT slot (its sandbox up on a,
   * seedSession waiting); the rest are submitted then and wait for INIT while `whileAHolds` looks.
   * `cached`: images put in the cache (unheld) first, in this order (the oldest first).
   */
  async function run(cache: string, providerOptions: { imageCacheMaxBytes?: number }, names: string[], whileAHolds: () => Promise<void>, cached: string[] = []): Promise<void> {
    seeded.length = 0;
    cacheOf = () => entries(cache);
    gateA = new Promise<void>((resolve) => (releaseA = resolve));
    const provider = createBwrapProvider({ imageCacheDir: cache, tmpDir: sandboxDir, ...providerOptions });
    const fake = await startFakePolicy({ script: () => 'done' });
    for (const name of cached) await provider.prefetch!({ image: `squashfs:${images[name]}` });
    const { service, close } = await startTestRolloutService({ environments: [imageEnv], backends: [fake.url], sandboxProvider: provider, pools: { init: 1, run: 4, eval: 4 } });
    try {
      const tasks = names.map((name, i) => ({ id: `${name}-${i}`, env: 'image-prefetch', row: { image: `squashfs:${images[name]}`, responses_create_params: { input: [{ role: 'user', content: 'go' }] } }, policy: { model: 'fake-policy' } }));
      await service.submit(tasks.slice(0, 1));
      await until(() => seeded.length === 1);
      expect(seeded[0]!.image).toBe(`squashfs:${images.a}`);
      await service.submit(tasks.slice(1));
      await whileAHolds();
      expect(seeded).toHaveLength(1); // nobody else began INIT meanwhile
      releaseA();
      const results = await Promise.all(tasks.map((t) => service.wait(t.id)));
      for (const result of results) expect(result.error?.message ?? null).toBeNull();
      expect(results.map((r) => r.reward)).toEqual(names.map(() => 1));
    } finally {
      releaseA();
      await close();
      await fake.close();
      await provider.close?.();
    }
  }

  it("a queued rollout's image is unpacked while another holds INIT, before its own INIT begins", async () => {
    const cache = join(dir, 'cache-ahead');
    await run(cache, {}, ['a', 'b'], async () => {
      // readied, and then held by nobody (its unpack's own hold ends when the unpack is done)
      await until(() => entries(cache).includes(entryOf('b')) && uses(cache, entryOf('b')).length === 0);
    });
    // b's INIT found its image in the cache already
    expect(seeded.map((s) => s.image)).toEqual([`squashfs:${images.a}`, `squashfs:${images.b}`]);
    expect(seeded[1]!.entries).toContain(entryOf('b'));
  }, 120_000);

  it("under a cap, a prefetch's eviction passes over the image a sandbox runs on (the least recently used) and takes an idle one", async () => {
    const cache = join(dir, 'cache-cap');
    // a, then d, cached (a the least recently used); room for two and a half: b's prefetch must evict one
    await run(cache, { imageCacheMaxBytes: Math.floor(entryBytes * 2.5) }, ['a', 'b'], async () => {
      await until(() => entries(cache).includes(entryOf('b')) && !entries(cache).includes(entryOf('d')));
      expect(entries(cache)).toEqual([entryOf('a'), entryOf('b')].sort());
      expect(uses(cache, entryOf('a')).length).toBeGreaterThan(0); // the running sandbox's
    }, ['a', 'd']);
    expect(seeded.map((s) => s.image)).toEqual(['a', 'b'].map((name) => `squashfs:${images[name]}`));
  }, 120_000);
});

async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 20));
}
