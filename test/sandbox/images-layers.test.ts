import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, chownSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '@rollserve/core';
import { bwrapAvailable, createBwrapProvider, createImageResolver, type Sandbox, type SandboxProvider } from '@rollserve/core/sandbox';
import { missingCommands } from '@rollserve/testing';
import { makeOciLayout, makeRootfs, makeTar, type TarEntry } from './image-fixtures.ts';
import { closeImageSuite } from './image-suite.ts';

// An OCI image's layers unpacked by tar and stacked by the resolver (oci-layers.ts): the root it
// makes against `umoci raw unpack` of the same image (whiteouts, opaque directories, a file
// replaced by a directory and back, a symlink by a directory), tar, gzip and zstd layers, a large
// layer split into runs; and hostile layers that reach across layers for the host (a symlink
// planted by one, written through or whited out through by the next), which must not.
const tools = missingCommands(['umoci', 'tar', 'gzip', 'zstd', 'unshare']);
const skip = !bwrapAvailable() ? 'bwrap is not installed' : tools.length > 0 ? `missing ${tools.join(', ')}` : undefined;

const file = (name: string, content: string, mode?: number): TarEntry => ({ name, type: 'file', content, ...(mode === undefined ? {} : { mode }) });
const dirEntry = (name: string, mode?: number): TarEntry => ({ name: `${name}/`, type: 'dir', ...(mode === undefined ? {} : { mode }) });

/**
 * Every entry of a root: its type, its mode as the seal leaves it (no setuid/setgid, no
 * group/other write), its content's digest or its symlink's target.
 */
function tree(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const visit = (rel: string): void => {
    const path = join(root, rel);
    const stat = lstatSync(path);
    const mode = (stat.mode & 0o7777 & ~0o6022).toString(8);
    if (stat.isSymbolicLink()) out[rel] = `l -> ${readlinkSync(path)}`;
    else if (stat.isDirectory()) {
      out[rel] = `d ${mode}`;
      for (const name of readdirSync(path)) visit(rel === '' ? name : `${rel}/${name}`);
    } else if (stat.isFile()) out[rel] = `f ${mode} ${createHash('sha256').update(readFileSync(path)).digest('hex').slice(0, 16)}`;
    else out[rel] = `special ${stat.mode.toString(8)}`;
  };
  visit('');
  return out;
}

