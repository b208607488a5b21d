import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import swe from '@rollserve/env-swe';
import { bwrapAvailable, createBwrapProvider, registerSandboxProvider, resolveImage } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import type { RolloutService } from '@rollserve/core/service';
import { call, type ChatCompletionBody, cookieHeader, type FakeReply, makeResponse, missingCommands, startFakePolicy, startTestRolloutService } from '@rollserve/testing';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { buildSweFixtures, type SweFixture, type SweFixtureRow } from './fixtures.ts';
import { buildSweImages, IMAGE_MARKER, IMAGE_MARKER_MODULE, sweImageName, type SweImages } from './image-fixtures.ts';

// SWE rows end to end on real images built here from the host's own files (image-fixtures.ts):
// python3, pytest, git, patch and the shells in a small root filesystem, calc's tree at /testbed
// as in SWE-bench's images, packed as an OCI image layout and as a squashfs. Each image runs rows
// on the NeMo Gym face and in the rollout service, on bwrap with the image as the sandbox's root.

const missing = missingCommands(['umoci', 'unsquashfs', 'mksquashfs', 'ldd', 'git', 'patch']);
const hostPytest = ((): boolean => {
  try {
    execFileSync('/usr/bin/python3', ['-c', 'import pytest'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
const skip = !bwrapAvailable()
  ? 'bwrap is not installed'
  : missing.length > 0
    ? `missing ${missing.join(', ')}`
    : !hostPytest
      ? 'no pytest for /usr/bin/python3 (Debian: python3-pytest)'
      : undefined;

type Verify = Record<string, unknown> & { reward: number };

const PROVIDER = 'swe-image-e2e';
let dirs: { imageCacheDir: string; tmpDir: string } | undefined;
// bwrap with this file's image cache and sandbox directory, for the agent's sandboxes and the eval ones alike
registerSandboxProvider(PROVIDER, () => createBwrapProvider({ ...dirs }));

/** What the agent runs first: which python, which pytest, whose files. */
const PROBE = [
  'pwd',
  `python3 -c "import sys, ${IMAGE_MARKER_MODULE} as m; print(m.WHERE); print(sys.executable)"`,
  'python3 -m pytest --version 2>&1',
  'test -e /etc/debian_version && echo host-files || echo no-host-files',
].join('; ');

describe.skipIf(skip !== undefined)('SWE rows on images built from files (bwrap)', () => {
  let built: ReturnType<typeof buildSweFixtures>;
  let calc: SweFixture;
  let textkit: SweFixture;
  let images: SweImages;

  beforeAll(() => {
    built = buildSweFixtures();
    [calc, textkit] = built.fixtures as [SweFixture, SweFixture];
    images = buildSweImages(calc);
    dirs = { imageCacheDir: join(images.dir, 'cache'), tmpDir: join(images.dir, 'sandboxes') };
    mkdirSync(dirs.tmpDir);
    chmodSync(dirs.tmpDir, 0o755); // the sandbox uid mounts its overlay below it
    const { rootfs, timings } = images;
    console.log(`[swe image] rootfs ${(rootfs.bytes / 1e6).toFixed(1)} MB in ${rootfs.files} files built in ${timings.rootfs}s; OCI layout ${timings.oci}s, squashfs ${timings.squashfs}s`);
  }, 300_000);

  afterAll(() => {
    // every sandbox's directory went with it
    const left = dirs === undefined ? [] : readdirSync(dirs.tmpDir);
    images?.close();
    built?.close();
    dirs = undefined;
    expect(left).toEqual([]);
  });

  it('the marker module is only in the image, not on the host', () => {
    // so that the agent's output below can only come from the image's python
    const stdlib = execFileSync('/usr/bin/python3', ['-c', 'import sysconfig; print(sysconfig.get_path("stdlib"))'], { encoding: 'utf8' }).trim();
    expect(existsSync(join(stdlib, `${IMAGE_MARKER_MODULE}.py`))).toBe(false);
  });

  // calc: the repository is the image's /testbed (a row without repo_path, its image from
  // image_template as SWE-bench names images); textkit: a host repository (repo_path) copied into
  // the image's /workspace, the row naming the image directly.
  const kinds = [
    {
      kind: 'OCI layout',
      template: () => images.templates.oci,
      image: () => `oci:${images.ociLayout}:${sweImageName(String(calc.row.instance_id))}`,
    },
    { kind: 'squashfs', template: () => images.templates.squashfs, image: () => `squashfs:${images.squashfs}` },
  ];

  describe.each(kinds)('on the $kind image', ({ template, image }) => {
    const imageRow = (fixture: SweFixture): SweFixtureRow => {
      const { repo_path: _hostRepo, ...row } = fixture.row;
      return { ...row, image_template: template() };
    };
    const hostRepoRow = (fixture: SweFixture): SweFixtureRow => ({ ...fixture.row, image: image() });

    describe('NeMo Gym face', () => {
      let app: ResourcesServer;
      let running: RunningServer;
      let url: string;

      beforeAll(async () => {
        app = createResourcesServer(swe, { config: { sandbox_provider: PROVIDER, repos_root: built.root, images_root: images.dir } });
        running = await serveFetch(app);
        url = running.url;
      });
      afterAll(async () => {
        await running?.close();
        await app?.close();
      });

      async function rollout(row: Record<string, unknown>, calls: Array<[tool: string, args: Record<string, unknown>]>): Promise<{ verify: Verify; outputs: string[] }> {
        const seed = await call(url, 'POST', '/seed_session', row);
        expect(seed.status, seed.text).toBe(200);
        const cookie = cookieHeader(seed.setCookies);
        const outputs: string[] = [];
        for (const [tool, args] of calls) {
          const answer = await call(url, 'POST', `/${tool}`, args, { cookie });
          expect(answer.status, answer.text).toBe(200);
          outputs.push(typeof answer.json === 'string' ? answer.json : answer.text);
        }
        const verify = await call(url, 'POST', '/verify', { ...row, response: makeResponse([]) }, { cookie });
        expect(verify.status, verify.text).toBe(200);
        return { verify: verify.json as Verify, outputs };
      }

      const applyPatch = (patch: string): Array<[string, Record<string, unknown>]> => [
        ['str_replace_editor', { command: 'create', path: '/tmp/agent.patch', file_text: patch }],
        ['bash', { command: 'git apply /tmp/agent.patch && git status --short' }],
      ];

      it("the agent's shell is in the image's /testbed with the image's python; the gold patch is reward 1", async () => {
        const { verify, outputs } = await rollout(imageRow(calc), [['bash', { command: PROBE }], ...applyPatch(calc.goldPatch), ['submit', {}]]);
        expect(outputs[0]!.trim().split('\n')).toEqual(['/testbed', IMAGE_MARKER, '/usr/bin/python3', expect.stringMatching(/^pytest \d+\.\d+/), 'no-host-files']);
        expect(outputs[2]).toContain(`M ${calc.goldEdit.path}`);
        expect(verify.failure_reason, String(verify.test_output)).toBeNull();
        expect(verify).toMatchObject({
          reward: 1,
          resolved: true,
          evaluation_completed: true,
          submitted: true,
          patch_applied_with: 'git apply',
          test_command: "python3 -m pytest -rA 'tests/test_stats.py'",
          f2p_passed: calc.failToPass.length,
          p2p_passed: calc.passToPass.length,
          failed_tests: [],
        });
        expect(verify.test_output).toMatch(/PASSED tests\/test_stats.py::test_median_even/);
        expect(verify.model_patch).toContain(`diff --git a/${calc.goldEdit.path} b/${calc.goldEdit.path}`);
        expect(String(verify.model_patch).match(/^diff --git/gm)).toHaveLength(1);
      });

      it("the image's hostile entries are sealed: no device node, fifo, socket or setuid/setgid file reaches the agent's sandbox", async () => {
        const check = [
          'for f in /hostile/* /hostile/shared/*; do',
          '  if [ -b "$f" ] || [ -c "$f" ] || [ -p "$f" ] || [ -S "$f" ]; then echo "special $f"; fi',
          '  if [ -u "$f" ] || [ -g "$f" ]; then echo "setid $f"; fi',
          'done',
          'echo checked',
        ].join('\n');
        const { outputs } = await rollout(imageRow(calc), [['bash', { command: check }]]);
        expect(outputs[0]!.trim()).toBe('checked');
      });

      it('an empty patch is reward 0, a breaking one fails its tests in the image', async () => {
        const empty = await rollout(imageRow(calc), [['bash', { command: 'git status --short | wc -l' }]]);
        expect(empty.outputs[0]!.trim()).toBe('0');
        expect(empty.verify).toMatchObject({ reward: 0, resolved: false, evaluation_completed: false, model_patch: '', failure_reason: 'empty_patch' });
        const broken = await rollout(imageRow(calc), applyPatch(calc.breakingPatch));
        expect(broken.verify).toMatchObject({ reward: 0, evaluation_completed: true, failure_reason: 'tests_failed', f2p_passed: 1, p2p_passed: 1 });
      });

      it('a host repository (repo_path) copied into the image is judged by the image: the gold patch is reward 1', async () => {
        const { verify, outputs } = await rollout(hostRepoRow(textkit), [['bash', { command: PROBE }], ...applyPatch(textkit.goldPatch), ['submit', {}]]);
        expect(outputs[0]!.trim().split('\n').slice(0, 2)).toEqual(['/workspace', IMAGE_MARKER]);
        expect(verify.failure_reason, String(verify.test_output)).toBeNull();
        expect(verify).toMatchObject({ reward: 1, resolved: true, f2p_passed: textkit.failToPass.length, p2p_passed: textkit.passToPass.length });
      });
    });

    describe('rollout service', () => {
      const cleanups: Array<() => Promise<void>> = [];
      afterEach(async () => {
        while (cleanups.length) await cleanups.pop()!();
      });

      async function setup(script: (request: ChatCompletionBody, turn: number) => FakeReply): Promise<RolloutService> {
        const fake = await startFakePolicy({ script: (request, ctx) => script(request, ctx.turn) });
        const { service, close } = await startTestRolloutService({
          environments: [swe],
          backends: [fake.url],
          environmentConfigs: { swe: { sandbox_provider: PROVIDER, repos_root: built.root, images_root: images.dir } },
        });
        cleanups.push(async () => {
          await close();
          await fake.close();
        });
        return service;
      }

      it('a scripted policy that applies the gold fix and submits reaches reward 1 (image /testbed and a host repository)', async () => {
        const cases = [
          { fixture: calc, row: imageRow(calc), repoDir: '/testbed' },
          { fixture: textkit, row: hostRepoRow(textkit), repoDir: '/workspace' },
        ];
        const svc = await setup((request, turn) => {
          const first = JSON.stringify((request.messages as Array<{ role: string; content: unknown }>).find((m) => m.role === 'user')?.content);
          const { fixture, repoDir } = cases.find((c) => first.includes(String(c.fixture.row.problem_statement).slice(0, 40)))!;
          const { path, old_str, new_str } = fixture.goldEdit;
          switch (turn) {
            case 0:
              return { toolCalls: [{ name: 'bash', arguments: { command: PROBE } }] };
            case 1:
              return { toolCalls: [{ name: 'str_replace_editor', arguments: { command: 'str_replace', path: `${repoDir}/${path}`, old_str, new_str } }] };
            case 2:
              return { toolCalls: [{ name: 'submit', arguments: {} }] };
            default:
              return 'Fixed and submitted.';
          }
        });
        const tasks = cases.map((c, i) => ({ id: `image-gold-${i}`, env: 'swe', row: c.row, policy: { model: 'fake-policy' } }));
        await svc.submit(tasks);
        const results = await Promise.all(tasks.map((t) => svc.wait(t.id)));
        for (const [i, result] of results.entries()) {
          const { fixture, repoDir } = cases[i]!;
          expect(result.error?.message ?? null, fixture.name).toBeNull();
          expect(result.critical_error).toBeNull();
          const calls = result.turns.flatMap((t) => t.tool_calls);
          expect(calls.map((c) => c.name)).toEqual(['bash', 'str_replace_editor', 'submit']);
          expect(calls[0]!.output.trim().split('\n').slice(0, 2)).toEqual([repoDir, IMAGE_MARKER]);
          expect(calls[1]!.output).toContain('has been edited');
          expect(result.verify_extras).toMatchObject({ resolved: true, submitted: true, failure_reason: null, f2p_passed: fixture.failToPass.length, p2p_passed: fixture.passToPass.length });
          expect(result.reward, JSON.stringify(result.verify_extras.failed_tests)).toBe(1);
        }
        expect(svc.status().live_sandboxes).toBe(0);
      });
    });
  });

  it('times the first-use unpack and a sandbox start on the cached image (reported, not asserted)', async () => {
    const timingCache = join(images.dir, 'cache-timing');
    const provider = createBwrapProvider({ imageCacheDir: timingCache, tmpDir: dirs!.tmpDir });
    try {
      for (const { kind, image } of kinds) {
        let started = performance.now();
        const first = await resolveImage(image(), { cacheDir: timingCache });
        const unpackMs = performance.now() - started;
        expect(first.unpacked).toBe(true);
        expect((await resolveImage(image(), { cacheDir: timingCache })).unpacked).toBe(false);
        const starts: number[] = [];
        for (let i = 0; i < 11; i++) {
          started = performance.now();
          const sandbox = await provider.create({ image: image() });
          starts.push(performance.now() - started);
          try {
            if (i === 0) expect((await sandbox.exec(`python3 -c "import ${IMAGE_MARKER_MODULE} as m; print(m.WHERE)"`)).stdout).toBe(`${IMAGE_MARKER}\n`);
          } finally {
            await sandbox.close();
          }
        }
        starts.sort((a, b) => a - b);
        const p50 = starts[Math.floor(starts.length / 2)]!;
        console.log(`[swe image] ${kind}: first-use unpack ${unpackMs.toFixed(0)} ms; sandbox start on the cached image p50 ${p50.toFixed(1)} ms (min ${starts[0]!.toFixed(1)}, max ${starts.at(-1)!.toFixed(1)}, n=${starts.length})`);
      }
    } finally {
      await provider.close?.();
    }
    expect(readdirSync(timingCache).filter((name) => name.startsWith('.tmp-') || name.endsWith('.lock'))).toEqual([]);
  }, 300_000);
});
