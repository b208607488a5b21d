import { bashTool, defineEnvironment } from '@rollserve/core';
import { bwrapAvailable, createBwrapProvider, type SandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse, startFakePolicy, startTestRolloutService } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';

// One environment, both faces: its hooks reach the session's sandbox through ctx.tools and its
// server-wide resources through ctx.resources, and never learn which face runs them. The sandbox
// is the one its `sandbox.spec` makes from the parsed row and config; `setup` runs once per server
// and `close` once when the server stops.

/** bwrap, counting the sandboxes open. */
function countingProvider(): SandboxProvider & { live: Set<string>; created: number } {
  const inner = createBwrapProvider();
  const live = new Set<string>();
  const provider = {
    name: 'counting',
    live,
    created: 0,
    async create(spec: Parameters<SandboxProvider['create']>[0]) {
      const sandbox = await inner.create(spec);
      provider.created++;
      live.add(sandbox.id);
      const close = sandbox.close.bind(sandbox);
      sandbox.close = async () => {
        live.delete(sandbox.id);
        await close();
      };
      return sandbox;
    },
  };
  return provider;
}

/** The environment under test, with a log of its setup and close calls. */
function probeEnvironment() {
  const log: string[] = [];
  let setups = 0;
  const env = defineEnvironment({
    name: 'probe',
    domain: 'other',
    // parsed values reach the spec: the tag upper-cased, the greeting's default filled in
    row: z.object({ tag: z.string().transform((tag) => tag.toUpperCase()) }),
    config: z.object({ greeting: z.string().default('hello') }),
    setup: (config) => {
      setups++;
      log.push(`setup ${config.greeting}`);
      return { id: `server-${setups}` };
    },
    close: (resources) => void log.push(`close ${resources.id}`),
    sandbox: {
      keepForVerify: true,
      spec: (row, config) => ({ files: { '/workspace/tag.txt': row.tag }, env: { GREETING: config.greeting } }),
    },
    tools: { bash: bashTool },
    async verify(row, _response, ctx) {
      const shell = await ctx.tools.bash();
      const found = (await shell.run('cat /workspace/out.txt')).output.trim();
      return { reward: found === `${row.tag} ${ctx.config.greeting}` ? 1 : 0, found, server: ctx.resources.id };
    },
  });
  return { env, log };
}

const COMMAND = 'echo "$(cat tag.txt) $GREETING" > out.txt; cat out.txt';

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[environment context tests] skipped: ${skip}`);

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

describe.skipIf(skip !== undefined)('EnvironmentContext: the same environment on both faces', () => {
  it('NeMo Gym face: /seed_session makes the sandbox from the row, the bash route and verify use it', async () => {
    const { env, log } = probeEnvironment();
    const provider = countingProvider();
    const app = createResourcesServer(env, { sandboxProvider: provider, config: {} });
    const server = await serveFetch(app);
    let closed = false;
    cleanups.push(async () => {
      await server.close();
      if (!closed) await app.close();
    });
    expect(log).toEqual([]); // setup waits for the first request

    const rollout = async (tag: string) => {
      const seed = await call(server.url, 'POST', '/seed_session', { tag });
      expect(seed.status, seed.text).toBe(200);
      const cookie = cookieHeader(seed.setCookies);
      const bash = await call(server.url, 'POST', '/bash', { command: COMMAND }, { cookie });
      expect(bash.status, bash.text).toBe(200);
      const verify = await call(server.url, 'POST', '/verify', { tag, responses_create_params: { input: 'go' }, response: makeResponse([]) }, { cookie });
      expect(verify.status, verify.text).toBe(200);
      return { bash: bash.text, verify: verify.json as Record<string, unknown> };
    };
    const [alpha, beta] = await Promise.all([rollout('alpha'), rollout('beta')]);
    expect(alpha.bash).toBe('ALPHA hello\n');
    expect(beta.bash).toBe('BETA hello\n');
    expect(alpha.verify).toMatchObject({ reward: 1, found: 'ALPHA hello', server: 'server-1' });
    expect(beta.verify).toMatchObject({ reward: 1, found: 'BETA hello', server: 'server-1' });
    expect(provider.created).toBe(2);
    expect(provider.live.size).toBe(0); // each session's sandbox went with its verify

    // a bad row for the sandbox spec is the usual 422, not a 500
    const bad = await call(server.url, 'POST', '/seed_session', { tag: 7 });
    expect(bad.status).toBe(422);

    expect(log).toEqual(['setup hello']);
    await app.close();
    closed = true;
    expect(log).toEqual(['setup hello', 'close server-1']);
  });

  it('rollout service: INIT makes the sandbox from the row, the policy\'s bash calls and verify use it', async () => {
    const { env, log } = probeEnvironment();
    const provider = countingProvider();
    const fake = await startFakePolicy({
      script: (request) =>
        (request.messages as Array<{ role: string }>).some((m) => m.role === 'tool') ? 'done' : { toolCalls: [{ name: 'bash', arguments: { command: COMMAND } }] },
    });
    const { service, close } = await startTestRolloutService({
      environments: [env],
      environmentConfigs: { probe: { greeting: 'hi' } },
      backends: [fake.url],
      sandboxProvider: provider,
    });
    let closed = false;
    cleanups.push(async () => {
      if (!closed) await close();
      await fake.close();
    });
    expect(log).toEqual([]);
    const tasks = ['alpha', 'beta'].map((tag) => ({ id: tag, env: 'probe', row: { responses_create_params: { input: `tag ${tag}` }, tag }, policy: { model: 'fake-policy' } }));
    await service.submit(tasks);
    const [alpha, beta] = await Promise.all(tasks.map((t) => service.wait(t.id)));
    expect(alpha!.error).toBeNull();
    expect(alpha!.turns[0]!.tool_calls[0]!.output).toBe('ALPHA hi\n');
    expect(beta!.turns[0]!.tool_calls[0]!.output).toBe('BETA hi\n');
    expect(alpha).toMatchObject({ reward: 1, verify_extras: { found: 'ALPHA hi', server: 'server-1' } });
    expect(beta).toMatchObject({ reward: 1, verify_extras: { found: 'BETA hi', server: 'server-1' } });
    expect(provider.created).toBe(2);
    expect(provider.live.size).toBe(0);
    expect(service.status().live_sandboxes).toBe(0);

    expect(log).toEqual(['setup hi']);
    await close();
    closed = true;
    expect(log).toEqual(['setup hi', 'close server-1']);
  });
});
