import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider, createImageResolver, type Sandbox } from '@rollserve/core/sandbox';
import { makeMarkedSquashfsImages } from './image-fixtures.ts';
import { missingCommands } from '@rollserve/testing';

// The image cache's cap: LRU eviction that never evicts an image a sandbox runs on, in this
// process or in another sharing the cache (a rollout node of the same host), and the host-wide
// bound on unpacks at once. Images are squashfs files built here, each with its own payload.

const tools = missingCommands(['unsquashfs', 'mksquashfs', 'du']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : tools.length > 0 ? `missing ${tools.join(', ')}` : undefined;
const tsx = join(__dirname, '../../node_modules/.bin/tsx');

describe.skipIf(skip !== undefined)('the image cache: a cap, LRU eviction, uses across processes', () => {
  let dir: string;
  let sandboxDir: string;
  /** squashfs files by name, and their cache entries' names. */
  const images: Record<string, string> = {};
  const entryOf = (name: string): string => `sha256-${createHash('sha256').update(readFileSync(images[name]!)).digest('hex')}`;
  /** Bytes one entry takes in the cache (they are alike). */
  let entryBytes: number;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rs-images-cache-test-'));
    chmodSync(dir, 0o755);
    sandboxDir = join(dir, 'sandboxes');
    mkdirSync(sandboxDir, { mode: 0o755 });
    Object.assign(images, makeMarkedSquashfsImages(dir, ['a', 'b', 'c', 'd']));
    // one entry's size, from its record
    const scratch = join(dir, 'scratch-cache');
    const resolver = createImageResolver();
    await resolver.resolve(`squashfs:${images.a}`, { cacheDir: scratch });
    await resolver.close();
    entryBytes = (JSON.parse(readFileSync(join(scratch, entryOf('a'), 'image.json'), 'utf8')) as { bytes: number }).bytes;
    expect(entryBytes).toBeGreaterThan(0);
  }, 120_000);

  afterAll(() => {
    const left = dir === undefined ? [] : readdirSync(sandboxDir);
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
    expect(left).toEqual([]);
  });

  const entries = (cache: string): string[] => readdirSync(cache).filter((name) => name.startsWith('sha256-')).sort();
  const uses = (cache: string, entry: string): string[] => (existsSync(join(cache, '.uses', entry)) ? readdirSync(join(cache, '.uses', entry)) : []);

  it('over the cap the least recently used idle image goes, never one a sandbox runs on; a re-use unpacks it again', async () => {
    const cache = join(dir, 'cache-cap');
    // room for one and a half images: every unpack evicts what it can
    const provider = createBwrapProvider({ imageCacheDir: cache, tmpDir: sandboxDir, imageCacheMaxBytes: Math.floor(entryBytes * 1.5) });
    const open: Sandbox[] = [];
    try {
      const onA = await provider.create({ image: `squashfs:${images.a}` });
      open.push(onA);
      expect(uses(cache, entryOf('a'))).toHaveLength(1);
      // b: over the cap, but a is in use and b is being started on: both stay
      const onB = await provider.create({ image: `squashfs:${images.b}` });
      expect(entries(cache)).toEqual([entryOf('a'), entryOf('b')].sort());
      await onB.close();
      expect(uses(cache, entryOf('b'))).toEqual([]);
      // c: b is idle and goes; a (older, in use) stays, and its sandbox goes on reading its files
      const onC = await provider.create({ image: `squashfs:${images.c}` });
      open.push(onC);
      expect(entries(cache), JSON.stringify({ a: entryOf('a'), c: entryOf('c'), uses: readdirSync(join(cache, '.uses')).map((e) => [e, uses(cache, e)]) })).toEqual([entryOf('a'), entryOf('c')].sort());
      expect((await onA.exec('cat /data/marker; wc -c < /data/payload')).stdout).toBe(`image a\n${128 * 4096}\n`);
      expect((await onC.exec('cat /data/marker')).stdout).toBe('image c\n');
      // b again: unpacked anew (a and c in use: the cache stays over its cap meanwhile)
      const resolver = createImageResolver();
      const again = await resolver.resolve(`squashfs:${images.b}`, { cacheDir: cache, hold: true, maxCacheBytes: Math.floor(entryBytes * 1.5) });
      expect(again.unpacked).toBe(true);
      expect(entries(cache)).toEqual([entryOf('a'), entryOf('b'), entryOf('c')].sort());
      again.release!();
      // with a and c closed, the next unpack (d) takes the cache back under the cap: d alone
      for (const sandbox of open.splice(0)) await sandbox.close();
      expect(uses(cache, entryOf('a'))).toEqual([]);
      const onD = await provider.create({ image: `squashfs:${images.d}` });
      open.push(onD);
      expect(entries(cache)).toEqual([entryOf('d')]);
      await resolver.close();
      // nothing left half-done: no lock, no staging directory, and the evicted ones are removed
      await until(undefined, () => !readdirSync(cache).some((name) => name.startsWith('.evict-')), () => readdirSync(cache).join(' '));
      expect(readdirSync(cache).filter((name) => name.endsWith('.lock') || name.startsWith('.tmp-') || name.startsWith('.evict-'))).toEqual([]);
    } finally {
      for (const sandbox of open) await sandbox.close();
      await provider.close?.();
    }
  }, 120_000);

  it("another process's sandbox keeps its image from eviction; once that process is killed its use is stale and the image goes", async () => {
    const cache = join(dir, 'cache-shared');
    const probe = spawn(tsx, ['--conditions=@rollserve/source', join(__dirname, 'image-cache-probe.ts'), cache, sandboxDir, `squashfs:${images.a}`], { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    probe.stdout.on('data', (chunk: Buffer) => (output += chunk));
    probe.stderr.on('data', (chunk: Buffer) => (output += chunk));
    try {
      await until(probe, () => output.includes('ready'), () => output);
      expect(output).toContain('ready image a');
      const resolver = createImageResolver();
      // a tiny cap: each unpack evicts every other image but the one it resolves (b goes when c
      // comes), and a stays for the other process's sandbox
      const options = { cacheDir: cache, maxCacheBytes: 1 };
      for (const name of ['b', 'c']) expect((await resolver.resolve(`squashfs:${images[name]}`, options)).unpacked).toBe(true);
      expect(entries(cache), JSON.stringify({ a: entryOf('a'), c: entryOf('c'), uses: readdirSync(join(cache, '.uses')).map((e) => [e, uses(cache, e)]) })).toEqual([entryOf('a'), entryOf('c')].sort());
      // the other process closes its sandbox in order: its use is gone, and the next unpack evicts a
      probe.stdin.end();
      await until(probe, () => output.includes('closed'), () => output);
      expect(uses(cache, entryOf('a'))).toEqual([]);
      await resolver.resolve(`squashfs:${images.b}`, options);
      expect(entries(cache)).toEqual([entryOf('b')]);
      await resolver.close();
    } finally {
      probe.kill('SIGKILL');
      if (probe.exitCode === null && probe.signalCode === null) await once(probe, 'exit');
    }
    // a process killed while its sandbox ran leaves its use behind: stale, it holds nothing
    const killed = spawn(tsx, ['--conditions=@rollserve/source', join(__dirname, 'image-cache-probe.ts'), cache, sandboxDir, `squashfs:${images.c}`], { stdio: ['pipe', 'pipe', 'pipe'] });
    let killedOutput = '';
    killed.stdout.on('data', (chunk: Buffer) => (killedOutput += chunk));
    killed.stderr.on('data', (chunk: Buffer) => (killedOutput += chunk));
    await until(killed, () => killedOutput.includes('ready'), () => killedOutput);
    killed.kill('SIGKILL');
    await once(killed, 'exit');
    expect(uses(cache, entryOf('c'))).toHaveLength(1);
    const resolver = createImageResolver();
    await resolver.resolve(`squashfs:${images.d}`, { cacheDir: cache, maxCacheBytes: 1 });
    await resolver.close();
    expect(entries(cache)).toEqual([entryOf('d')]);
    expect(uses(cache, entryOf('c'))).toEqual([]);
    // (its sandbox's directory, with the maker gone, is the start-up sweep's: removed here by hand)
    for (const name of readdirSync(sandboxDir)) rmSync(join(sandboxDir, name), { recursive: true, force: true });
  }, 120_000);

  it('first uses on the host are bounded: an unpack waits while another process holds the only slot, and goes on when that process dies', async () => {
    const cache = join(dir, 'cache-slots');
    mkdirSync(join(cache, '.unpacks'), { recursive: true, mode: 0o700 });
    chmodSync(cache, process.getuid?.() === 0 ? 0o711 : 0o700);
    // another process of the host (here a sleep) holds slot 0, as an unpacking node would
    const holder = spawn('sleep', ['600'], { stdio: 'ignore' });
    await once(holder, 'spawn');
    const starttime = readFileSync(`/proc/${holder.pid}/stat`, 'latin1').split(') ')[1]!.split(' ')[19];
    writeFileSync(join(cache, '.unpacks', '0.lock'), `${holder.pid} ${starttime}`);
    const resolver = createImageResolver();
    let settled = false;
    const pending = resolver.resolve(`squashfs:${images.a}`, { cacheDir: cache, maxConcurrentUnpacks: 1 }).finally(() => (settled = true));
    try {
      // the unpack is waiting for the slot, not running
      await until(undefined, () => existsSync(join(cache, `${entryOf('a')}.lock`)), () => 'no entry lock');
      await new Promise((resolve) => setTimeout(resolve, 1000));
      expect(settled).toBe(false);
      expect(readdirSync(cache).filter((name) => name.startsWith('.tmp-'))).toEqual([]);
    } finally {
      holder.kill('SIGKILL');
      await once(holder, 'exit');
    }
    expect((await pending).unpacked).toBe(true);
    await resolver.close();
    expect(readdirSync(join(cache, '.unpacks'))).toEqual([]);
  }, 120_000);
});

async function until(child: ChildProcess | undefined, done: () => boolean, what: () => string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!done()) {
    if (Date.now() > deadline || (child !== undefined && child.exitCode !== null)) throw new Error(`not reached: ${what()}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
