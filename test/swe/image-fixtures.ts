import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { HOSTILE_ENTRIES, hostilePseudoArgs, makeOciLayout, makeTar } from '../sandbox/image-fixtures.ts';
import type { SweFixture } from './fixtures.ts';

/*
 * A SWE-bench-like image made from the host's own files: a merged-/usr root filesystem with the
 * shells and tools the SWE scripts and tools run (sh, bash, stty, tar, git, patch, a few
 * coreutils), Debian's python3 with the modules of its standard library and dist-packages that
 * `python3 -m pytest` loads (found by running it on the host), each binary's and extension
 * module's shared libraries as `ldd` names them, and a repository at /testbed as SWE-bench's
 * images have it: a clone with its whole history (the fix commit after base_commit included, in
 * the reflog) reset to base_commit, and a conda-style env at /opt/miniconda3/envs/testbed whose
 * bin/ (python, pytest) is not on the image's PATH. Packed as an OCI image layout and as a squashfs.
 */

const PYTHON = '/usr/bin/python3';
const TOOLS = ['dash', 'bash', 'stty', 'cat', 'ls', 'mkdir', 'rm', 'cp', 'mv', 'dirname', 'env', 'id', 'head', 'tail', 'touch', 'wc', 'grep', 'find', 'tar', 'git', 'patch'];
/** The module whose presence shows that `python3` is the image's. */
export const IMAGE_MARKER_MODULE = 'rollserve_image_marker';
export const IMAGE_MARKER = 'python from the SWE test image';
/** Where SWE-bench's images keep the repository's environment (`conda activate testbed`). */
export const CONDA_ENV = '/opt/miniconda3/envs/testbed';

// A probe run by the host's python: tests that pass, fail (ints and strings, so that pytest's
// diffs run), raise, are parametrized, in a class and a unittest.TestCase, reported with -rA.
const PROBE_TESTS = `import unittest

import pytest


@pytest.mark.parametrize("x", [1, 2])
def test_x(x):
    assert x == 1


@pytest.mark.parametrize("text", ["a b", "é!"])
def test_ids(text):
    assert text


def test_text():
    assert "a\\nb\\nc" == "a\\nB\\nc"


class TestC:
    def test_raises(self):
        with pytest.raises(KeyError):
            {}["k"]


class Case(unittest.TestCase):
    def test_equal(self):
        self.assertEqual([1, 2], [1, 3])
`;

/** Runs `python3 -m pytest` on the probe and writes what it loaded to found.json. */
const PROBE_SCRIPT = String.raw`import encodings, importlib.util, json, os, re, runpy, sys, sysconfig
stdlib = sysconfig.get_path('stdlib')
startup = set(sys.modules)
sys.argv = ['pytest', '-rA', 'test_probe.py']
try:
    runpy.run_module('pytest', run_name='__main__', alter_sys=True)
except SystemExit:
    pass
import pytest.__main__  # it ran as __main__ above, so it is not in sys.modules
files = set()
def add(f):
    files.add(f)
    if f.endswith('.py') and os.path.exists(importlib.util.cache_from_source(f)):
        files.add(importlib.util.cache_from_source(f))
for name, m in list(sys.modules.items()):
    f = getattr(m, '__file__', None) or ''
    packages = re.match(r'(/usr/(?:local/)?lib/python3[^/]*/(?:dist|site)-packages)/([^/]+)', f)
    if packages:
        # whole packages (plugins, parts imported only on some paths); what the host's .pth files
        # loaded at startup is not pytest's
        if name in startup:
            continue
        top = os.path.join(*packages.groups())
        for d, _, names in os.walk(top) if os.path.isdir(top) else [(None, None, [top])]:
            for n in names:
                if n.endswith(('.py', '.pyc', '.so')):
                    files.add(n if d is None else os.path.join(d, n))
    elif f.startswith(stdlib + '/'):
        add(f)
# codecs are looked up by name when used (unicode_escape for test ids): all of them
for n in os.listdir(os.path.dirname(encodings.__file__)):
    if n.endswith('.py'):
        add(os.path.join(os.path.dirname(encodings.__file__), n))
json.dump({'stdlib': stdlib, 'files': sorted(files)}, open('found.json', 'w'))
`;

/**
 * What the image's python needs, found by running `python3 -m pytest` on the host: the files of
 * the standard library modules and extension modules it loads (all the codecs: they are looked up
 * by name) and the whole dist-packages packages it imports from, with their bytecode caches.
 */
