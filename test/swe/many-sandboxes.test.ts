import { chmodSync, mkdirSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import swe from '@rollserve/env-swe';
import { bwrapAvailable, createBwrapProvider, registerSandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse, missingCommands } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildSweFixtures, type SweFixture } from './fixtures.ts';
import { buildSweImageSet, type SweImageSet } from './image-fixtures.ts';

// 64 SWE sandboxes at once on one host over 8 images (squashfs, built here from one root with a
// file of its own each): 64 seed_sessions at once through the NeMo Gym face (each image unpacked
// once, at most ROLLSERVE_IMAGE_UNPACKS at a time, every seed on its own overlay), the gold fix in
// each, then 64 verifies at once (each in a fresh eval sandbox): 64 rewards of 1, nothing left.

const missing = missingCommands(['mksquashfs', 'unsquashfs', 'ldd', 'git', 'patch']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : missing.length > 0 ? `missing ${missing.join(', ')}` : undefined;

const SANDBOXES = 64;
const IMAGES = 8;
const PROVIDER = 'swe-many-sandboxes';
let dirs: { imageCacheDir: string; tmpDir: string } | undefined;
registerSandboxProvider(PROVIDER, () => createBwrapProvider({ ...dirs }));

describe.skipIf(skip !== undefined)(`${SANDBOXES} SWE sandboxes at once over ${IMAGES} images (bwrap)`, () => {
  let built: ReturnType<typeof buildSweFixtures>;
  let calc: SweFixture;
  let set: SweImageSet;

  beforeAll(() => {
    built = buildSweFixtures();
    calc = built.fixtures[0]!;
    set = buildSweImageSet(calc, IMAGES);
    dirs = { imageCacheDir: join(set.dir, 'cache'), tmpDir: join(set.dir, 'sandboxes') };
    mkdirSync(dirs.tmpDir);
    chmodSync(dirs.tmpDir, 0o755);
  }, 300_000);

  afterAll(() => {
    const left = dirs === undefined ? [] : readdirSync(dirs.tmpDir);
    set?.close();
    built?.close();
    dirs = undefined;
    expect(left).toEqual([]);
  });

  it('64 seeds at once, each image unpacked once; the gold fix in each; 64 verifies at once: all 1', async () => {
    const app = createResourcesServer(swe, { config: { sandbox_provider: PROVIDER, images_root: set.dir } });
    const running = await serveFetch(app);
    try {
      const { repo_path: _host, ...base } = calc.row;
      const rows = Array.from({ length: SANDBOXES }, (_, i) => ({ ...base, repo: 'pytest-dev/pytest', version: '8.0', image: `squashfs:${set.files[i % IMAGES]}` }));
      const seeds = await Promise.all(rows.map((row) => call(running.url, 'POST', '/seed_session', row)));
      for (const seed of seeds) expect(seed.status, seed.text).toBe(200);
      // every sandbox is up at once, and each image is one cache entry
      expect(readdirSync(dirs!.tmpDir)).toHaveLength(SANDBOXES);
      expect(readdirSync(dirs!.imageCacheDir).filter((name) => /^sha256-[0-9a-f]+$/.test(name))).toHaveLength(IMAGES);
      const cookies = seeds.map((seed) => cookieHeader(seed.setCookies));
      const edits = await Promise.all(
        cookies.map((cookie) => call(running.url, 'POST', '/str_replace_editor', { command: 'str_replace', path: `/testbed/${calc.goldEdit.path}`, old_str: calc.goldEdit.old_str, new_str: calc.goldEdit.new_str }, { cookie })),
      );
      for (const edit of edits) expect(edit.text).toContain('has been edited');
      const verifies = await Promise.all(rows.map((row, i) => call(running.url, 'POST', '/verify', { ...row, response: makeResponse([]) }, { cookie: cookies[i]! })));
      for (const verify of verifies) expect(verify.status, verify.text).toBe(200);
      expect(verifies.map((v) => (v.json as { reward: number }).reward)).toEqual(rows.map(() => 1));
    } finally {
      await running.close();
      await app.close();
    }
  }, 900_000);
});
