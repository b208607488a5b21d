import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import swe from '@rollserve/env-swe';
import { createBwrapProvider, registerSandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse } from '@rollserve/testing';
import { buildSweFixtures, type SweFixture } from '../swe/fixtures.ts';
import { buildSweImages, buildSweImageSet, sweImageName } from '../swe/image-fixtures.ts';
import { heading, latencyLine, percentile } from './stats.ts';

// `pnpm bench swe`: the SWE environment on bwrap over its NeMo Gym face, on the three fixture
// repositories: seed and verify time per instance (the gold fix made through str_replace_editor),
// then 32 SWE sandboxes at once (32 seeds, 32 edits, 32 verifies, each verify starting its own
// fresh eval sandbox). Then a ~200 MB SWE-bench-like image (image-fixtures.ts, padded: /testbed a
// clone with history plus 3,000 files, a conda env of 12,000 more): the first seed on an empty cache
// (unpack, seal, sandbox, repository reset) beside `umoci unpack` / `unsquashfs` of the same image
// in the same run (the OCI image also in layers as SWE-bench's: base, env, instance), and the seed on the cached image (sandbox start and repository reset: removing
// /testbed/.git, a fresh one-commit repository of the tree).

const REPEATS = 5;
const CONCURRENT = 32;

interface Timed {
  seedMs: number;
  editMs: number;
  verifyMs: number;
  reward: number;
  evalStartS: number;
  patchVerifyS: number;
}

export default async function bench(): Promise<void> {
  await fixtureBench();
  await imageBench();
  await manyImagesBench();
}

const IMAGE_FIRST_USES = 3;
const IMAGE_CACHED_SEEDS = 10;

let imageCacheDir: string | undefined;
let imageTmpDir: string | undefined;
registerSandboxProvider('swe-bench-image', () => createBwrapProvider({ ...(imageCacheDir === undefined ? {} : { imageCacheDir }), ...(imageTmpDir === undefined ? {} : { tmpDir: imageTmpDir }) }));

/**
 * The image part alone (`tsx --conditions=@rollserve/source -e "import('./test/bench/swe.ts').then((m) => m.imageBench())"`;
 * `imageBench(['squashfs'])` for one kind).
 */
