import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  apptainerLimits,
  buildExecArgv,
  buildInstanceStartArgv,
  buildInstanceStopArgv,
  createApptainerProvider,
  findApptainerBinary,
  normalizeImage,
} from './index.ts';
import { limitWrapper, resolveSandboxSpec, serviceHardLimit } from '../limits.ts';
import { sifKey } from './sif-cache.ts';

// Behavioural tests of a real instance are in test/sandbox/providers.test.ts (skipped with the
// reason printed where no binary exists); here, the exact command lines.
describe('apptainer command lines', () => {
  const base = {
    binary: '/opt/apptainer/bin/apptainer',
    image: '/images/python.sif',
    name: 'rollserve-rs-1',
    workspaceHost: '/tmp/rollserve-rs-1/workspace',
    workdir: '/workspace',
    socketHost: '/tmp/rollserve-rs-1/sock',
    network: false,
    resources: resolveSandboxSpec().resources,
  };

  it('starts an instance contained, with a writable tmpfs, no home and no network', () => {
    expect(buildInstanceStartArgv(base)).toEqual([
      '/opt/apptainer/bin/apptainer', 'instance', 'start', '--containall', '--writable-tmpfs', '--no-home',
      '--net', '--network', 'none',
      '--bind', '/tmp/rollserve-rs-1/workspace:/workspace',
      '--bind', '/tmp/rollserve-rs-1/sock:/run/rollserve',
      '/images/python.sif', 'rollserve-rs-1',
    ]);
  });

  it('keeps the network when asked, adds binds, the cgroup limits and extra args, normalises images', () => {
    const argv = buildInstanceStartArgv({
      ...base,
      image: 'python:3.12-slim',
      network: true,
      binds: [{ host: '/data', sandbox: '/data', readOnly: true }],
      resources: resolveSandboxSpec({ resources: { totalMemoryMib: 2048, maxProcesses: 36, cpus: 2 } }).resources,
      applyResourceLimits: true,
      extraStartArgs: ['--fakeroot'],
    });
    expect(argv).not.toContain('--net');
    expect(argv).toEqual([
      '/opt/apptainer/bin/apptainer', 'instance', 'start', '--containall', '--writable-tmpfs', '--no-home',
      '--bind', '/tmp/rollserve-rs-1/workspace:/workspace',
      '--bind', '/tmp/rollserve-rs-1/sock:/run/rollserve',
      '--bind', '/data:/data:ro',
      '--memory', '2048M', '--memory-swap', '2048M', '--pids-limit', '100', '--cpus', '2',
      '--fakeroot', 'docker://python:3.12-slim', 'rollserve-rs-1',
    ]);
    expect(buildInstanceStartArgv(base).join(' ')).not.toMatch(/--memory|--pids-limit|--cpus/);
  });

  it('execs in the instance and stops it', () => {
    expect(buildExecArgv({ binary: 'singularity', name: 'n', cwd: '/w', envFile: '/s/1.env', command: ['sh', '-c', 'echo hi'] })).toEqual([
      'singularity', 'exec', '--pwd', '/w', '--env-file', '/s/1.env', 'instance://n', 'sh', '-c', 'echo hi',
    ]);
    expect(buildExecArgv({ binary: 'apptainer', name: 'n', extraExecArgs: ['--fakeroot'], command: ['true'] })).toEqual([
      'apptainer', 'exec', '--fakeroot', 'instance://n', 'true',
    ]);
    expect(buildInstanceStopArgv('apptainer', 'n')).toEqual(['apptainer', 'instance', 'stop', 'n']);
  });

  it('normalises image references like NeMo Gym', () => {
    expect(normalizeImage('ubuntu')).toBe('docker://ubuntu');
    expect(normalizeImage('nvcr.io/nvidia/pytorch:24.01')).toBe('docker://nvcr.io/nvidia/pytorch:24.01');
    expect(normalizeImage('docker://python:3.12')).toBe('docker://python:3.12');
    expect(normalizeImage('oras://ghcr.io/x/y:1')).toBe('oras://ghcr.io/x/y:1');
    expect(normalizeImage('/images/python.sif')).toBe('/images/python.sif');
    expect(normalizeImage('python.sif')).toBe('python.sif');
    expect(normalizeImage('/images/rootfs')).toBe('/images/rootfs');
  });

  it("keeps apptainer's local transports on a path (the bwrap provider's names), a sif: reference as its path", () => {
    expect(normalizeImage('oci:/images/layout:latest')).toBe('oci:/images/layout:latest');
    expect(normalizeImage('oci-archive:./image.tar')).toBe('oci-archive:./image.tar');
    expect(normalizeImage('docker-archive:/images/image.tar')).toBe('docker-archive:/images/image.tar');
    expect(normalizeImage('sif:/images/python.sif')).toBe('/images/python.sif');
    // a registry name that only looks like one stays a registry name
    expect(normalizeImage('oci:latest')).toBe('docker://oci:latest');
  });

  it('applies rlimits inside the instance with a POSIX sh wrapper', () => {
    const [sh, flag, script] = limitWrapper({ memoryMib: 10, maxFileSizeMib: 1, cpuSeconds: 2, maxOpenFiles: 50 });
    expect([sh, flag]).toEqual(['/bin/sh', '-c']);
    expect(script).toContain('ulimit -v 10240');
    expect(script).toContain('ulimit -f 2048');
    expect(script).toContain('ulimit -t 2');
    expect(script).toContain('ulimit -n 50');
    expect(script).toContain('exec "$@"');
  });
});

