import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { createHash } from 'node:crypto';
import { chmodSync, lstatSync, type Stats, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '@rollserve/core';
import {
  bwrapAvailable,
  createBwrapProvider,
  createImageResolver,
  overlayPrefix,
  overlayRoot,
  parseImageReference,
  resolveImage,
  type Sandbox,
  type SandboxProvider,
  type SandboxSpec,
} from '@rollserve/core/sandbox';
import { describeSandboxBehaviour, missingCommands } from '@rollserve/testing';
import { HOSTILE_ENTRIES, makeOciLayout, makeRootfs, makeSif, makeSquashfs, makeTar } from './image-fixtures.ts';
import { closeImageSuite } from './image-suite.ts';

// Images built here from files the test writes (image-fixtures.ts), run under bwrap with the
// image's root read-only under a writable overlay layer per sandbox.
const tools = missingCommands(['umoci', 'skopeo', 'unsquashfs', 'mksquashfs', 'unshare']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : tools.length > 0 ? `missing ${tools.join(', ')}` : undefined;

describe.skipIf(skip !== undefined)('images on bwrap', () => {
  let dir: string;
  let provider: SandboxProvider;
  let cacheDir: string;
  let sandboxDir: string;
  const open: Sandbox[] = [];
  const oci = (): string => `oci:${dir}/layout:v1`;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'rs-images-test-'));
    // the sandbox uid (65534 under a root service) makes its mounts in the sandboxes' directory below
    chmodSync(dir, 0o755);
    cacheDir = join(dir, 'cache');
    sandboxDir = join(dir, 'sandboxes');
    execFileSync('mkdir', ['-m', '755', sandboxDir]);
    const rootfs = join(dir, 'rootfs');
    makeRootfs(rootfs, { 'data/marker': 'from the image\n', 'testbed/setup.txt': 'repo\n' });
    makeOciLayout(rootfs, join(dir, 'layout'), { tag: 'v1', env: ['PATH=/bin', 'IMAGE_VAR=from-config'], workdir: '/testbed' });
    makeOciLayout(rootfs, join(dir, 'user-layout'), { tag: 'v1', user: 'worker', workdir: '/home/worker' });
    makeSquashfs(rootfs, join(dir, 'root.sqfs'));
    // what a hostile image carries (device nodes, a fifo and a socket, setuid/setgid binaries,
    // world-writable files), as a second OCI layer and in a squashfs
    makeOciLayout(rootfs, join(dir, 'hostile-layout'), { tag: 'v1', env: ['PATH=/bin'], extraLayers: [makeTar(HOSTILE_ENTRIES)] });
    makeSquashfs(rootfs, join(dir, 'hostile.sqfs'), { hostile: true });
    makeSif(join(dir, 'root.sqfs'), join(dir, 'root.sif'));
    writeFileSync(join(dir, 'corrupt.sqfs'), 'not a squashfs at all\n'.repeat(100));
    provider = createBwrapProvider({ imageCacheDir: cacheDir, tmpDir: sandboxDir });
  }, 120_000);

  closeImageSuite(() => ({ provider, dir, sandboxDir }), open);

  async function create(image: string, spec: Record<string, unknown> = {}): Promise<Sandbox> {
    const sandbox = await provider.create({ image, ...spec });
    open.push(sandbox);
    return sandbox;
  }

  it('runs an OCI layout: the image files, not the host, with the config env and workdir', async () => {
    const sandbox = await create(oci());
    const result = await sandbox.exec('cat /data/marker; pwd; echo "$IMAGE_VAR $PATH"; test -e /etc/debian_version && echo host-visible; ls /testbed');
    expect(result.stderr).toBe('');
    expect(result.stdout).toBe('from the image\n/testbed\nfrom-config /bin\nsetup.txt\n');
    expect(sandbox.workdir).toBe('/testbed');
    // the spec's env wins over the image's
    const override = await create(oci(), { env: { IMAGE_VAR: 'from-spec' } });
    expect((await override.exec('echo $IMAGE_VAR')).stdout).toBe('from-spec\n');
  });

  it('runs an image\'s root as an unprivileged uid with no capabilities, in exec and in entering processes', async () => {
    const sandbox = await create(oci());
    const caps = 'id -u; while read -r key value; do case $key in CapEff:) echo "$value";; esac; done < /proc/self/status';
    expect((await sandbox.exec(caps)).stdout).toBe('65534\n0000000000000000\n');
    const child = sandbox.spawn(['/bin/sh', '-c', caps]);
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    expect(await child.exited).toBe(0);
    expect(out).toBe('65534\n0000000000000000\n');
    // and the image's files are its own: the root stays writable
    expect((await sandbox.exec('echo changed > /data/marker && cat /data/marker')).stdout).toBe('changed\n');
  });

  it('maps the config user and keeps the image root writable for it', async () => {
    const sandbox = await create(`oci:${dir}/user-layout:v1`);
    const result = await sandbox.exec('id -u; id -g; pwd; echo changed > /data/marker && cat /data/marker');
    expect(result.stdout).toBe('1234\n2345\n/home/worker\nchanged\n');
  });

  it('gives each sandbox its own writable layer: writes reach neither another sandbox nor the cache', async () => {
    const [a, b] = await Promise.all([create(oci()), create(oci())]);
    expect((await a.exec('echo written-by-a > /data/marker && echo new > /etc/new-file && rm /testbed/setup.txt && cat /data/marker')).stdout).toBe('written-by-a\n');
    expect((await b.exec('cat /data/marker; ls /etc; ls /testbed')).stdout).toBe('from the image\ngroup\npasswd\nsetup.txt\n');
    const image = await resolveImage(oci(), { cacheDir });
    expect(readFileSync(join(image.rootfs, 'data/marker'), 'utf8')).toBe('from the image\n');
    expect(readdirSync(join(image.rootfs, 'testbed'))).toEqual(['setup.txt']);
    // upload and download go through the same layer
    await a.upload('/opt/tool/conf', 'x=1\n');
    expect((await a.download('/opt/tool/conf')).toString()).toBe('x=1\n');
    expect((await b.exec('test -e /opt/tool/conf || echo absent')).stdout).toBe('absent\n');
  });

  it('runs a squashfs and a SIF image', async () => {
    for (const image of [`squashfs:${dir}/root.sqfs`, join(dir, 'root.sif')]) {
      const sandbox = await create(image);
      const result = await sandbox.exec('cat /data/marker; test -e /etc/debian_version || echo no-host-files; echo x > /data/marker && cat /data/marker');
      expect(result.stdout).toBe('from the image\nno-host-files\nx\n');
    }
    const sif = await resolveImage(join(dir, 'root.sif'), { cacheDir });
    const squashfs = await resolveImage(`squashfs:${dir}/root.sqfs`, { cacheDir });
    expect(readFileSync(join(sif.rootfs, 'data/marker'), 'utf8')).toBe('from the image\n');
    expect(sif.digest).not.toBe(squashfs.digest);
  });

  it('reads docker-archive and oci-archive tarballs', async () => {
    execFileSync('skopeo', ['--insecure-policy', 'copy', '--quiet', `oci:${dir}/layout:v1`, `docker-archive:${dir}/saved.tar:test/image:v1`]);
    execFileSync('tar', ['-C', join(dir, 'layout'), '-cf', join(dir, 'layout.tar'), '.']);
    for (const image of [`docker-archive:${dir}/saved.tar`, `oci-archive:${dir}/layout.tar`]) {
      const sandbox = await create(image);
      expect((await sandbox.exec('cat /data/marker; echo $IMAGE_VAR; pwd')).stdout).toBe('from the image\nfrom-config\n/testbed\n');
    }
  });

  it('has a resolver of its own close: its unpacks in flight end first, later resolves are refused', async () => {
    const cache = join(dir, 'cache-resolver');
    const resolver = createImageResolver();
    const image = `squashfs:${dir}/root.sqfs`;
    const pending = resolver.resolve(image, { cacheDir: cache });
    await resolver.close();
    // the unpack ended before close did: the entry in place, nothing half-done left behind
    expect(readdirSync(cache).filter((name) => !name.startsWith('.'))).toHaveLength(1);
    expect(readdirSync(cache).filter((name) => name.startsWith('.tmp-') || name.endsWith('.lock'))).toEqual([]);
    expect((await pending).unpacked).toBe(true);
    await expect(resolver.resolve(image, { cacheDir: cache })).rejects.toThrow(/resolver is closed/);
    // the cache it filled serves another resolver
    expect((await resolveImage(image, { cacheDir: cache })).unpacked).toBe(false);
  });

  it('unpacks once for concurrent first uses and not again on a second resolve', async () => {
    const cache = join(dir, 'cache-once');
    const image = `squashfs:${dir}/root.sqfs`;
    const first = await Promise.all([1, 2, 3].map(() => resolveImage(image, { cacheDir: cache })));
    expect(first.filter((r) => r.unpacked)).toHaveLength(1);
    expect(new Set(first.map((r) => r.rootfs)).size).toBe(1);
    const entries = readdirSync(cache).filter((name) => !name.startsWith('.'));
    expect(entries).toHaveLength(1);
    const unpackedAt = statSync(join(cache, entries[0]!)).mtimeMs;
    // the same image by another name: found by its digest, not unpacked again
    const again = await resolveImage(join(dir, 'root.sqfs'), { cacheDir: cache });
    expect(again.unpacked).toBe(false);
    expect(again.rootfs).toBe(first[0]!.rootfs);
    expect(statSync(join(cache, entries[0]!)).mtimeMs).toBe(unpackedAt);
    // nothing half-done left behind
    expect(readdirSync(cache).filter((name) => name.startsWith('.tmp-') || name.startsWith('.stage-') || name.endsWith('.lock'))).toEqual([]);

    // and sandboxes started together on a fresh cache share one unpack
    const fresh = createBwrapProvider({ imageCacheDir: join(dir, 'cache-race'), tmpDir: sandboxDir });
    const sandboxes = await Promise.all([1, 2, 3].map(() => fresh.create({ image: oci() })));
    open.push(...sandboxes);
    for (const sandbox of sandboxes) expect((await sandbox.exec('cat /data/marker')).stdout).toBe('from the image\n');
    expect(readdirSync(join(dir, 'cache-race')).filter((name) => !name.startsWith('.'))).toHaveLength(1);
  });

  it('hashes a new image file while it unpacks it: a copy of a cached image is found by its digest, its early unpack dropped', async () => {
    const cache = join(dir, 'cache-early');
    const resolver = createImageResolver();
    try {
      const first = await resolver.resolve(`squashfs:${dir}/root.sqfs`, { cacheDir: cache });
      expect(first.unpacked).toBe(true);
      // another path, never hashed: its unpack starts beside the hash, and is dropped once the
      // digest names an entry the cache holds
      execFileSync('cp', [join(dir, 'root.sqfs'), join(dir, 'root-copy.sqfs')]);
      const copy = await resolver.resolve(`squashfs:${dir}/root-copy.sqfs`, { cacheDir: cache });
      expect(copy.unpacked).toBe(false);
      expect(copy.rootfs).toBe(first.rootfs);
    } finally {
      await resolver.close();
    }
    // (close waits for the dropped unpack's removal) nothing of it left, no unpack slot held
    expect(readdirSync(cache).filter((name) => name.startsWith('.tmp-') || name.startsWith('.stage-') || name.endsWith('.lock'))).toEqual([]);
    expect(readdirSync(join(cache, '.unpacks'))).toEqual([]);
    expect(readdirSync(cache).filter((name) => !name.startsWith('.'))).toHaveLength(1);
  });

  it('a file another process is reading (its source lock held) is waited for, not unpacked a second time; a holder gone is taken over', async () => {
    const cache = join(dir, 'cache-source-lock');
    const file = join(dir, 'root-held.sqfs');
    execFileSync('cp', [join(dir, 'root.sqfs'), file]);
    mkdirSync(join(cache, '.sources'), { recursive: true, mode: 0o700 });
    chmodSync(cache, process.getuid?.() === 0 ? 0o711 : 0o700);
    // the lock of a live process (by pid and start time, as the cache's locks name their holders)
    const holder = spawn('sleep', ['600'], { stdio: 'ignore' });
    try {
      const stat = readFileSync(`/proc/${holder.pid}/stat`, 'latin1');
      const start = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
      const lock = join(cache, '.sources', `${createHash('sha256').update(file).digest('hex')}.json.lock`);
      writeFileSync(lock, `${holder.pid} ${start}`);
      let done = false;
      const resolving = resolveImage(`squashfs:${file}`, { cacheDir: cache }).finally(() => (done = true));
      await new Promise((resolve) => setTimeout(resolve, 1500));
      expect(done).toBe(false);
      expect(readdirSync(cache).filter((name) => name.startsWith('.stage-') || name.startsWith('.tmp-') || name.startsWith('sha256-'))).toEqual([]);
      holder.kill('SIGKILL');
      await once(holder, 'exit');
      const resolved = await resolving;
      expect(resolved.unpacked).toBe(true);
      expect(readFileSync(join(resolved.rootfs, 'data/marker'), 'utf8')).toBe('from the image\n');
      expect(readdirSync(join(cache, '.sources')).filter((name) => name.endsWith('.lock'))).toEqual([]);
    } finally {
      holder.kill('SIGKILL');
    }
  });

  it('unpacks a large squashfs with several unsquashfs at once: the same files, links and modes as the image, sealed', async () => {
    const root = join(dir, 'large-rootfs');
    makeRootfs(root, { 'data/marker': 'from the image\n' });
    // 2,600 files over 26 directories (past the size below which one unsquashfs does it all),
    // a symlink and a hard link
    for (let d = 0; d < 26; d++) {
      mkdirSync(join(root, 'many', `d${d}`), { recursive: true });
      for (let f = 0; f < 100; f++) writeFileSync(join(root, 'many', `d${d}`, `f${f}`), `file ${d}/${f}\n`);
    }
    chmodSync(join(root, 'many/d3/f7'), 0o750);
    execFileSync('ln', ['-s', '../d0/f0', join(root, 'many/d1/link')]);
    execFileSync('ln', [join(root, 'many/d2/f2'), join(root, 'many/d25/hard')]);
    // and one whose names need escaping in unsquashfs's pseudo-file listing
    writeFileSync(join(root, 'many/d0/a b\\c"d'), 'linked\n');
    execFileSync('ln', [join(root, 'many/d0/a b\\c"d'), join(root, 'many/d24/e f')]);
    const file = join(dir, 'large.sqfs');
    makeSquashfs(root, file, { hostile: true });
    const resolved = await resolveImage(`squashfs:${file}`, { cacheDir: join(dir, 'cache-large') });
    expect(resolved.unpacked).toBe(true);
    const listing = (base: string): string[] =>
      execFileSync('find', ['.', '-path', './hostile', '-prune', '-o', '-printf', '%y %m %p %l\\n'], { cwd: base, encoding: 'utf8' }).split('\n').sort();
    expect(listing(resolved.rootfs)).toEqual(listing(root));
    const digest = (base: string): string => execFileSync('sh', ['-c', "find many data -type f -exec sha256sum {} + | sort"], { cwd: base, encoding: 'utf8' });
    expect(digest(resolved.rootfs)).toBe(digest(root));
    // hard links stay one file, though their names are at the two ends of the listing
    for (const [a, b] of [['many/d2/f2', 'many/d25/hard'], ['many/d0/a b\\c"d', 'many/d24/e f']]) {
      expect(statSync(join(resolved.rootfs, b!)).ino, b).toBe(statSync(join(resolved.rootfs, a!)).ino);
    }
    // the hostile entries were not made, or were sealed
    expect(readdirSync(join(resolved.rootfs, 'hostile')).sort()).toEqual(['sgid', 'shared', 'sticky', 'suid']);
    for (const name of ['sgid', 'suid', 'shared', 'shared/open-file', 'sticky']) expect(statSync(join(resolved.rootfs, 'hostile', name)).mode & 0o6022, name).toBe(0);
    const sandbox = await provider.create({ image: `squashfs:${file}` });
    open.push(sandbox);
    expect((await sandbox.exec('cat /many/d25/hard /many/d1/link /data/marker')).stdout).toBe('file 2/2\nfile 0/0\nfrom the image\n');
  });

  it('never uses what an unpack that died left, and takes over its lock', async () => {
    const cache = join(dir, 'cache-crash');
    const file = join(dir, 'root.sqfs');
    const hex = createHash('sha256').update(readFileSync(file)).digest('hex');
    const entry = `sha256-${hex}`;
    const dead = spawnSync('true').pid!;
    mkdirSync(join(cache, `.tmp-${entry}-0123456789ab`, 'rootfs/data'), { recursive: true });
    writeFileSync(join(cache, `.tmp-${entry}-0123456789ab`, 'rootfs/data/marker'), 'half\n');
    mkdirSync(join(cache, entry, 'rootfs'), { recursive: true }); // no image.json: incomplete
    writeFileSync(join(cache, `${entry}.lock`), String(dead));
    // and what an early unpack (before the digest was known) of a dead process left
    mkdirSync(join(cache, `.stage-${dead}-12345-0123456789ab`, 'rootfs'), { recursive: true });
    const image = await resolveImage(`squashfs:${file}`, { cacheDir: cache, lockTimeoutMs: 60_000 });
    expect(image.unpacked).toBe(true);
    expect(readFileSync(join(image.rootfs, 'data/marker'), 'utf8')).toBe('from the image\n');
    // beside the entry: the digests of image files, the entry's (released) uses and the unpack slots, none held
    expect(readdirSync(cache).sort()).toEqual(['.sources', '.unpacks', '.uses', entry]);
    expect(readdirSync(join(cache, '.unpacks'))).toEqual([]);
    expect(readdirSync(join(cache, '.uses'))).toEqual([entry]);
    expect(readdirSync(join(cache, '.uses', entry))).toEqual([]);
  });

  it('refuses a missing, corrupt or unreadable image with a clear 4xx', async () => {
    const cases: Array<[string, number, RegExp]> = [
      [`oci:${dir}/no-such-layout:v1`, 422, /no OCI image layout/],
      [`oci:${dir}/layout:no-such-tag`, 422, /no tag "no-such-tag".*tags: v1/],
      [`squashfs:${dir}/missing.sqfs`, 422, /no image file/],
      [`squashfs:${dir}/corrupt.sqfs`, 422, /cannot unpack the squashfs/],
      [`sif:${dir}/corrupt.sqfs`, 422, /not a usable SIF: no SIF magic/],
      [`docker-archive:${dir}/corrupt.sqfs`, 422, /cannot read the image/],
      ['docker://python:3.12', 400, /registry references need a network/],
      [`${dir}/no-such-root`, 422, /nothing at/],
      [`${dir}/root.sqfs.txt`, 422, /nothing at/],
    ];
    for (const [image, status, message] of cases) {
      const error = await provider.create({ image }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(RolloutError.isInstance(error), image).toBe(true);
      expect((error as RolloutError).status, image).toBe(status);
      expect((error as RolloutError).message).toMatch(message);
    }
    expect(readdirSync(sandboxDir)).toEqual([]);
    expect(readdirSync(cacheDir).filter((name) => name.startsWith('.tmp-') || name.startsWith('.stage-') || name.endsWith('.lock'))).toEqual([]);
  });

  // removing a directory of the image that holds files (testbed/) takes the overlay's userxattr in a
  // user namespace: without it, EIO ("overlayfs: failed to set xattr on upper")
  it('mounts the overlay layer with either setup (perl calling mount(2), or sh with util-linux mount); a directory of the image can be removed and made again empty', () => {
    for (const mounter of ['perl', 'mount'] as const) {
      const layer = mkdtempSync(join(dir, `layer-${mounter}-`));
      const root = overlayRoot(layer);
      const argv = [
        ...overlayPrefix(join(dir, 'rootfs'), layer, 1 << 20, mounter),
        '/bin/sh',
        '-c',
        `cat ${root}/data/marker; echo changed > ${root}/data/marker; cat ${root}/data/marker; head -c 2000000 /dev/zero > ${root}/big || echo layer-full; ` +
          `rm -rf ${root}/testbed && echo removed; mkdir ${root}/testbed && ls -A ${root}/testbed | wc -l`,
      ];
      const out = execFileSync(argv[0]!, argv.slice(1), { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
      expect(out, mounter).toBe('from the image\nchanged\nlayer-full\nremoved\n0\n');
      expect(readFileSync(join(dir, 'rootfs/data/marker'), 'utf8')).toBe('from the image\n');
      expect(readFileSync(join(dir, 'rootfs/testbed/setup.txt'), 'utf8')).toBe('repo\n');
      expect(readdirSync(layer)).toEqual([]);
    }
  });

  describe('sealed images', () => {
    const hostile = (): string[] => [`oci:${dir}/hostile-layout:v1`, `squashfs:${dir}/hostile.sqfs`];

    /** Every file of an unpacked root, by lstat (symlinks not followed). */
    function walk(root: string): Array<{ path: string; stat: Stats }> {
      const out: Array<{ path: string; stat: Stats }> = [];
      const visit = (path: string): void => {
        const stat = lstatSync(path);
        out.push({ path, stat });
        if (stat.isDirectory()) for (const name of readdirSync(path)) visit(join(path, name));
      };
      visit(root);
      return out;
    }

    it('an image is sealed when unpacked: no device nodes, fifos or sockets, no setuid/setgid, nothing writable by group or others', async () => {
      for (const image of hostile()) {
        const sandbox = await create(image);
        const resolved = await resolveImage(image, { cacheDir });
        const files = walk(resolved.rootfs);
        expect(files.length, image).toBeGreaterThan(20);
        const special = files.filter(({ stat }) => stat.isBlockDevice() || stat.isCharacterDevice() || stat.isFIFO() || stat.isSocket());
        expect(special.map((f) => f.path), image).toEqual([]);
        const setid = files.filter(({ stat }) => !stat.isSymbolicLink() && (stat.mode & 0o6000) !== 0);
        expect(setid.map((f) => f.path), image).toEqual([]);
        const writable = files.filter(({ stat }) => !stat.isSymbolicLink() && (stat.mode & 0o022) !== 0);
        expect(writable.map((f) => f.path), image).toEqual([]);
        // the service's files, in a cache only it can enter
        const uid = process.getuid!();
        expect(files.filter(({ stat }) => stat.uid !== uid).map((f) => f.path), image).toEqual([]);
        // (0711 under root: the unpacking uid enters its staging directory; every entry is 0700)
        expect(statSync(cacheDir).mode & 0o777).toBe(process.getuid?.() === 0 ? 0o711 : 0o700);
        expect(statSync(join(resolved.rootfs, '..')).mode & 0o777).toBe(0o700);
        expect(statSync(cacheDir).uid).toBe(uid);
        // inside, the same: the sandbox's files, its own to change (in its layer), none special
        const inside = await sandbox.exec('stat -c "%A %n" /hostile/* /hostile/shared/open-file; echo mine > /hostile/shared/open-file && cat /hostile/shared/open-file');
        expect(inside.stderr, image).toBe('');
        const modes = inside.stdout.split('\n').filter((line) => line.includes(' /hostile/'));
        expect(modes.filter((line) => /^[bcps]/.test(line)), image).toEqual([]);
        expect(modes.filter((line) => /^.{3}[sS]|^.{6}[sS]|^.{5}w|^.{8}w/.test(line)), image).toEqual([]);
        expect(inside.stdout.endsWith('mine\n'), image).toBe(true);
        expect(readFileSync(join(resolved.rootfs, 'hostile/shared/open-file'), 'utf8'), image).toBe('anyone may write\n');
      }
    });

    it.skipIf(process.getuid?.() !== 0)('as root, the sandbox uid cannot reach the cache on the host (the sandbox sees the image through an idmapped clone)', async () => {
      const sandbox = await create(hostile()[1]!);
      const resolved = await resolveImage(hostile()[1]!, { cacheDir });
      // inside: the files are the sandbox uid's
      expect((await sandbox.exec('id -u; stat -c "%u %a" /data/marker')).stdout).toBe('65534\n65534 644\n');
      // outside: uid 65534 (every root service's sandboxes run as it) reads nothing of the cache
      const asNobody = (args: string[]) => spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', ...args], { encoding: 'utf8' });
      const read = asNobody(['cat', join(resolved.rootfs, 'data/marker')]);
      expect(read.status).not.toBe(0);
      expect(read.stderr).toMatch(/Permission denied/);
      const write = asNobody(['sh', '-c', `echo poisoned > ${join(resolved.rootfs, 'hostile/shared/open-file')}`]);
      expect(write.status).not.toBe(0);
      expect(readFileSync(join(resolved.rootfs, 'hostile/shared/open-file'), 'utf8')).toBe('anyone may write\n');
      // the unpack tools run as that uid too: an image only root may read is not unpacked
      const secret = join(dir, 'root-only.sqfs');
      execFileSync('cp', [join(dir, 'root.sqfs'), secret]);
      chmodSync(secret, 0o600);
      const refused = await resolveImage(`squashfs:${secret}`, { cacheDir: join(dir, 'cache-root-only') }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(RolloutError.isInstance(refused) && refused.status).toBe(422);
      expect((refused as Error).message).toMatch(/cannot unpack the squashfs.*(Permission denied|Could not open)/s);
    });

    it.skipIf(process.getuid?.() !== 0)('an unprivileged service (uid 65534) seals images the same way, in a cache of its own', async () => {
      const own = join(dir, 'as-nobody');
      mkdirSync(join(own, 'sandboxes'), { recursive: true });
      execFileSync('chown', ['-R', '65534:65534', own]);
      const tsx = join(__dirname, '../../node_modules/.bin/tsx');
      for (const image of hostile()) {
        const cache = join(own, `cache-${image.split(':')[0]}`);
        const probe = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', tsx, join(__dirname, 'image-probe.ts'), cache, join(own, 'sandboxes'), image], {
          encoding: 'utf8',
          env: { ...process.env, HOME: own },
        });
        expect(probe.status, `${image}: ${probe.stderr}`).toBe(0);
        const seen = JSON.parse(probe.stdout.trim().split('\n').pop()!) as {
          uid: number;
          inside: { stdout: string; stderr: string };
          cacheMode: number;
          files: Array<{ path: string; mode: number; uid: number; special: boolean }>;
        };
        expect(seen.uid).toBe(65534);
        expect(seen.cacheMode, image).toBe(0o700);
        expect(seen.files.length, image).toBeGreaterThan(20);
        expect(seen.files.filter((f) => f.special || (f.mode & 0o6022) !== 0 || f.uid !== 65534).map((f) => f.path), image).toEqual([]);
        const [id, ...rest] = seen.inside.stdout.split('\n');
        expect(id, image).toBe('65534');
        expect(rest.filter((line) => line.includes(' /hostile/') && /^[bcps]|^.{3}[sS]|^.{6}[sS]|^.{5}w|^.{8}w/.test(line)), image).toEqual([]);
        expect(seen.inside.stdout, image).toContain('mine\n');
        expect(seen.inside.stdout, image).toMatch(/lowerdir=\/proc\/self\/fd\/\d+,upperdir=upper,workdir=work/);
        expect(seen.inside.stdout, image).not.toContain(cache);
      }
      expect(readdirSync(join(own, 'sandboxes'))).toEqual([]);
    });

    it('a cached entry is used only when it is sealed for its digest; anything else is unpacked again', async () => {
      const cache = join(dir, 'cache-seal');
      const image = `squashfs:${dir}/root.sqfs`;
      const first = await resolveImage(image, { cacheDir: cache });
      expect(first.unpacked).toBe(true);
      const entry = join(first.rootfs, '..');
      const record = JSON.parse(readFileSync(join(entry, 'image.json'), 'utf8')) as Record<string, unknown>;
      expect(record).toMatchObject({ digest: first.digest, sealed: expect.any(Number) });
      // an entry from before sealing (or one with its seal removed) is not trusted
      const { sealed: _sealed, ...unsealed } = record;
      writeFileSync(join(entry, 'image.json'), JSON.stringify(unsealed));
      writeFileSync(join(first.rootfs, 'data/marker'), 'tampered\n');
      const again = await resolveImage(image, { cacheDir: cache });
      expect(again.unpacked).toBe(true);
      expect(readFileSync(join(again.rootfs, 'data/marker'), 'utf8')).toBe('from the image\n');
      // nor one whose record names another digest, nor one writable by others
      writeFileSync(join(entry, 'image.json'), JSON.stringify({ ...record, digest: `sha256:${'0'.repeat(64)}` }));
      expect((await resolveImage(image, { cacheDir: cache })).unpacked).toBe(true);
      chmodSync(first.rootfs, 0o777);
      expect((await resolveImage(image, { cacheDir: cache })).unpacked).toBe(true);
      expect((await resolveImage(image, { cacheDir: cache })).unpacked).toBe(false);
      // a layout whose index names a digest that is a path is refused, not used as a cache name
      const layout = join(dir, 'evil-layout');
      execFileSync('cp', ['-r', join(dir, 'layout'), layout]);
      const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as { manifests: Array<{ digest: string }> };
      index.manifests[0]!.digest = 'sha256:../../../../tmp/escape';
      writeFileSync(join(layout, 'index.json'), JSON.stringify(index));
      await expect(resolveImage(`oci:${layout}:v1`, { cacheDir: cache })).rejects.toThrow(/malformed manifest digest/);
    });

    it("no host path in an image sandbox's mount table: the overlay names its layers by descriptor and relative paths", async () => {
      const sandbox = await create(oci());
      const { stdout } = await sandbox.exec('cat /proc/self/mountinfo; echo ===; cat /proc/mounts');
      const [mountinfo = '', mounts = ''] = stdout.split('===\n');
      const overlay = mountinfo.split('\n').find((line) => / - overlay /.test(line)) ?? '';
      expect(overlay).toMatch(/lowerdir=\/proc\/self\/fd\/\d+,upperdir=upper,workdir=work/);
      for (const path of [cacheDir, dir, sandboxDir, join(dir, 'layout')]) {
        expect(mounts, path).not.toContain(path);
        // (mountinfo's fourth field of a bind mount is its source's path within its filesystem:
        // the service's input directory is a tmpfs for that; see host-paths.test.ts)
        expect(mountinfo, path).not.toContain(path);
      }
      expect(mountinfo).not.toContain(cacheDir);
    });
  });

  it('parses references', () => {
    expect(parseImageReference('oci:/images/x:v1')).toEqual({ kind: 'oci', path: '/images/x', tag: 'v1' });
    expect(parseImageReference('oci:/images/x')).toEqual({ kind: 'oci', path: '/images/x' });
    expect(parseImageReference('/images/a.sif')).toEqual({ kind: 'sif', path: '/images/a.sif' });
    expect(parseImageReference('/images/a.sqfs')).toEqual({ kind: 'squashfs', path: '/images/a.sqfs' });
    expect(parseImageReference('/images/a.tar')).toEqual({ kind: 'docker-archive', path: '/images/a.tar' });
  });
});

// The behaviour every provider shows (packages/testing's suite), on an image: exec, env, stdin,
// files, time limits, limits, staging, PTY and pipes over the overlay root.
const behaviourSpec: SandboxSpec = {};
let behaviourProvider: SandboxProvider | undefined;
if (skip === undefined) {
  const root = mkdtempSync(join(tmpdir(), 'rs-images-behaviour-'));
  chmodSync(root, 0o755);
  makeRootfs(join(root, 'rootfs'));
  makeOciLayout(join(root, 'rootfs'), join(root, 'layout'), { env: ['PATH=/bin'] });
  behaviourSpec.image = `oci:${root}/layout`;
  afterAll(async () => {
    await behaviourProvider?.close?.();
    rmSync(root, { recursive: true, force: true });
  });
  behaviourProvider = createBwrapProvider({ imageCacheDir: join(root, 'cache') });
}
describeSandboxBehaviour('bwrap on an OCI image', () => behaviourProvider!, {
  ...(skip === undefined ? {} : { skip }),
  spec: behaviourSpec,
});