export async function imageBench(only?: string[]): Promise<void> {
  const built = buildSweFixtures();
  const calc = built.fixtures[0]!;
  const images = buildSweImages(calc, { padding: { repoFiles: 3000, envFiles: 12_000, fileBytes: 12_000 }, layered: only === undefined || only.some((name) => 'oci'.startsWith(name.toLowerCase())) });
  const scratch = join(images.dir, 'scratch');
  imageTmpDir = join(images.dir, 'sandboxes');
  mkdirSync(imageTmpDir, { mode: 0o755 });
  chmodSync(imageTmpDir, 0o755);
  const tag = sweImageName(String(calc.row.instance_id));
  const { repo_path: _host, ...imageRow } = calc.row;
  // under a root service the unpack tools run as the sandbox uid (65534): the tool alone so too
  const asService = (name: string, argv: (out: string) => string[]): Array<{ name: string; run: (out: string) => void }> => {
    if (process.getuid?.() !== 0) return [];
    return [
      {
        name: `${name} (uid 65534)`,
        run: (out: string) => {
          mkdirSync(out, { mode: 0o700 });
          chownSync(out, 65534, 65534);
          const [command, ...args] = argv(join(out, 'rootfs'));
          execFileSync(command!, args, { stdio: 'ignore', uid: 65534, gid: 65534, cwd: '/' });
        },
      },
    ];
  };
  const timeMs = (run: () => void): number => {
    const t = performance.now();
    run();
    return performance.now() - t;
  };
  try {
    heading(`swe: a ${(images.rootfs.bytes / 1e6).toFixed(0)} MB image (${images.rootfs.files} files): first-use seed vs the unpack tool, cached seed (bwrap)`);
    for (const kind of [
      { name: 'OCI layout', image: `oci:${images.ociLayout}:${tag}`, tools: [
        { name: 'umoci unpack --rootless', run: (out: string) => execFileSync('umoci', ['unpack', '--rootless', '--image', `${images.ociLayout}:${tag}`, out], { stdio: 'ignore' }) },
        { name: 'umoci raw unpack --rootless', run: (out: string) => execFileSync('umoci', ['raw', 'unpack', '--rootless', '--image', `${images.ociLayout}:${tag}`, out], { stdio: 'ignore' }) },
        ...asService('umoci raw unpack --rootless', (out) => ['umoci', 'raw', 'unpack', '--rootless', '--image', `${images.ociLayout}:${tag}`, out]),
      ] },
      ...(images.ociLayered === undefined
        ? []
        : [
            // as SWE-bench builds its images: base (the system), env (the conda env), instance (/testbed), and the hostile layer
            { name: 'OCI layout, 4 layers', image: `oci:${images.ociLayered}:${tag}`, tools: [
              { name: 'umoci raw unpack --rootless', run: (out: string) => execFileSync('umoci', ['raw', 'unpack', '--rootless', '--image', `${images.ociLayered}:${tag}`, out], { stdio: 'ignore' }) },
              ...asService('umoci raw unpack --rootless', (out) => ['umoci', 'raw', 'unpack', '--rootless', '--image', `${images.ociLayered}:${tag}`, out]),
            ] },
          ]),
      { name: 'squashfs', image: `squashfs:${images.squashfs}`, tools: [
        { name: 'unsquashfs', run: (out: string) => execFileSync('unsquashfs', ['-no-progress', '-d', out, images.squashfs], { stdio: 'ignore' }) },
        // (as uid 65534 it cannot make the image's device nodes: exit status 2, the rest unpacked)
        ...asService('unsquashfs', (out) => ['sh', '-c', 'unsquashfs -no-progress -d "$1" "$2" >/dev/null 2>&1; [ $? -le 2 ]', 'unsquashfs', out, images.squashfs]),
      ] },
    ]) {
      if (only !== undefined && !only.some((name) => kind.name.toLowerCase().startsWith(name.toLowerCase()))) continue;
      const row = { ...imageRow, image: kind.image };
      const toolMs = new Map<string, number[]>(kind.tools.map((t) => [t.name, []]));
      const firstMs: number[] = [];
      const cachedMs: number[] = [];
      const cachedSeedS: number[] = [];
      const unpackedWith = new Set<string>();
      for (let i = 0; i < IMAGE_FIRST_USES; i++) {
        for (const tool of kind.tools) {
          rmSync(scratch, { recursive: true, force: true });
          toolMs.get(tool.name)!.push(timeMs(() => tool.run(scratch)));
          rmSync(scratch, { recursive: true, force: true });
        }
        // a new cache (and a server whose provider uses it): the first seed unpacks
        imageCacheDir = join(images.dir, `cache-${kind.name.replace(/\W/g, '')}-${i}`);
        const app = createResourcesServer(swe, { config: { sandbox_provider: 'swe-bench-image', images_root: images.dir } });
        const server = await serveFetch(app);
        try {
          const seedOnce = async (): Promise<{ ms: number; seedS: number }> => {
            const t = performance.now();
            const seeded = await call(server.url, 'POST', '/seed_session', row);
            const ms = performance.now() - t;
            if (seeded.status !== 200) throw new Error(`seed failed: ${seeded.text}`);
            // an empty patch: the session ends without an eval sandbox
            const verified = await call(server.url, 'POST', '/verify', { ...row, response: makeResponse([]) }, { cookie: cookieHeader(seeded.setCookies) });
            return { ms, seedS: (verified.json as { seed_time: number }).seed_time };
          };
          firstMs.push((await seedOnce()).ms);
          for (const entry of readdirSync(imageCacheDir).filter((name) => name.startsWith('sha256-'))) {
            const how = (JSON.parse(readFileSync(join(imageCacheDir, entry, 'image.json'), 'utf8')) as { unpackedWith?: string }).unpackedWith;
            if (how !== undefined) unpackedWith.add(how);
          }
          if (i === 0) {
            for (let j = 0; j < IMAGE_CACHED_SEEDS; j++) {
              const { ms, seedS } = await seedOnce();
              cachedMs.push(ms);
              cachedSeedS.push(seedS * 1000);
            }
          }
        } finally {
          await server.close();
          await app.close();
          rmSync(imageCacheDir, { recursive: true, force: true });
        }
      }
      console.log(`${kind.name}${unpackedWith.size === 0 ? '' : ` (unpacked by ${[...unpackedWith].join(', ')})`}; load average ${loadavg().map((l) => l.toFixed(1)).join(' ')}`);
      console.log(`${''.padEnd(11)} ${'first-use seed'.padEnd(40)} ${latencyLine(firstMs)}`);
      // the ratio of the medians, and of the runs' sums: the tool and the first use take turns, so
      // both see the host's load of the moment
      const sum = (values: number[]): number => values.reduce((a, b) => a + b, 0);
      for (const [name, ms] of toolMs) {
        const ratio = `first use / tool: ${(percentile(firstMs, 50) / percentile(ms, 50)).toFixed(2)} (p50s), ${(sum(firstMs) / sum(ms)).toFixed(2)} (sums)`;
        console.log(`${''.padEnd(11)} ${name.padEnd(40)} ${latencyLine(ms)}  ${ratio}`);
      }
      console.log(`${''.padEnd(11)} ${'cached seed'.padEnd(40)} ${latencyLine(cachedMs)}  (seed_time ${latencyLine(cachedSeedS)})`);
    }
  } finally {
    imageCacheDir = undefined;
    imageTmpDir = undefined;
    images.close();
    built.close();
  }
}

