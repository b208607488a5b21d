import { readdirSync, readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { RolloutError } from '../errors.ts';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import type { SandboxSpec } from '../sandbox/types.ts';
import { SessionTools } from './session-tools.ts';

// Starting a session's sandbox and backends is infrastructure work: each start has its own limit,
// its time is on a clock that tool time limits leave out, and a failed start is kept for the
// rollout service to end the rollout with. The slow start is real: a sitecustomize that sleeps.

/** A sandbox whose every Python sleeps `delay` s before it runs anything. */
const slowPython = (delay: number): SandboxSpec => ({
  files: { '/workspace/.slow/sitecustomize.py': `import time\ntime.sleep(${delay})\n` },
  env: { PYTHONPATH: '/workspace/.slow', ROLLSERVE_TEST_MARK: 'session-tools-test' },
});

/** Processes on the host started with the test's mark in their environment. */
function marked(): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/environ`, 'latin1').includes('ROLLSERVE_TEST_MARK=session-tools-test')) found.push(Number(entry));
    } catch {
      // gone, or not ours to read
    }
  }
  return found;
}

const provider = createBwrapProvider();
const open: SessionTools[] = [];
afterEach(async () => {
  while (open.length) await open.pop()!.close();
});

function tools(delay: number, startTimeoutMs?: number): SessionTools {
  const made = new SessionTools({ provider, spec: slowPython(delay), ...(startTimeoutMs === undefined ? {} : { startTimeoutMs }) });
  open.push(made);
  return made;
}

describe.runIf(bwrapAvailable())('SessionTools start-up', () => {
  it('keeps the time of its starts on a clock, counting a start under way', async () => {
    const session = tools(1);
    expect(session.startupMs()).toBe(0);
    const kernel = session.python();
    await new Promise((resolve) => setTimeout(resolve, 300));
    const during = session.startupMs();
    expect(during).toBeGreaterThan(0);
    await kernel;
    const after = session.startupMs();
    expect(after).toBeGreaterThan(during);
    // a running kernel costs no more start-up
    expect((await (await session.python()).run('print(6*7)')).stdout).toBe('42\n');
    expect(session.startupMs()).toBe(after);
    expect(session.startFailure()).toBeUndefined();
    expect(marked().length).toBeGreaterThan(0); // the probe sees the sandbox's processes
  });

  it('fails a start that misses its limit, keeps the failure, and leaves nothing running', async () => {
    const session = tools(60, 1_000);
    const error = await session.python().then(() => undefined, (e: unknown) => e);
    expect(RolloutError.isInstance(error) && error.code).toBe('TIMEOUT');
    expect((error as Error).message).toMatch(/Python kernel did not start within 1 s/);
    expect(session.startFailure()?.message).toMatch(/did not start/);
    // the sandbox itself started in time
    await session.sandbox();
    await session.close();
    open.pop();
    await expect.poll(marked, { timeout: 10_000 }).toEqual([]);
  });

  it('gives a start up when the session closes, without calling it a failure', async () => {
    const session = tools(60);
    const kernel = session.python().then(() => undefined, (e: unknown) => e);
    await session.sandbox();
    await session.close();
    open.pop();
    expect(RolloutError.isInstance(await kernel)).toBe(true);
    expect(session.startFailure()).toBeUndefined();
    await expect.poll(marked, { timeout: 10_000 }).toEqual([]);
  });

  it('keeps a failed start only while the policy has not acted: a first use by the policy still counts', async () => {
    const session = tools(60, 1_000);
    await session.sandbox(); // INIT
    session.policyBegins();
    // the policy's first call starts the kernel and is handed nothing before it fails
    await expect(session.python()).rejects.toThrow(/did not start/);
    expect(session.policyActed()).toBe(false);
    expect(session.startFailure()?.message).toMatch(/Python kernel did not start/);
  });

  it('leaves a start that fails after the policy acted to the call: thrown, not kept', async () => {
    const session = tools(0, 5_000);
    await session.python(); // INIT
    expect(session.policyActed()).toBe(false);
    session.policyBegins();
    const kernel = await session.python();
    expect(session.policyActed()).toBe(true);
    // what the policy can do in its sandbox: break the next start (here a hook on the operator's PYTHONPATH)
    await kernel.run("open('/workspace/.slow/sitecustomize.py', 'w').write('raise SystemExit(3)')");
    await session.resetPython();
    await expect(session.python()).rejects.toThrow(/python kernel did not start/);
    expect(session.startFailure()).toBeUndefined();
  });

  it('counts the policy\'s reset as its act', async () => {
    const session = tools(0);
    await session.python();
    session.policyBegins();
    await session.resetPython();
    expect(session.policyActed()).toBe(true);
    // INIT's own use of the tools is not the policy's
    const init = tools(0);
    await init.python();
    await init.resetPython();
    expect(init.policyActed()).toBe(false);
  });
});