describe('findApptainerBinary', () => {
  it('finds apptainer or singularity in a bin dir, apptainer first', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rs-appt-'));
    try {
      expect(findApptainerBinary({ binDir: dir })).toBeUndefined();
      writeFileSync(join(dir, 'singularity'), '#!/bin/sh\n');
      chmodSync(join(dir, 'singularity'), 0o755);
      expect(findApptainerBinary({ binDir: dir })).toBe(join(dir, 'singularity'));
      writeFileSync(join(dir, 'apptainer'), '#!/bin/sh\n');
      expect(findApptainerBinary({ binDir: dir })).toBe(join(dir, 'apptainer'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('fails create clearly without a binary', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rs-appt-'));
    try {
      await expect(createApptainerProvider({ binDir: dir }).create({ image: 'x.sif' })).rejects.toThrow(/neither apptainer nor singularity/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/**
 * A stand-in `apptainer` in a new directory that logs its argv and runs exec'd commands on the
 * host with the env file only (no apptainer is installable here: the flags are checked at the
 * argument level, the rlimit wrapper for real on the host). `build <sif> <source>` writes a
 * SIF-named file saying its source (a source naming `broken` fails), logs `built <source>` when
 * done, and waits first while the file `hold-builds` of its directory exists.
 */
function fakeApptainer(): { dir: string; log: string } {
  const dir = mkdtempSync(join(tmpdir(), 'rs-fake-appt-'));
  const log = join(dir, 'calls.log');
  const state = join(dir, 'instances');
  writeFileSync(
    join(dir, 'apptainer'),
    `#!/bin/sh
printf '%s\\n' "$*" >> ${log}
if [ "$1" = build ]; then
  while [ -e ${dir}/hold-builds ]; do sleep 0.05; done
  case "$3" in *broken*) echo "FATAL: While making image from oci registry: $3 not found" >&2; exit 255 ;; esac
  sleep 0.2
  printf 'SIF of %s\\n' "$3" > "$2"
  printf 'built %s\\n' "$3" >> ${log}
  exit 0
fi
case "$1 $2" in
  "instance start") for last; do :; done; echo "$last" >> ${state}; exit 0 ;;
  "instance stop") grep -v "^$3\\$" ${state} > ${state}.new; mv ${state}.new ${state}; exit 0 ;;
  "instance list") printf '{"instances":['; sep=''; while read -r n; do printf '%s{"instance":"%s"}' "$sep" "$n"; sep=,; done < ${state}; printf ']}\\n'; exit 0 ;;
esac
shift
envfile=''
while [ $# -gt 0 ]; do
  case "$1" in
    --env-file) envfile="$2"; shift 2 ;;
    --pwd) shift 2 ;;
    instance://*) shift; break ;;
    *) shift ;;
  esac
done
exec env -i sh -c 'set -a; . "$0"; set +a; exec "$@"' "$envfile" "$@"
`,
  );
  chmodSync(join(dir, 'apptainer'), 0o755);
  return { dir, log };
}

describe('apptainer provider against a fake binary', () => {
  it('starts, probes, execs with a clean env file, reports status and stops the instance', async () => {
    const { dir, log } = fakeApptainer();
    process.env.ROLLSERVE_FAKE_SECRET = 'leak'; // the service's environment must not reach commands
    try {
      const provider = createApptainerProvider({ binDir: dir, tmpDir: dir });
      const sandbox = await provider.create({ image: 'python:3.12-slim', env: { FROM_SPEC: 'yes' } });
      expect(await sandbox.status()).toBe('running');
      const result = await sandbox.exec('echo "$FROM_SPEC $FROM_CALL"; echo "secret=$ROLLSERVE_FAKE_SECRET"', {
        env: { FROM_CALL: 'call' },
        cwd: '/',
      });
      expect(result).toEqual({ stdout: 'yes call\nsecret=\n', stderr: '', returnCode: 0 });
      await sandbox.close();
      expect(await sandbox.status()).toBe('stopped');
      const calls = (await import('node:fs')).readFileSync(log, 'utf8');
      const name = `rollserve-${sandbox.id}`;
      expect(calls).toMatch(
        new RegExp(`^instance start --containall --writable-tmpfs --no-home --net --network none --bind \\S+/workspace:/workspace --bind \\S+/sock:/run/rollserve docker://python:3.12-slim ${name}\\n`),
      );
      expect(calls).toMatch(new RegExp(`\\nexec --env-file \\S+\\.env instance://${name} /bin/sh -c ulimit -c 0 .*ulimit -v 4194304 .*ulimit -n 1024 `));
      // no cgroup asked for: nothing whole-instance is passed, and the per-process memory is not one
      expect(calls).not.toContain('--memory');
      expect(calls).toContain('printf apptainer-sandbox-ready');
      expect(calls.trim().endsWith(`\ninstance stop ${name}`)).toBe(true);
    } finally {
      delete process.env.ROLLSERVE_FAKE_SECRET;
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('apptainer limits', () => {
  it('keeps the per-process limits with ulimit, and the whole-instance ones only with a cgroup', () => {
    expect(Object.keys(apptainerLimits()).sort()).toEqual(['cpuSeconds', 'maxFileSizeMib', 'maxOpenFiles', 'memoryMib']);
    expect(Object.keys(apptainerLimits({ applyResourceLimits: true })).sort()).toEqual(
      ['cpuSeconds', 'cpus', 'maxFileSizeMib', 'maxOpenFiles', 'maxProcesses', 'memoryMib', 'totalMemoryMib'],
    );
  });

  it('refuses, before starting anything, a spec giving a limit it cannot keep', async () => {
    const { dir, log } = fakeApptainer();
    try {
      const plain = createApptainerProvider({ binDir: dir, tmpDir: dir });
      for (const [limit, resources] of [
        ['totalMemoryMib (total_memory_mib)', { totalMemoryMib: 512 }],
        ['maxProcesses (max_processes)', { maxProcesses: 64 }],
        ['cpus', { cpus: 2 }],
        ['workspaceMib (workspace_mib)', { workspaceMib: 64 }],
        ['tmpMib (tmp_mib)', { tmpMib: 64 }],
        ['maxInodes (max_inodes)', { maxInodes: 1000 }],
        ['outputMib (output_mib)', { outputMib: 8 }],
      ] as const) {
        await expect(plain.create({ image: 'x.sif', resources })).rejects.toThrow(`the apptainer sandbox provider cannot keep the limit ${limit}`);
      }
      const withCgroup = createApptainerProvider({ binDir: dir, tmpDir: dir, applyResourceLimits: true });
      await expect(withCgroup.create({ image: 'x.sif', resources: { workspaceMib: 64 } })).rejects.toThrow(/cannot keep the limit workspaceMib/);
      expect(existsSync(log)).toBe(false); // no instance was started for any of them
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('passes the whole-instance limits to the cgroup and the per-process ones to ulimit, each where it belongs', async () => {
    const { dir, log } = fakeApptainer();
    try {
      const provider = createApptainerProvider({ binDir: dir, tmpDir: dir, applyResourceLimits: true });
      const sandbox = await provider.create({
        image: 'x.sif',
        resources: { totalMemoryMib: 512, memoryMib: 256, maxProcesses: 40, cpus: 1.5, maxOpenFiles: 48 },
      });
      // the wrapper runs for real here (the stand-in execs on the host): the limits hold
      const limits = await sandbox.exec('grep -E "Max (open files|address space)" /proc/self/limits', { cwd: '/' });
      expect(limits.stdout).toMatch(/Max address space\s+268435456\s+268435456/);
      expect(limits.stdout).toMatch(/Max open files\s+48\s+48/);
      await sandbox.close();
      const calls = readFileSync(log, 'utf8');
      expect(calls).toMatch(/^instance start .* --memory 512M --memory-swap 512M --pids-limit 104 --cpus 1\.5 x\.sif /);
      expect(calls).toMatch(/\nexec .*ulimit -v 262144 .*ulimit -n 48 /);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses an open-files limit above the service\'s own hard limit', async () => {
    const { dir } = fakeApptainer();
    try {
      const hard = serviceHardLimit('Max open files');
      if (hard === undefined) return;
      await expect(createApptainerProvider({ binDir: dir, tmpDir: dir }).create({ image: 'x.sif', resources: { maxOpenFiles: hard + 1 } })).rejects.toThrow(
        `cannot keep the limit maxOpenFiles (max_open_files) of ${hard + 1}: the service's own hard limit is ${hard}`,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// Prefetch against the stand-in only (no apptainer here): what is checked is the provider's side,
// the builds it asks for, when, how many at once, and the SIF the instance is started from.
describe('apptainer prefetch: images built to SIF once, ahead of their first use', () => {
  const sifEntries = (cache: string): string[] => (existsSync(join(cache, 'sif')) ? readdirSync(join(cache, 'sif')).filter((name) => /^sha256-[0-9a-f]{64}$/.test(name)).sort() : []);
  const uses = (cache: string, entry: string): string[] => (existsSync(join(cache, 'sif', '.uses', entry)) ? readdirSync(join(cache, 'sif', '.uses', entry)) : []);
  const lines = (log: string, pattern: RegExp): string[] => (existsSync(log) ? readFileSync(log, 'utf8').split('\n').filter((line) => pattern.test(line)) : []);
  const leftovers = (cache: string): string[] => readdirSync(join(cache, 'sif')).filter((name) => name.startsWith('.tmp-') || name.endsWith('.lock'));

  it('builds a registry image once into the cache, whoever asks, and starts its instances from the SIF, held while they run', async () => {
    const { dir, log } = fakeApptainer();
    const cache = join(dir, 'cache');
    try {
      // two providers over one cache: two processes of one host, as far as the cache's files go
      const first = createApptainerProvider({ binDir: dir, tmpDir: dir, imageCacheDir: cache });
      const second = createApptainerProvider({ binDir: dir, tmpDir: dir, imageCacheDir: cache });
      await Promise.all([first.prefetch!({ image: 'python:3.12-slim' }), first.prefetch!({ image: 'docker://python:3.12-slim' }), second.prefetch!({ image: 'python:3.12-slim' })]);
      await first.prefetch!({ image: 'python:3.12-slim' });
      const builds = lines(log, /^build /);
      expect(builds).toHaveLength(1);
      expect(builds[0]).toMatch(new RegExp(`^build ${cache}/sif/\\.tmp-sha256-[0-9a-f]{64}-[0-9a-f]{12}/image\\.sif docker://python:3\\.12-slim$`));
      const [entry] = sifEntries(cache);
      expect(sifEntries(cache)).toHaveLength(1);
      expect(readFileSync(join(cache, 'sif', entry!, 'image.sif'), 'utf8')).toBe('SIF of docker://python:3.12-slim\n');
      expect(leftovers(cache)).toEqual([]);

      const sandbox = await second.create({ image: 'python:3.12-slim' });
      expect(lines(log, /^instance start /).at(-1)).toMatch(new RegExp(` ${cache}/sif/${entry}/image\\.sif rollserve-${sandbox.id}$`));
      expect(uses(cache, entry!)).toHaveLength(1);
      expect((await sandbox.exec('echo up', { cwd: '/' })).stdout).toBe('up\n');
      await sandbox.close();
      expect(uses(cache, entry!)).toEqual([]);

      // an image nobody prefetched starts from its source, as apptainer alone would
      const other = await first.create({ image: 'docker://other:1' });
      expect(lines(log, /^instance start /).at(-1)).toMatch(new RegExp(` docker://other:1 rollserve-${other.id}$`));
      await other.close();
      expect(lines(log, /^build /)).toHaveLength(1);
      await Promise.all([first.close?.(), second.close?.()]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('builds no more images at once than the host unpacks, each once; a SIF file or a directory is not built', async () => {
    const { dir, log } = fakeApptainer();
    const cache = join(dir, 'cache');
    try {
      const provider = createApptainerProvider({ binDir: dir, tmpDir: dir, imageCacheDir: cache, maxConcurrentUnpacks: 1 });
      const layout = join(dir, 'layout');
      mkdirSync(layout);
      writeFileSync(join(layout, 'index.json'), '{"schemaVersion":2,"manifests":[]}');
      writeFileSync(join(dir, 'image.tar'), 'a docker save');
      const images = ['docker://a:1', 'oras://registry/b:1', `oci:${layout}:latest`, `docker-archive:${join(dir, 'image.tar')}`, 'docker://a:1', '/images/c.sif', 'sif:/images/d.sif', '/images/rootfs'];
      await Promise.all(images.map((image) => provider.prefetch!({ image })));
      const steps = lines(log, /^(build|built) /);
      // one build at a time: each start followed by its end
      expect(steps).toHaveLength(8);
      for (let i = 0; i < steps.length; i += 2) expect(steps[i + 1]).toBe(`built ${steps[i]!.split(' ')[2]}`);
      expect(steps.filter((line) => line.startsWith('built ')).sort()).toEqual(
        ['built docker://a:1', `built docker-archive:${join(dir, 'image.tar')}`, `built oci:${layout}:latest`, 'built oras://registry/b:1'].sort(),
      );
      expect(sifEntries(cache)).toHaveLength(4);
      // a changed layout is another image: built again
      writeFileSync(join(layout, 'index.json'), '{"schemaVersion":2,"manifests":[{}]}');
      await provider.prefetch!({ image: `oci:${layout}:latest` });
      expect(lines(log, /^built /)).toHaveLength(5);
      await provider.close?.();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('an instance asked for while another process builds its image waits for the build and starts from the SIF', async () => {
    const { dir, log } = fakeApptainer();
    const cache = join(dir, 'cache');
    try {
      const building = createApptainerProvider({ binDir: dir, tmpDir: dir, imageCacheDir: cache });
      const starting = createApptainerProvider({ binDir: dir, tmpDir: dir, imageCacheDir: cache });
      writeFileSync(join(dir, 'hold-builds'), '');
      const prefetched = building.prefetch!({ image: 'docker://big:1' });
      while (lines(log, /^build /).length === 0) await new Promise((resolve) => setTimeout(resolve, 20));
      const created = starting.create({ image: 'docker://big:1' });
      rmSync(join(dir, 'hold-builds'));
      await prefetched;
      const sandbox = await created;
      const calls = lines(log, /^(build|built|instance start) /);
      expect(calls.map((line) => line.split(' ').slice(0, 2).join(' '))).toEqual(['build ' + calls[0]!.split(' ')[1], 'built docker://big:1', 'instance start']);
      expect(calls[2]).toMatch(new RegExp(` ${cache}/sif/sha256-[0-9a-f]{64}/image\\.sif rollserve-${sandbox.id}$`));
      await sandbox.close();
      await Promise.all([building.close?.(), starting.close?.()]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a failed build leaves nothing behind and is the instance's to report; imageCacheDir false: no prefetch", async () => {
    const { dir, log } = fakeApptainer();
    const cache = join(dir, 'cache');
    try {
      const provider = createApptainerProvider({ binDir: dir, tmpDir: dir, imageCacheDir: cache });
      await expect(provider.prefetch!({ image: 'docker://broken:1' })).rejects.toThrow(/apptainer build failed \(255\): FATAL: While making image from oci registry: docker:\/\/broken:1 not found/);
      expect(sifEntries(cache)).toEqual([]);
      expect(leftovers(cache)).toEqual([]);
      expect(readdirSync(join(cache, '.unpacks'))).toEqual([]);
      // (the stand-in starts anything: a real apptainer fails the instance with the image's error)
      const sandbox = await provider.create({ image: 'docker://broken:1' });
      expect(lines(log, /^instance start /).at(-1)).toMatch(new RegExp(` docker://broken:1 rollserve-${sandbox.id}$`));
      await sandbox.close();
      expect(createApptainerProvider({ binDir: dir, imageCacheDir: false }).prefetch).toBeUndefined();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('under a cap, a build evicts the least recently used SIF but never one an instance runs on', async () => {
    const { dir } = fakeApptainer();
    const cache = join(dir, 'cache');
    try {
      // each SIF is 'SIF of docker://x:1\n', 20 bytes: room for one and a half
      const provider = createApptainerProvider({ binDir: dir, tmpDir: dir, imageCacheDir: cache, imageCacheMaxBytes: 30 });
      const key = (image: string): string => `sha256-${sifKey(image)}`;
      await provider.prefetch!({ image: 'docker://a:1' });
      const running = await provider.create({ image: 'docker://a:1' });
      await provider.prefetch!({ image: 'docker://b:1' });
      // over the cap: a runs, b was just built; both stay
      expect(sifEntries(cache)).toEqual([key('docker://a:1'), key('docker://b:1')].sort());
      await provider.prefetch!({ image: 'docker://c:1' });
      // b idle and least recently used goes; a still runs
      expect(sifEntries(cache)).toEqual([key('docker://a:1'), key('docker://c:1')].sort());
      await running.close();
      await provider.prefetch!({ image: 'docker://b:1' });
      expect(sifEntries(cache)).toEqual([key('docker://b:1')]);
      await provider.close?.();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