async function fixtureBench(): Promise<void> {
  const built = buildSweFixtures();
  const app = createResourcesServer(swe, { config: { repos_root: built.root } });
  const server = await serveFetch(app);
  const url = server.url;

  async function seed(fixture: SweFixture): Promise<{ cookie: string; ms: number }> {
    const t = performance.now();
    const answer = await call(url, 'POST', '/seed_session', fixture.row);
    if (answer.status !== 200) throw new Error(`seed failed: ${answer.text}`);
    return { cookie: cookieHeader(answer.setCookies), ms: performance.now() - t };
  }
  async function edit(fixture: SweFixture, cookie: string): Promise<number> {
    const t = performance.now();
    const { path, old_str, new_str } = fixture.goldEdit;
    const answer = await call(url, 'POST', '/str_replace_editor', { command: 'str_replace', path: `/workspace/${path}`, old_str, new_str }, { cookie });
    if (!answer.text.includes('has been edited')) throw new Error(`edit failed: ${answer.text}`);
    return performance.now() - t;
  }
  async function verify(fixture: SweFixture, cookie: string): Promise<{ ms: number; body: Record<string, number> }> {
    const t = performance.now();
    const answer = await call(url, 'POST', '/verify', { ...fixture.row, response: makeResponse([]) }, { cookie });
    if (answer.status !== 200) throw new Error(`verify failed: ${answer.text}`);
    return { ms: performance.now() - t, body: answer.json as Record<string, number> };
  }
  async function rollout(fixture: SweFixture): Promise<Timed> {
    const seeded = await seed(fixture);
    const editMs = await edit(fixture, seeded.cookie);
    const verified = await verify(fixture, seeded.cookie);
    return {
      seedMs: seeded.ms,
      editMs,
      verifyMs: verified.ms,
      reward: verified.body.reward!,
      evalStartS: verified.body.eval_sandbox_start_time_taken!,
      patchVerifyS: verified.body.patch_verification_time_taken!,
    };
  }

  try {
    heading(`swe: seed and verify per instance (bwrap, gold fix via str_replace_editor, ${REPEATS} runs each, sequential)`);
    await rollout(built.fixtures[0]!); // warm-up: first git archive, first pytest import
    for (const fixture of built.fixtures) {
      const runs: Timed[] = [];
      for (let i = 0; i < REPEATS; i++) runs.push(await rollout(fixture));
      const rewards = runs.map((r) => r.reward);
      console.log(`${fixture.name.padEnd(10)} seed    ${latencyLine(runs.map((r) => r.seedMs))}`);
      console.log(`${''.padEnd(10)} verify  ${latencyLine(runs.map((r) => r.verifyMs))}`);
      console.log(
        `${''.padEnd(10)}   of which eval sandbox start ${latencyLine(runs.map((r) => r.evalStartS * 1000))}, patch+tests ${latencyLine(runs.map((r) => r.patchVerifyS * 1000))}`,
      );
      console.log(`${''.padEnd(10)} rewards ${rewards.join(' ')}`);
    }

    heading(`swe: ${CONCURRENT} SWE sandboxes at once (the three fixtures round-robin)`);
    const fixtures = Array.from({ length: CONCURRENT }, (_, i) => built.fixtures[i % built.fixtures.length]!);
    let t = performance.now();
    const seeds = await Promise.all(fixtures.map((f) => seed(f)));
    const seedWall = performance.now() - t;
    t = performance.now();
    const edits = await Promise.all(fixtures.map((f, i) => edit(f, seeds[i]!.cookie)));
    const editWall = performance.now() - t;
    t = performance.now();
    const verifies = await Promise.all(fixtures.map((f, i) => verify(f, seeds[i]!.cookie)));
    const verifyWall = performance.now() - t;
    const resolved = verifies.filter((v) => v.body.reward === 1).length;
    console.log(`seed    ${CONCURRENT} at once: wall ${seedWall.toFixed(0)} ms  each ${latencyLine(seeds.map((s) => s.ms))}`);
    console.log(`edit    ${CONCURRENT} at once: wall ${editWall.toFixed(0)} ms  each ${latencyLine(edits)}`);
    console.log(`verify  ${CONCURRENT} at once: wall ${verifyWall.toFixed(0)} ms  each ${latencyLine(verifies.map((v) => v.ms))}`);
    console.log(`resolved ${resolved}/${CONCURRENT}; throughput ${((CONCURRENT * 1000) / (seedWall + editWall + verifyWall)).toFixed(1)} rollouts/s (seed+edit+verify)`);
    if (resolved !== CONCURRENT) throw new Error(`only ${resolved}/${CONCURRENT} gold rollouts resolved`);
  } finally {
    await server.close();
    await app.close();
    built.close();
  }
}

