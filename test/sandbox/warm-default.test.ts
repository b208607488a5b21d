import { chmod, mkdtemp, readdir, rm } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bashTool, defineEnvironment } from '@rollserve/core';
import { bwrapAvailable, createSandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse, startFakePolicy, startTestRolloutService } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { childrenOf } from '../../packages/core/src/sandbox/process.ts';

// The default provider (createSandboxProvider(): what the service, a node and NeMo Gym use when an
// environment names none) keeps warm sandboxes per spec, explicit resources included (issue 28).
// A rollout served from the pool gets a sandbox never handed out before, with its own row's env
// and files and nothing any other rollout left (files, processes, shell state); the warm
// sandboxes count in no live_sandboxes, and closing the face ends them.

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[warm default provider tests] skipped: ${skip}`);

/** Seconds since boot now (the clock of /proc/<pid>/stat's start time, the same inside a sandbox). */
const uptime = (): number => Number(readFileSync('/proc/uptime', 'latin1').split(' ')[0]);

/**
 * What a rollout's bash call reports: its sandbox's start (the start time of its pid 1, in clock
 * ticks after boot), what it sees, then what it leaves for the next rollout to find.
 */
const PROBE = [
  'echo "started $(cut -d" " -f22 /proc/1/stat)"',
  'echo "tag $TAG"',
  'echo "workspace $(ls -A /workspace | tr "\\n" " ")"',
  'echo "tmp $(ls -A /tmp | tr "\\n" " ")"',
  'echo "sleepers $(grep -l "^sleep" /proc/[0-9]*/comm 2>/dev/null | wc -l)"',
  'echo "shell ${LEFT:-none}"',
  // what this rollout leaves behind
  'echo "$TAG" > /workspace/left-$TAG; echo "$TAG" > /tmp/left-$TAG; export LEFT=$TAG; (setsid sleep 600 >/dev/null 2>&1 &)',
].join('; ');

interface Seen {
  started: number;
  tag: string;
  workspace: string;
  tmp: string;
  sleepers: string;
  shell: string;
}

function parse(output: string): Seen {
  const field = (name: string) => new RegExp(`^${name} ?(.*)$`, 'm').exec(output)?.[1]?.trim() ?? '';
  return { started: Number(field('started')) / 100, tag: field('tag'), workspace: field('workspace'), tmp: field('tmp'), sleepers: field('sleepers'), shell: field('shell') };
}

function probeEnvironment() {
  return defineEnvironment({
    name: 'warmprobe',
    domain: 'other',
    row: z.object({ tag: z.string() }),
    sandbox: {
      keepForVerify: true,
      // explicit resources: served from a pool of their own
      spec: (row) => ({ resources: { memoryMib: 768, maxProcesses: 48 }, env: { TAG: row.tag }, files: { [`/workspace/row-${row.tag}`]: row.tag } }),
    },
    tools: { bash: bashTool },
    async verify(row, _response, ctx) {
      const shell = await ctx.tools.bash();
      const limit = (await shell.run('ulimit -v')).output.trim();
      return { reward: limit === String(768 * 1024) ? 1 : 0, tag: row.tag };
    },
  });
}

/** What a rollout that the pool served must see: its own row's env and file, nothing left by others. */
function expectFresh(seen: Seen, tag: string): void {
  expect(seen.tag).toBe(tag);
  expect(seen.workspace).toBe(`row-${tag}`);
  expect(seen.tmp).toBe('');
  expect(seen.sleepers).toBe('0');
  expect(seen.shell).toBe('none');
}

/** The kernel fork servers this process runs (`python3 -s -c <loader>`, fork-server.ts). */
/** The provider's helper processes: kernel fork servers (`python3 -s -c <loader>`) and the spawner (`perl -e <program> <service pid>`). */
const forkServers = (): number[] =>
  childrenOf(process.pid).filter((pid) => {
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'latin1').split('\0');
      return (argv[1] === '-s' && argv[2] === '-c') || (argv[0] === '/usr/bin/perl' && argv[1] === '-e' && argv[3] === String(process.pid));
    } catch {
      return false;
    }
  });

const sandboxDirs = async (dir: string) => (await readdir(dir)).filter((name) => name.startsWith('rollserve-rs-'));

describe.skipIf(skip !== undefined)('the default provider keeps warm sandboxes', () => {
  // the sandboxes' directories go to TMPDIR (staging.ts): counted there, apart from other tests'
  let dir: string;
  const given = process.env.TMPDIR;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rollserve-warm-'));
    await chmod(dir, 0o755); // the sandbox uid (nobody, under root) makes its mounts from there
    process.env.TMPDIR = dir;
  });
  afterAll(async () => {
    if (given === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = given;
    await rm(dir, { recursive: true, force: true });
  });

  it('createSandboxProvider() is warm: auto unless ROLLSERVE_SANDBOX_WARM or the options say', async () => {
    const counts: number[] = [];
    for (const [env, options] of [[undefined, undefined], ['0', undefined], [undefined, { warm: 0 }]] as const) {
      if (env === undefined) delete process.env.ROLLSERVE_SANDBOX_WARM;
      else process.env.ROLLSERVE_SANDBOX_WARM = env;
      const provider = createSandboxProvider('bwrap', options);
      try {
        for (let i = 0; i < 2; i++) await (await provider.create()).close();
        // (a warm sandbox starts in the background after the second ask)
        for (let i = 0; i < 100 && (await sandboxDirs(dir)).length === 0 && env === undefined && options === undefined; i++) await new Promise((r) => setTimeout(r, 20));
        counts.push((await sandboxDirs(dir)).length);
      } finally {
        await provider.close?.();
        delete process.env.ROLLSERVE_SANDBOX_WARM;
      }
      expect(await sandboxDirs(dir)).toEqual([]);
    }
    expect(counts[0]).toBeGreaterThan(0);
    expect(counts.slice(1)).toEqual([0, 0]);
    expect(() => createSandboxProvider('bwrap', undefined)).not.toThrow();
    process.env.ROLLSERVE_SANDBOX_WARM = 'lots';
    try {
      expect(() => createSandboxProvider('bwrap')).toThrow(/ROLLSERVE_SANDBOX_WARM/);
    } finally {
      delete process.env.ROLLSERVE_SANDBOX_WARM;
    }
  });

  it('NeMo Gym face: sessions served from the pool see only their own row, and closing the server ends the pool', async () => {
    const app = createResourcesServer(probeEnvironment(), { config: {} });
    const server = await serveFetch(app);
    try {
      const rollout = async (tag: string) => {
        const asked = uptime();
        const seed = await call(server.url, 'POST', '/seed_session', { tag });
        expect(seed.status, seed.text).toBe(200);
        const cookie = cookieHeader(seed.setCookies);
        const bash = await call(server.url, 'POST', '/bash', { command: PROBE }, { cookie });
        expect(bash.status, bash.text).toBe(200);
        const verify = await call(server.url, 'POST', '/verify', { tag, responses_create_params: { input: 'go' }, response: makeResponse([]) }, { cookie });
        expect(verify.json).toMatchObject({ reward: 1, tag });
        return { asked, seen: parse(bash.text) };
      };
      const first = await rollout('one');
      expectFresh(first.seen, 'one');
      // one provider for the server: its sessions share its fork servers and spawner (a provider
      // per session, before, started fork servers of its own that lived as long as the server)
      const servers = forkServers();
      expect(servers.length).toBeGreaterThan(0);
      await rollout('two');
      // the spec was asked for again: its pool fills in the background
      for (let i = 0; i < 200 && (await sandboxDirs(dir)).length === 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect((await sandboxDirs(dir)).length).toBeGreaterThan(0);
      await new Promise((r) => setTimeout(r, 300));
      const third = await rollout('three');
      // started before it was asked for: a warm sandbox, with nothing of the two before it
      expect(third.seen.started).toBeLessThan(third.asked - 0.1);
      expectFresh(third.seen, 'three');
      expect(forkServers()).toEqual(servers);
    } finally {
      await server.close();
      await app.close();
    }
    expect(forkServers()).toEqual([]);
    expect(await sandboxDirs(dir)).toEqual([]);
  });

  it('rollout service: rollouts served from the pool see only their own row; warm sandboxes are in no count, and close ends them', async () => {
    const fake = await startFakePolicy({
      script: (request) =>
        (request.messages as Array<{ role: string }>).some((m) => m.role === 'tool') ? 'done' : { toolCalls: [{ name: 'bash', arguments: { command: PROBE } }] },
    });
    const { service, close } = await startTestRolloutService({ environments: [probeEnvironment()], backends: [fake.url] });
    try {
      const rollout = async (tag: string) => {
        const asked = uptime();
        await service.submit([{ id: tag, env: 'warmprobe', row: { responses_create_params: { input: tag }, tag }, policy: { model: 'fake-policy' } }]);
        const result = await service.wait(tag);
        expect(result!.error).toBeNull();
        expect(result).toMatchObject({ reward: 1 });
        return { asked, seen: parse(result!.turns[0]!.tool_calls[0]!.output) };
      };
      expectFresh((await rollout('one')).seen, 'one');
      await rollout('two');
      for (let i = 0; i < 200 && (await sandboxDirs(dir)).length === 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect((await sandboxDirs(dir)).length).toBeGreaterThan(0);
      // warm, not live: no rollout holds it
      expect(service.status().live_sandboxes).toBe(0);
      await new Promise((r) => setTimeout(r, 300));
      const third = await rollout('three');
      expect(third.seen.started).toBeLessThan(third.asked - 0.1);
      expectFresh(third.seen, 'three');
      expect(service.status().live_sandboxes).toBe(0);
    } finally {
      await close();
      await fake.close();
    }
    expect(await sandboxDirs(dir)).toEqual([]);
  });
});