describe.skipIf(skip !== undefined)('OCI layers unpacked by tar, stacked by the resolver', () => {
  let dir: string;
  let provider: SandboxProvider;
  let sandboxDir: string;
  const open: Sandbox[] = [];
  let base: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'rs-layers-test-'));
    chmodSync(dir, 0o755);
    sandboxDir = join(dir, 'sandboxes');
    mkdirSync(sandboxDir, { mode: 0o755 });
    chmodSync(sandboxDir, 0o755);
    base = join(dir, 'rootfs');
    makeRootfs(base, { 'data/gone.txt': 'whited out\n', 'data/kept.txt': 'kept\n', 'opq/a': 'a\n', 'opq/sub/c': 'c\n', f2d: 'a file\n', 'd2f/x': 'x\n', 'keep/file': 'base\n' });
    execFileSync('ln', ['-s', 'data', join(base, 'link')]);
    chmodSync(join(base, 'data/kept.txt'), 0o600);
    provider = createBwrapProvider({ imageCacheDir: join(dir, 'cache'), tmpDir: sandboxDir });
  }, 120_000);

  closeImageSuite(() => ({ provider, dir, sandboxDir }), open);

  /** Resolves `image` into a cache of its own: its root's tree and how it was unpacked. */
  async function resolveTree(image: string, cache: string): Promise<{ rootfs: string; tree: Record<string, string>; unpackedWith: string }> {
    const resolver = createImageResolver();
    try {
      const resolved = await resolver.resolve(image, { cacheDir: cache });
      const record = JSON.parse(readFileSync(join(resolved.rootfs, '..', 'image.json'), 'utf8')) as { unpackedWith: string };
      return { rootfs: resolved.rootfs, tree: tree(resolved.rootfs), unpackedWith: record.unpackedWith };
    } finally {
      await resolver.close();
    }
  }

  /** What `umoci raw unpack --rootless` makes of the same image. */
  function umociTree(layout: string, tag: string): Record<string, string> {
    const out = join(dir, `umoci-${createHash('sha256').update(layout).digest('hex').slice(0, 8)}`);
    try {
      execFileSync('umoci', ['raw', 'unpack', '--rootless', '--image', `${layout}:${tag}`, out], { stdio: 'ignore' });
      return tree(out);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  }

  // layer 1: a whiteout, an opaque directory with a new entry, a file made a directory, a directory
  // made a file, a symlink made a directory, a directory's mode changed, whiteouts in a new directory
  const layer1 = makeTar([
    dirEntry('data'),
    file('data/.wh.gone.txt', ''),
    dirEntry('opq'),
    file('opq/.wh..wh..opq', ''),
    file('opq/new', 'new in layer 1\n'),
    dirEntry('f2d', 0o750),
    file('f2d/inner', 'inner\n'),
    file('d2f', 'was a directory\n'),
    dirEntry('link'),
    file('link/y', 'under what was a symlink\n'),
    dirEntry('keep', 0o700),
    dirEntry('added'),
    file('added/.wh.nothing', ''),
    dirEntry('added/deep'),
    file('added/deep/z', 'z\n', 0o640),
  ]);
  // layer 2: a whiteout of layer 1's directory, of something absent, of layer 1's new file; a
  // change to a file of the base; a directory made a symlink
  const layer2 = makeTar([
    file('.wh.f2d', ''),
    dirEntry('keep'),
    file('keep/.wh.missing', ''),
    file('keep/file', 'changed in layer 2\n'),
    dirEntry('opq'),
    file('opq/.wh.new', ''),
    file('opq/two', 'two\n'),
    file('.wh.d2f', ''),
    { name: 'd2f', type: 'symlink', target: 'keep' },
  ]);

  it('stacks tar, gzip and zstd layers as umoci does: whiteouts, opaque directories, replaced entries', async () => {
    const trees: Array<Record<string, string>> = [];
    for (const compression of [undefined, 'gzip', 'zstd'] as const) {
      const layout = join(dir, `layout-${compression ?? 'tar'}`);
      makeOciLayout(base, layout, { tag: 'v1', env: ['PATH=/bin'], extraLayers: [layer1, layer2], ...(compression === undefined ? {} : { compression }) });
      const ours = await resolveTree(`oci:${layout}:v1`, join(dir, `cache-${compression ?? 'tar'}`));
      expect(ours.unpackedWith, compression).toBe('tar');
      // (umoci 0.4 reads no zstd layer: that one against the others)
      expect(ours.tree, compression).toEqual(compression === 'zstd' ? trees[0] : umociTree(layout, 'v1'));
      trees.push(ours.tree);
      // what the layers did, spelled out
      expect(ours.tree['data/gone.txt']).toBeUndefined();
      expect(ours.tree['data/kept.txt']).toMatch(/^f 600 /);
      expect(Object.keys(ours.tree).filter((path) => path.startsWith('opq/')).sort()).toEqual(['opq/two']);
      expect(ours.tree.f2d).toBeUndefined();
      expect(ours.tree.d2f).toBe('l -> keep');
      expect(ours.tree.link).toBe('d 755');
      expect(ours.tree['link/y']).toMatch(/^f 644 /);
      expect(ours.tree.keep).toBe('d 755');
      expect(readFileSync(join(ours.rootfs, 'keep/file'), 'utf8')).toBe('changed in layer 2\n');
      expect(Object.keys(ours.tree).filter((path) => path.includes('.wh.'))).toEqual([]);
    }
    // and a sandbox on it sees the same
    const sandbox = await provider.create({ image: `oci:${join(dir, 'layout-zstd')}:v1` });
    open.push(sandbox);
    const seen = await sandbox.exec('cat /keep/file /link/y /d2f/file; ls /opq; ls /data; test -e /f2d || echo no-f2d');
    expect(seen.stderr).toBe('');
    expect(seen.stdout).toBe('changed in layer 2\nunder what was a symlink\nchanged in layer 2\ntwo\nkept.txt\nno-f2d\n');
  });

  it('splits a large uncompressed layer into runs for several tar processes: the same root as umoci makes', async () => {
    const root = join(dir, 'large-rootfs');
    makeRootfs(root, { 'data/marker': 'from the image\n' });
    // 2,600 files over 26 directories, a symlink, a hard link, modes
    for (let d = 0; d < 26; d++) {
      mkdirSync(join(root, 'many', `d${d}`), { recursive: true });
      for (let f = 0; f < 100; f++) writeFileSync(join(root, 'many', `d${d}`, `f${f}`), `file ${d}/${f}\n`);
    }
    chmodSync(join(root, 'many/d3/f7'), 0o750);
    chmodSync(join(root, 'many/d4'), 0o750);
    execFileSync('ln', ['-s', '../d0/f0', join(root, 'many/d1/link')]);
    execFileSync('ln', [join(root, 'many/d2/f2'), join(root, 'many/d2/hard')]);
    const layout = join(dir, 'layout-large');
    makeOciLayout(root, layout, { tag: 'v1', extraLayers: [makeTar([dirEntry('many'), dirEntry('many/d5'), file('many/d5/.wh.f5', ''), file('many/d5/f6', 'changed\n')])] });
    const ours = await resolveTree(`oci:${layout}:v1`, join(dir, 'cache-large'));
    expect(ours.unpackedWith).toMatch(/^tar \(layer 0 in [2-4] runs\)$/);
    expect(ours.tree).toEqual(umociTree(layout, 'v1'));
    expect(lstatSync(join(ours.rootfs, 'many/d2/hard')).ino).toBe(lstatSync(join(ours.rootfs, 'many/d2/f2')).ino);
    expect(ours.tree['many/d5/f5']).toBeUndefined();
    // a layer it may not split (a directory its owner cannot write) is one tar's
    chmodSync(join(root, 'many/d4'), 0o550);
    const layout2 = join(dir, 'layout-large-2');
    makeOciLayout(root, layout2, { tag: 'v1' });
    chmodSync(join(root, 'many/d4'), 0o750);
    const unsplit = await resolveTree(`oci:${layout2}:v1`, join(dir, 'cache-large-2'));
    expect(unsplit.unpackedWith).toBe('tar');
    expect(unsplit.tree).toEqual(umociTree(layout2, 'v1'));
    rmSync(root, { recursive: true, force: true });
  });

  describe('hostile layers', () => {
    let outside: string;
    let before: Record<string, string>;
    beforeAll(() => {
      // a directory the unpacking uid could write (so that a write through would show)
      outside = join(dir, 'outside');
      mkdirSync(outside, { mode: 0o777 });
      chmodSync(outside, 0o777);
      writeFileSync(join(outside, 'victim'), 'untouched\n', { mode: 0o666 });
      chmodSync(join(outside, 'victim'), 0o666);
      if (process.getuid?.() === 0) chownSync(outside, 65534, 65534);
      before = tree(outside);
    });

    // from a cache entry's staging directory (<dir>/<cache>/.tmp-*/layer-N) and its root
    // (<dir>/<cache>/.tmp-*/rootfs, then <dir>/<cache>/sha256-*/rootfs), `../../../outside` is it
    const attacks = (): Record<string, { layers: Buffer[]; tar: boolean }> => {
      const absolute = join(dir, 'outside');
      const relative = `../../../${'../'.repeat(12)}${absolute.slice(1)}`;
      return {
        // layer 1 plants symlinks out; layer 2 writes through them (with and without their directory entry)
        'write through a symlink of a lower layer': {
          tar: true,
          layers: [
            makeTar([{ name: 'a', type: 'symlink', target: absolute }, { name: 'b', type: 'symlink', target: '../../../outside' }, { name: 'c', type: 'symlink', target: relative }]),
            makeTar([dirEntry('a'), file('a/x', 'escaped\n'), file('b/x', 'escaped\n'), file('c/victim', 'escaped\n')]),
          ],
        },
        // layer 2 whites out through them
        'white out through a symlink of a lower layer': {
          tar: true,
          layers: [
            makeTar([{ name: 'a', type: 'symlink', target: absolute }, { name: 'b', type: 'symlink', target: '../../../outside' }]),
            makeTar([dirEntry('a'), file('a/.wh.victim', ''), file('b/.wh.victim', ''), file('b/.wh..wh..opq', '')]),
          ],
        },
        // a whiteout or a file named with `..`, an absolute name
        'names with ..': {
          tar: false,
          layers: [makeTar([dirEntry('d')]), makeTar([file('d/../../../outside/.wh.victim', ''), file('../../../outside/x', 'escaped\n'), file('/abs-outside', 'abs\n')])],
        },
        // hard links to the host's files and through a lower symlink
        'hard links out': {
          tar: false,
          layers: [makeTar([{ name: 'a', type: 'symlink', target: absolute }]), makeTar([{ name: 'h1', type: 'hardlink', target: `${absolute}/victim` }, { name: 'h2', type: 'hardlink', target: 'a/victim' }, { name: 'h3', type: 'hardlink', target: '../../../outside/victim' }])],
        },
        // a symlink in a layer, then a file under it in the same layer (tar's own guard)
        'write through a symlink of the same layer': {
          tar: false,
          layers: [makeTar([{ name: 's', type: 'symlink', target: absolute }, file('s/x', 'escaped\n')])],
        },
      };
    };

    it('nothing is written, removed or linked outside the root: refused (422) or neutralised', async () => {
      let n = 0;
      for (const [name, attack] of Object.entries(attacks())) {
        const layout = join(dir, `hostile-${n}`);
        makeOciLayout(base, layout, { tag: 'v1', env: ['PATH=/bin'], extraLayers: attack.layers });
        const cache = join(dir, `cache-hostile-${n++}`);
        let outcome: { unpackedWith: string; tree: Record<string, string> } | unknown;
        try {
          outcome = await resolveTree(`oci:${layout}:v1`, cache);
        } catch (error) {
          outcome = error;
        }
        expect(tree(outside), name).toEqual(before);
        expect(readdirSync(dir).filter((entry) => entry.startsWith('abs') || entry === 'x'), name).toEqual([]);
        if (RolloutError.isInstance(outcome)) {
          expect(outcome.status, name).toBe(422);
          continue;
        }
        const ours = outcome as { unpackedWith: string; tree: Record<string, string> };
        // the cross-layer cases are the stacking's to stop (tar takes each layer alone)
        if (attack.tar) expect(ours.unpackedWith, name).toBe('tar');
        else expect(ours.unpackedWith, name).toMatch(/^umoci \(tar: /);
        // a sandbox on it starts, and sees the image's files
        const sandbox = await provider.create({ image: `oci:${layout}:v1` });
        open.push(sandbox);
        expect((await sandbox.exec('cat /data/kept.txt')).stdout, name).toBe('kept\n');
      }
      // a write through a lower symlink lands in a directory of the root that replaced it
      const first = await resolveTree(`oci:${join(dir, 'hostile-0')}:v1`, join(dir, 'cache-hostile-0'));
      expect(first.tree.a).toBe('d 755');
      expect(readFileSync(join(first.rootfs, 'a/x'), 'utf8')).toBe('escaped\n');
      expect(first.tree.b).toBe('d 755');
    });

    it.skipIf(process.getuid?.() !== 0)('an unprivileged service (uid 65534, unpacking as itself) is kept inside the root the same way', () => {
      const own = join(dir, 'as-nobody');
      mkdirSync(join(own, 'sandboxes'), { recursive: true });
      execFileSync('chown', ['-R', '65534:65534', own]);
      const tsx = join(__dirname, '../../node_modules/.bin/tsx');
      const names = Object.keys(attacks());
      for (let n = 0; n < names.length; n++) {
        const probe = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', tsx, join(__dirname, 'image-probe.ts'), join(own, `cache-${n}`), join(own, 'sandboxes'), `oci:${join(dir, `hostile-${n}`)}:v1`], {
          encoding: 'utf8',
          env: { ...process.env, HOME: own },
        });
        // refused (a 422 thrown by the probe) or started; either way nothing outside changed
        expect(probe.status === 0 || /UNPROCESSABLE|422|cannot unpack/.test(probe.stderr), `${names[n]}: ${probe.stderr}`).toBe(true);
        expect(tree(outside), names[n]).toEqual(before);
      }
      expect(readdirSync(join(own, 'sandboxes'))).toEqual([]);
    });
  });
});