const MANY_SANDBOXES = 64;
const MANY_IMAGES = 8;

/**
 * Memory of this process and every process under it (the sandboxes: bwrap, their shells, git,
 * pytest; RSS summed, so pages they share count once each: an upper bound) plus the host's Shmem
 * (the sandboxes' tmpfs layers and mounts), in bytes. Other processes of the host are left out.
 */
const memUsed = (): number => {
  const children = new Map<number, number[]>();
  const rss = new Map<number, number>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(name)]);
      rss.set(Number(name), Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${name}/status`, 'utf8'))?.[1] ?? 0) * 1024);
    } catch {
      // gone meanwhile
    }
  }
  let total = 0;
  const walk = (pid: number): void => {
    total += rss.get(pid) ?? 0;
    for (const child of children.get(pid) ?? []) walk(child);
  };
  walk(process.pid);
  const shmem = Number(/^Shmem:\s+(\d+)/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? 0) * 1024;
  return total + shmem;
};
const duBytes = (path: string): number => Number(execFileSync('du', ['-sb', path], { encoding: 'utf8' }).split('\t')[0]);

/**
 * 64 SWE sandboxes at once over 8 images on this host (test/swe/many-sandboxes.test.ts's setting):
 * the seeds' p50/p99 on an empty cache (each image unpacked once, ROLLSERVE_IMAGE_UNPACKS at a
 * time) and on the cached images, peak memory in use (the host's, sampled) and disk (the cache and
 * the sandboxes' directories); then eviction's cost: the 8 images seeded one after another on an
 * empty cache, with no cap and with a cap of 4 images (each first use past the fourth evicts one).
 * (`tsx --conditions=@rollserve/source -e "import('./test/bench/swe.ts').then((m) => m.manyImagesBench())"`)
 */
export async function manyImagesBench(): Promise<void> {
  const built = buildSweFixtures();
  const calc = built.fixtures[0]!;
  const set = buildSweImageSet(calc, MANY_IMAGES);
  imageTmpDir = join(set.dir, 'sandboxes');
  mkdirSync(imageTmpDir, { mode: 0o755 });
  const { repo_path: _host, ...base } = calc.row;
  const rowOf = (i: number) => ({ ...base, repo: 'pytest-dev/pytest', version: '8.0', image: `squashfs:${set.files[i % MANY_IMAGES]}` });
  const serve = async (cacheDir: string, capBytes?: number) => {
    imageCacheDir = cacheDir;
    const previous = process.env.ROLLSERVE_IMAGE_CACHE_MAX;
    if (capBytes !== undefined) process.env.ROLLSERVE_IMAGE_CACHE_MAX = String(capBytes);
    const app = createResourcesServer(swe, { config: { sandbox_provider: 'swe-bench-image', images_root: set.dir } });
    const server = await serveFetch(app);
    return {
      url: server.url,
      close: async () => {
        await server.close();
        await app.close();
        if (previous === undefined) delete process.env.ROLLSERVE_IMAGE_CACHE_MAX;
        else process.env.ROLLSERVE_IMAGE_CACHE_MAX = previous;
      },
    };
  };
  const seedAt = async (url: string, row: Record<string, unknown>): Promise<{ ms: number; cookie: string }> => {
    const t = performance.now();
    const seeded = await call(url, 'POST', '/seed_session', row);
    if (seeded.status !== 200) throw new Error(`seed failed: ${seeded.text}`);
    return { ms: performance.now() - t, cookie: cookieHeader(seeded.setCookies) };
  };
  const end = (url: string, row: Record<string, unknown>, cookie: string) => call(url, 'POST', '/verify', { ...row, response: makeResponse([]) }, { cookie });
  try {
    heading(`swe: ${MANY_SANDBOXES} SWE sandboxes at once over ${MANY_IMAGES} images of ${(duBytes(set.files[0]!) / 1e6).toFixed(0)} MB (bwrap, NeMo Gym face)`);
    const cache = join(set.dir, 'cache');
    const server = await serve(cache);
    try {
      for (const state of ['empty cache', 'cached images']) {
        const baseline = memUsed();
        let peakMem = baseline;
        const sampler = setInterval(() => (peakMem = Math.max(peakMem, memUsed())), 200);
        const rows = Array.from({ length: MANY_SANDBOXES }, (_, i) => rowOf(i));
        const t = performance.now();
        const seeds = await Promise.all(rows.map((row) => seedAt(server.url, row)));
        const wall = performance.now() - t;
        peakMem = Math.max(peakMem, memUsed());
        const disk = duBytes(cache) + duBytes(imageTmpDir);
        clearInterval(sampler);
        await Promise.all(rows.map((row, i) => end(server.url, row, seeds[i]!.cookie)));
        console.log(`${state.padEnd(14)} seed ${latencyLine(seeds.map((s) => s.ms))}  wall ${wall.toFixed(0)} ms`);
        console.log(`${''.padEnd(14)} peak memory ${(peakMem / 1e6).toFixed(0)} MB (this process and its sandboxes' RSS summed, + Shmem; ${(baseline / 1e6).toFixed(0)} MB before), sampled; disk ${(disk / 1e6).toFixed(0)} MB (cache + sandboxes)`);
      }
    } finally {
      await server.close();
    }
    const entryBytes = duBytes(cache) / MANY_IMAGES;
    for (const [name, cap] of [['no cap', undefined], ['cap of 4 images', Math.floor(entryBytes * 4.5)]] as const) {
      const dir = join(set.dir, `cache-${cap === undefined ? 'nocap' : 'cap'}`);
      const capped = await serve(dir, cap);
      try {
        const firstUses: number[] = [];
        for (let i = 0; i < MANY_IMAGES; i++) {
          const row = rowOf(i);
          const seeded = await seedAt(capped.url, row);
          firstUses.push(seeded.ms);
          await end(capped.url, row, seeded.cookie);
        }
        const kept = duBytes(dir);
        console.log(`eviction: ${name.padEnd(16)} first-use seed ${latencyLine(firstUses)}  (the last 4: ${latencyLine(firstUses.slice(4))}); cache ${(kept / 1e6).toFixed(0)} MB after`);
      } finally {
        await capped.close();
        rmSync(dir, { recursive: true, force: true });
      }
    }
  } finally {
    imageCacheDir = undefined;
    imageTmpDir = undefined;
    set.close();
    built.close();
  }
}
