import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bwrapAvailable } from '@rollserve/core/sandbox';
import { missingCommands, startFakePolicy } from '@rollserve/testing';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { makeMarkedSquashfsImages } from '../sandbox/image-fixtures.ts';
import { imageNodeEnvironment } from './fixtures/image-env.ts';
import { getJson, Resources, sandboxDir, startNode, startService, until, type NodeProcess } from './helpers.ts';

// Rollout nodes (real processes against a real service) ready the images of the work they have
// claimed and not started yet, and of the tasks the service names as queued next (a claim's
// `upcoming`): while one rollout holds the node's one INIT slot, those images are unpacked into
// the cache (the node's runner's prefetch), so that their INIT starts on a cached image; nodes of
// one host share one cache and unpack an image once.
// Unpacks are counted by an `unsquashfs` first on the nodes' PATH that notes each run.

const tools = missingCommands(['unsquashfs', 'mksquashfs']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : tools.length > 0 ? `missing ${tools.join(', ')}` : undefined;

const resources = new Resources();
afterEach(() => resources.cleanup());

describe.skipIf(skip !== undefined)('rollout nodes prefetch the images of the work they hold', () => {
  let dir: string;
  let shim: string;
  const images: Record<string, string> = {};
  const entryOf = (name: string): string => `sha256-${createHash('sha256').update(readFileSync(images[name]!)).digest('hex')}`;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'rs-node-prefetch-test-'));
    // the unpack tools (under root: as the sandbox uid) read the images and write the log
    chmodSync(dir, 0o755);
    Object.assign(images, makeMarkedSquashfsImages(dir, ['a', 'b', 'c', 'd']));
    shim = join(dir, 'bin');
    mkdirSync(shim, { mode: 0o755 });
    const real = execFileSync('sh', ['-c', 'command -v unsquashfs'], { encoding: 'utf8' }).trim();
    writeFileSync(join(shim, 'unsquashfs'), `#!/bin/sh\ncase " $* " in *" -dest "*) printf '%s\\n' "$*" >> "$(dirname "$0")/unpacks.log" ;; esac\nexec ${real} "$@"\n`, { mode: 0o755 });
    writeFileSync(join(shim, 'unpacks.log'), '', { mode: 0o666 });
    chmodSync(join(shim, 'unpacks.log'), 0o666);
  }, 120_000);

  afterAll(() => {
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  /** Runs of unsquashfs that unpacked an image, by image name. */
  const unpacks = (): Record<string, number> => {
    const counts: Record<string, number> = {};
    for (const line of readFileSync(join(shim, 'unpacks.log'), 'utf8').split('\n').filter((l) => l !== '')) {
      const name = Object.keys(images).find((n) => line.includes(images[n]!))!;
      counts[name] = (counts[name] ?? 0) + 1;
    }
    return counts;
  };
  const entries = (cache: string): string[] => (existsSync(cache) ? readdirSync(cache).filter((name) => name.startsWith('sha256-')) : []);
  const liveUses = (cache: string): string[] =>
    existsSync(join(cache, '.uses')) ? readdirSync(join(cache, '.uses')).flatMap((entry) => readdirSync(join(cache, '.uses', entry)).map((use) => `${entry}/${use}`)) : [];
  const seeds = (log: string): Array<{ pid: number; image: string; entries: string[] }> =>
    existsSync(log) ? readFileSync(log, 'utf8').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as { pid: number; image: string; entries: string[] }) : [];
  const task = (id: string, name: string, gate?: string) => ({
    id,
    env: 'node-images',
    row: { image: `squashfs:${images[name]}`, ...(gate === undefined ? {} : { gate }), responses_create_params: { input: [{ role: 'user', content: 'go' }] } },
    policy: { model: 'fake-policy' },
  });

  async function setUp(name: string) {
    const work = join(dir, name);
    mkdirSync(work, { mode: 0o755 });
    writeFileSync(join(shim, 'unpacks.log'), '');
    const fake = await startFakePolicy({ script: () => 'done' });
    resources.add(() => fake.close());
    const { url, service } = await startService(resources, fake.url, { environments: [imageNodeEnvironment] });
    const sandboxes = await sandboxDir(resources);
    const cache = join(work, 'cache');
    const seedLog = join(work, 'seeds.log');
    const env = { ROLLSERVE_IMAGE_CACHE: cache, ROLLSERVE_TEST_SEED_LOG: seedLog, PATH: `${shim}:${process.env.PATH}` };
    // one INIT slot, one RUN slot: the node holds two rollouts, the second waiting for INIT
    const node = (): Promise<NodeProcess> => startNode(resources, { serviceUrl: url, pools: { init: 1, run: 1, eval: 1 } }, sandboxes, { agent: 'image-node-agent.ts', env });
    return { work, url, service, sandboxes, cache, seedLog, node, gate: join(work, 'gate') };
  }

  /** After the node left: no sandbox, no use of an image, no unpack's temp directory left. */
  async function leave(nodes: NodeProcess[], sandboxes: string, cache: string): Promise<void> {
    for (const node of nodes) node.child.kill('SIGTERM');
    for (const node of nodes) expect(await node.exited).toEqual({ code: 0, signal: null });
    expect(readdirSync(sandboxes).filter((name) => name.startsWith('rollserve-'))).toEqual([]);
    expect(liveUses(cache)).toEqual([]);
    expect(readdirSync(cache).filter((name) => name.startsWith('.tmp-') || name.startsWith('.evict-'))).toEqual([]);
  }

  it("unpacks the images of the rollout claimed behind the one in INIT and of the task queued next before their INIT, each image once", async () => {
    const { service, sandboxes, cache, seedLog, node, gate } = await setUp('one-node');
    const agent = await node();
    const tasks = [task('a-0', 'a', gate), task('b-1', 'b'), task('c-2', 'c')];
    await service.submit(tasks);
    // a holds INIT (its sandbox up, seedSession waiting); b, claimed behind it, has its image
    // readied, and so has c, which the node (two rollouts at most) has not claimed: the service
    // named it as queued next
    await until(() => seeds(seedLog).length === 1 && entries(cache).includes(entryOf('b')) && entries(cache).includes(entryOf('c')));
    expect(seeds(seedLog).map((s) => s.image)).toEqual([`squashfs:${images.a}`]);
    expect(agent.events.filter((e) => e.type === 'claimed').map((e) => e.rolloutId).sort()).toEqual(['a-0', 'b-1']);
    expect(agent.events.filter((e) => e.type === 'upcoming')).toEqual([{ type: 'upcoming', taskIds: ['c-2'] }]);
    writeFileSync(gate, '');
    const results = await Promise.all(tasks.map((t) => service.wait(t.id)));
    for (const result of results) expect(result.error?.message ?? null).toBeNull();
    expect(results.map((r) => r.reward)).toEqual([1, 1, 1]);
    const seen = seeds(seedLog);
    expect(seen.map((s) => s.image)).toEqual(['a', 'b', 'c'].map((name) => `squashfs:${images[name]}`));
    // b's and c's INIT began on the images their prefetches had unpacked
    expect(seen[1]!.entries).toContain(entryOf('b'));
    expect(seen[2]!.entries).toContain(entryOf('c'));
    expect(unpacks()).toEqual({ a: 1, b: 1, c: 1 });
    await leave([agent], sandboxes, cache);
  }, 180_000);

  it('two nodes of one host sharing the cache unpack an image both prefetch once', async () => {
    const { service, sandboxes, cache, seedLog, node, gate } = await setUp('two-nodes');
    const [first, second] = [await node(), await node()];
    // each node claims two (its max_rollouts): an a that holds its INIT, and a d waiting behind it
    const tasks = [task('a-0', 'a', gate), task('d-1', 'd'), task('a-2', 'a', gate), task('d-3', 'd')];
    await service.submit(tasks);
    await until(() => seeds(seedLog).length === 2 && entries(cache).includes(entryOf('d')));
    for (const agent of [first!, second!]) expect((await agent.waitForCount('claimed', 2)).map((e) => e.rolloutId[0]).sort()).toEqual(['a', 'd']);
    expect(new Set(seeds(seedLog).map((s) => s.pid)).size).toBe(2);
    writeFileSync(gate, '');
    const results = await Promise.all(tasks.map((t) => service.wait(t.id)));
    for (const result of results) expect(result.error?.message ?? null).toBeNull();
    const dSeeds = seeds(seedLog).filter((s) => s.image === `squashfs:${images.d}`);
    expect(new Set(dSeeds.map((s) => s.pid)).size).toBe(2);
    for (const seed of dSeeds) expect(seed.entries).toContain(entryOf('d'));
    expect(unpacks()).toEqual({ a: 1, d: 1 });
    await leave([first!, second!], sandboxes, cache);
  }, 180_000);

  it('a claim answer names the tasks queued next only to a node that reads them, only with work handed out, shared among the nodes up', async () => {
    const { url, service } = await setUp('protocol');
    const registration = { node_id: 'raw', host: 'h', pid: 1, capacity: { init: 1, run: 1, eval: 1 }, max_rollouts: 2, environments: ['node-images'] };
    const registered = await getJson(url, '/v1/nodes', { body: registration });
    expect(registered.status).toBe(201);
    const credential = { 'x-rollserve-node-credential': registered.json.credential as string };
    const claim = (headers: Record<string, string>) => getJson(url, '/v1/nodes/raw/claim', { body: { limit: 1, wait_ms: 0 }, headers: { ...credential, ...headers } });
    // a group of two (one task) and three more tasks: the distinct tasks next, at most four
    await service.submit([{ ...task('g', 'a'), n: 2 }, task('t1', 'b'), task('t2', 'c'), task('t3', 'd'), task('t4', 'a')]);
    const reads = await claim({ 'x-rollserve-node-features': 'weights,prefetch' });
    expect(reads.status).toBe(200);
    expect(reads.json.claims.map((c: { rollout_id: string }) => c.rollout_id)).toEqual(['g:0']);
    expect(reads.json.upcoming.map((u: { task_id: string }) => u.task_id)).toEqual(['g', 't1', 't2', 't3']);
    expect(reads.json.upcoming[1].task).toMatchObject({ id: 't1', env: 'node-images', row: { image: `squashfs:${images.b}` } });
    // an older node (no feature) gets the first form, which its strict schema takes
    const older = await claim({ 'x-rollserve-node-features': 'weights' });
    expect(Object.keys(older.json)).toEqual(['claims']);
    expect(older.json.claims.map((c: { rollout_id: string }) => c.rollout_id)).toEqual(['g:1']);
    // with no work handed out (the node is full), no hint either
    const full = await claim({ 'x-rollserve-node-features': 'prefetch' });
    expect(full.json).toEqual({ claims: [] });
    // two nodes up: each is told half as much (the head of the queue goes to whichever frees first)
    const second = await getJson(url, '/v1/nodes', { body: { ...registration, node_id: 'raw2' } });
    const seconds = await getJson(url, '/v1/nodes/raw2/claim', {
      body: { limit: 1, wait_ms: 0 },
      headers: { 'x-rollserve-node-credential': second.json.credential as string, 'x-rollserve-node-features': 'prefetch' },
    });
    expect(seconds.json.claims.map((c: { rollout_id: string }) => c.rollout_id)).toEqual(['t1']);
    expect(seconds.json.upcoming.map((u: { task_id: string }) => u.task_id)).toEqual(['t2', 't3']);
  });
});
