import { readFileSync } from 'node:fs';
import { chmod, mkdtemp, readdir, rm } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider, PythonKernel, type Sandbox } from '@rollserve/core/sandbox';

// Warm sandboxes per spec (issue 28): a spec with explicit resources (or network, or a workdir)
// is served from a pool of its own, started with its limits; a warm sandbox gets the spec's env
// and files when handed out, and its Python kernel from the fork server like any other.

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip !== undefined) console.warn(`[warm pool] skipping: ${skip}`);

const TICKS_PER_S = 100;
/** Seconds since boot when the process started. */
const startedAt = (pid: number): number => Number(readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]!.split(' ')[19]) / TICKS_PER_S;
const uptime = (): number => Number(readFileSync('/proc/uptime', 'latin1').split(' ')[0]);
const initOf = (sandbox: Sandbox): number => (sandbox as unknown as { initPid: number }).initPid;

describe.skipIf(skip !== undefined)('warm sandboxes per spec', () => {
  const providers: Array<ReturnType<typeof createBwrapProvider>> = [];
  afterAll(async () => {
    for (const provider of providers) await provider.close?.();
  });

  for (const warm of [1, 'auto'] as const) {
    it(`hands out a sandbox started ahead for a spec with explicit resources, with that spec's env, files and limits (warm: ${warm})`, async () => {
      const provider = createBwrapProvider({ warm });
      providers.push(provider);
      const spec = { resources: { memoryMib: 768, maxProcesses: 48 } };
      const first = await provider.create({ ...spec, env: { WHICH: 'first' } });
      await first.close();
      // ('auto' keeps sandboxes ahead for a spec asked for again)
      if (warm === 'auto') await (await provider.create({ ...spec, env: { WHICH: 'again' } })).close();
      // the pool for this spec fills in the background
      await new Promise((resolve) => setTimeout(resolve, 1500));
      const asked = uptime();
      const second = await provider.create({ ...spec, env: { WHICH: 'second' }, files: { 'note.txt': 'hi' } });
      try {
        expect(startedAt(initOf(second))).toBeLessThan(asked - 0.2);
        const shown = await second.exec('echo $WHICH; cat note.txt; echo; ulimit -v');
        expect(shown.stdout).toBe(`second\nhi\n${768 * 1024}\n`);
        const kernel = await PythonKernel.start(second);
        try {
          expect((await kernel.run('import os, resource\nos.environ["WHICH"], resource.getrlimit(resource.RLIMIT_NPROC)')).result).toBe("('second', (48, 48))");
        } finally {
          await kernel.close();
        }
      } finally {
        await second.close();
      }
      // another spec is not served from this pool: its sandbox starts when asked
      const asked2 = uptime();
      const other = await provider.create({ resources: { memoryMib: 640 } });
      try {
        expect(startedAt(initOf(other))).toBeGreaterThanOrEqual(asked2 - 0.02);
        expect((await other.exec('ulimit -v')).stdout).toBe(`${640 * 1024}\n`);
      } finally {
        await other.close();
      }
    });
  }

  it("'auto' keeps nothing ahead for a spec asked for once, at most two per core over all specs, and close ends what is warm or starting", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-warm-pool-'));
    await chmod(dir, 0o755); // the sandbox uid (nobody, under root) makes its mounts from there
    const dirs = async () => (await readdir(dir)).filter((name) => name.startsWith('rollserve-rs-')).length;
    const provider = createBwrapProvider({ warm: 'auto', tmpDir: dir });
    try {
      // specs each asked for once (every rollout's its own): no warm sandbox
      for (let i = 0; i < 3; i++) await (await provider.create({ resources: { memoryMib: 600 + i } })).close();
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(await dirs()).toBe(0);
      // many specs in demand at once: the pools together stop at two per core
      const specs = Array.from({ length: 4 }, (_, i) => ({ resources: { memoryMib: 700 + i } }));
      for (let round = 0; round < 3; round++) {
        const sandboxes = await Promise.all(specs.flatMap((spec) => [provider.create(spec), provider.create(spec)]));
        await Promise.all(sandboxes.map((sandbox) => sandbox.close()));
        expect(await dirs()).toBeLessThanOrEqual(2 * availableParallelism());
      }
      expect(await dirs()).toBeGreaterThan(0);
    } finally {
      await provider.close?.();
      // what was warm, and what was still starting, ended with the provider
      expect(await dirs()).toBe(0);
      await rm(dir, { recursive: true, force: true });
    }
  });
});