function pythonFiles(): { stdlib: string; files: string[] } {
  const probe = mkdtempSync(join(tmpdir(), 'rollserve-swe-probe-'));
  try {
    writeFileSync(join(probe, 'test_probe.py'), PROBE_TESTS);
    execFileSync(PYTHON, ['-c', PROBE_SCRIPT], { cwd: probe, stdio: 'ignore', env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' } });
    return JSON.parse(readFileSync(join(probe, 'found.json'), 'utf8')) as { stdlib: string; files: string[] };
  } finally {
    rmSync(probe, { recursive: true, force: true });
  }
}

/** The shared libraries `ldd` names for `files`. */
function sharedLibraries(files: readonly string[]): string[] {
  const out = execFileSync('ldd', [...files], { encoding: 'utf8', maxBuffer: 16 << 20 });
  return [...new Set([...out.matchAll(/(\/\S+) \(0x[0-9a-f]+\)/g)].map((m) => m[1]!))];
}

/**
 * Copies host files to the same paths under `root`: a library keeps its soname, its directory is
 * resolved (/lib is /usr/lib here); modes and mtimes are kept, so Python's bytecode caches stay valid.
 */
function copyFiles(root: string, files: readonly string[]): void {
  for (const file of files) {
    const to = join(root, realpathSync(dirname(file)), basename(file));
    if (existsSync(to)) continue;
    mkdirSync(dirname(to), { recursive: true });
    copyFileSync(file, to);
    const stat = statSync(file);
    chmodSync(to, stat.mode & 0o777);
    utimesSync(to, stat.atime, stat.mtime);
  }
}

export interface SweImageRootfs {
  /** Bytes of the root filesystem. */
  bytes: number;
  /** Files in it. */
  files: number;
}

/** Builds the root filesystem in `root` (a new directory); `testbed` is a repository whose base_commit tree goes to /testbed. */
export function makeSweRootfs(root: string, testbed?: SweFixture): SweImageRootfs {
  mkdirSync(root, { recursive: true });
  for (const dir of ['usr/bin', 'usr/lib', 'usr/lib64', 'usr/sbin', 'etc', 'tmp', 'testbed', 'workspace']) mkdirSync(join(root, dir), { recursive: true });
  chmodSync(join(root, 'tmp'), 0o1777);
  for (const link of ['bin', 'lib', 'lib64', 'sbin']) symlinkSync(`usr/${link}`, join(root, link));

  const tools = TOOLS.map((tool) => `/usr/bin/${tool}`).filter((path) => existsSync(path));
  const python = pythonFiles();
  const interpreter = realpathSync(PYTHON);
  copyFiles(root, [...tools, interpreter]);
  symlinkSync('dash', join(root, 'usr/bin/sh'));
  symlinkSync(basename(interpreter), join(root, 'usr/bin/python3'));

  // os.py is the landmark python finds its prefix by, lib-dynload its exec_prefix
  copyFiles(root, [...python.files, join(python.stdlib, 'os.py')]);
  mkdirSync(join(root, python.stdlib, 'lib-dynload'), { recursive: true });
  // git init makes .git/info from its templates
  const templates = '/usr/share/git-core/templates';
  if (existsSync(templates)) cpSync(templates, join(root, templates), { recursive: true, preserveTimestamps: true });
  copyFiles(root, sharedLibraries([...tools, interpreter, ...python.files.filter((file) => file.endsWith('.so'))]));

  writeFileSync(join(root, python.stdlib, `${IMAGE_MARKER_MODULE}.py`), `WHERE = ${JSON.stringify(IMAGE_MARKER)}\n`);
  writeFileSync(join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n');
  writeFileSync(join(root, 'etc/group'), 'root:x:0:\nnogroup:x:65534:\n');
  if (testbed !== undefined) {
    // as SWE-bench's images make /testbed: a clone (the whole history, the fix commit after base
    // included), reset to base_commit, the remote removed; the fix stays in the reflog and objects
    rmSync(join(root, 'testbed'), { recursive: true });
    const git = (...args: string[]) => execFileSync('git', args, { stdio: 'ignore', env: { ...process.env, GIT_CONFIG_NOSYSTEM: '1', HOME: root } });
    git('clone', '-q', '--no-hardlinks', '-o', 'origin', testbed.repoPath, join(root, 'testbed'));
    git('-C', join(root, 'testbed'), 'reset', '-q', '--hard', testbed.baseCommit);
    git('-C', join(root, 'testbed'), 'remote', 'remove', 'origin');
    // SWE-bench's conda env, not on the image's PATH: its eval script activates it (`pytest` only
    // there), the repository installed in it in development mode (pip's .pth); here a venv of the
    // image's python that sees its packages
    const env = join(root, CONDA_ENV);
    const bin = join(env, 'bin');
    const sitePackages = join(env, 'lib', basename(interpreter), 'site-packages');
    mkdirSync(bin, { recursive: true });
    mkdirSync(sitePackages, { recursive: true });
    writeFileSync(join(env, 'pyvenv.cfg'), 'home = /usr/bin\ninclude-system-site-packages = true\n');
    writeFileSync(join(sitePackages, '__editable__.testbed.pth'), '/testbed\n');
    symlinkSync(`/usr/bin/${basename(interpreter)}`, join(bin, 'python'));
    symlinkSync('python', join(bin, 'python3'));
    writeFileSync(join(bin, 'pytest'), `#!${CONDA_ENV}/bin/python\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n`, { mode: 0o755 });
  }
  return measureRootfs(root);
}

function measureRootfs(root: string): SweImageRootfs {
  const [bytes, files] = execFileSync('sh', ['-c', 'du -sb "$1" | cut -f1; find "$1" -type f | wc -l', 'sh', root], { encoding: 'utf8' }).trim().split('\n').map(Number);
  return { bytes: bytes!, files: files! };
}

/** Bulk that makes the image the size of a SWE-bench one (`pnpm bench swe`): files of Python-like text. */
export interface SwePadding {
  /** Files added to /testbed and committed in its repository, as a large repository's are. */
  repoFiles: number;
  /** Files added to the conda env's site-packages (its libraries). */
  envFiles: number;
  /** Bytes of each file. */
  fileBytes: number;
}

function padSweRootfs(root: string, padding: SwePadding): void {
  const text = (seed: number): string => {
    let out = '';
    for (let i = 0; out.length < padding.fileBytes; i++) out += `def function_${seed}_${i}(value, other=${(seed * 31 + i) % 997}):\n    return value * other + ${i}\n\n`;
    return out.slice(0, padding.fileBytes);
  };
  const add = (dir: string, count: number, prefix: string): void => {
    for (let i = 0; i < count; i++) {
      const sub = join(dir, `pkg_${Math.floor(i / 100)}`);
      if (i % 100 === 0) mkdirSync(sub, { recursive: true });
      writeFileSync(join(sub, `${prefix}_${i}.py`), text(i));
    }
  };
  add(join(root, 'testbed', 'padding'), padding.repoFiles, 'module');
  // tracked, as a large repository's files are (its HEAD then is a commit after base_commit)
  const git = (...args: string[]) => execFileSync('git', ['-C', join(root, 'testbed'), '-c', 'user.name=padding', '-c', 'user.email=padding@localhost', ...args], { stdio: 'ignore', env: { ...process.env, GIT_CONFIG_NOSYSTEM: '1', HOME: root } });
  git('add', 'padding');
  git('commit', '-q', '-m', 'padding');
  // packed, as a clone's objects are
  git('repack', '-a', '-d', '-q');
  add(join(root, CONDA_ENV, 'lib', 'site-packages-padding'), padding.envFiles, 'lib');
}

/** A squashfs of `root` (uncompressed: mksquashfs and unsquashfs are fastest so). */
export function makeUncompressedSquashfs(root: string, file: string): void {
  execFileSync('mksquashfs', [root, file, '-noappend', '-quiet', '-no-progress', '-all-root', '-noI', '-noD', '-noF', '-noX', ...hostilePseudoArgs()], { stdio: 'ignore' });
}

/** SWE-bench's image name of an instance (`__` spelled `_1776_`). */
export const sweImageName = (instanceId: string): string => `sweb.eval.x86_64.${instanceId.replaceAll('__', '_1776_')}`;

export interface SweImages {
  dir: string;
  rootfs: SweImageRootfs;
  /** The OCI image layout (tagged with the testbed instance's SWE-bench image name). */
  ociLayout: string;
  /**
   * With `layered`: the same image in layers as SWE-bench builds its images (base: the system;
   * env: the conda env; instance: /testbed; then the hostile layer), same tag.
   */
  ociLayered?: string;
  /** The squashfs, named `<SWE-bench image name>.sqfs`. */
  squashfs: string;
  /** `image_template`s that name the two images, as SWE-bench's config names its images. */
  templates: { oci: string; squashfs: string };
  /** Seconds spent building and packing. */
  timings: { rootfs: number; oci: number; squashfs: number };
  close(): void;
}

/**
 * Builds the image once in a new temp dir (searchable by the sandbox uid: the sandboxes'
 * directories below it are reached as that uid) as an OCI layout and a squashfs, both also
 * carrying what a hostile image would under /hostile (HOSTILE_ENTRIES: device nodes, a fifo,
 * setuid/setgid files, world-writable ones), which sealing must keep from every sandbox.
 */
export function buildSweImages(testbed: SweFixture, options: { padding?: SwePadding; layered?: boolean } = {}): SweImages {
  const dir = mkdtempSync(join(tmpdir(), 'rollserve-swe-images-'));
  try {
    chmodSync(dir, 0o755);
    const rootDir = join(dir, 'rootfs');
    const name = sweImageName(String(testbed.row.instance_id));
    const time = <T>(run: () => T): [T, number] => {
      const started = performance.now();
      const value = run();
      return [value, Math.round(performance.now() - started) / 1000];
    };
    const [rootfs, rootfsTime] = time(() => {
      makeSweRootfs(rootDir, testbed);
      if (options.padding !== undefined) padSweRootfs(rootDir, options.padding);
      return measureRootfs(rootDir);
    });
    const ociLayout = join(dir, 'oci');
    const [, ociTime] = time(() => makeOciLayout(rootDir, ociLayout, { tag: name, env: ['PATH=/opt/miniconda3/bin:/usr/local/bin:/usr/bin:/bin', 'LANG=C.UTF-8'], workdir: '/testbed', extraLayers: [makeTar(HOSTILE_ENTRIES)] }));
    let ociLayered: string | undefined;
    if (options.layered === true) {
      ociLayered = join(dir, 'oci-layered');
      const subtree = (path: string): Buffer => execFileSync('tar', ['-C', rootDir, '--numeric-owner', '--sort=name', '-cf', '-', path], { maxBuffer: 512 * 1024 * 1024 });
      const env = `.${dirname(CONDA_ENV)}`;
      makeOciLayout(rootDir, ociLayered, {
        tag: name,
        env: ['PATH=/opt/miniconda3/bin:/usr/local/bin:/usr/bin:/bin', 'LANG=C.UTF-8'],
        workdir: '/testbed',
        exclude: [env, './testbed'],
        extraLayers: [subtree(env), subtree('./testbed'), makeTar(HOSTILE_ENTRIES)],
      });
    }
    const squashfs = join(dir, `${name}.sqfs`);
    const [, squashfsTime] = time(() => makeUncompressedSquashfs(rootDir, squashfs));
    rmSync(rootDir, { recursive: true, force: true });
    return {
      dir,
      rootfs,
      ociLayout,
      ...(ociLayered === undefined ? {} : { ociLayered }),
      squashfs,
      templates: { oci: `oci:${ociLayout}:sweb.eval.x86_64.{instance_id_1776}`, squashfs: `squashfs:${dir}/sweb.eval.x86_64.{instance_id_1776}.sqfs` },
      timings: { rootfs: rootfsTime, oci: ociTime, squashfs: squashfsTime },
      close: () => rmSync(dir, { recursive: true, force: true }),
    };
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
}

export interface SweImageSet {
  dir: string;
  /** `n` squashfs images of one root (each with its own /etc/rollserve-image), `<dir>/image-<i>.sqfs`. */
  files: string[];
  close(): void;
}

/**
 * `n` distinct images of the testbed (one root filesystem built once, packed `n` times with a
 * file of its own in each, so each is a cache entry and an unpack of its own): many images on
 * one host without building the root `n` times.
 */
export function buildSweImageSet(testbed: SweFixture, n: number): SweImageSet {
  const dir = mkdtempSync(join(tmpdir(), 'rollserve-swe-image-set-'));
  try {
    chmodSync(dir, 0o755);
    const root = join(dir, 'rootfs');
    makeSweRootfs(root, testbed);
    const files = Array.from({ length: n }, (_, i) => {
      writeFileSync(join(root, 'etc/rollserve-image'), `image ${i}\n`);
      const file = join(dir, `image-${i}.sqfs`);
      makeUncompressedSquashfs(root, file);
      return file;
    });
    rmSync(root, { recursive: true, force: true });
    return { dir, files, close: () => rmSync(dir, { recursive: true, force: true }) };
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
}
