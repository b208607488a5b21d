import { afterEach, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import type { Sandbox } from '../sandbox/types.ts';
import { BashSession } from './bash.ts';
import { channelLimitOf } from './channel-limit.ts';

// The bash tool's terminal is a channel from the sandbox into the service: past what it may carry
// for one command, the sandbox is ended (RESOURCE_LIMIT) instead of the service reading on.

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[bash channel tests] skipped: ${skip}`);

const MAX_STREAM = 8 * 1024 * 1024;

describe.skipIf(skip !== undefined)('the bash terminal is bounded', () => {
  const open: Array<{ session?: BashSession; sandbox: Sandbox }> = [];
  const start = async () => {
    const sandbox = await createBwrapProvider().create();
    const entry: { session?: BashSession; sandbox: Sandbox } = { sandbox };
    open.push(entry);
    entry.session = await BashSession.start(sandbox, { maxStreamChars: MAX_STREAM });
    return { sandbox, session: entry.session };
  };
  afterEach(async () => {
    for (const { session, sandbox } of open.splice(0)) {
      await session?.close();
      await sandbox.close();
    }
  });

  it('keeps output under the bound, truncated, and goes on', async () => {
    const { session, sandbox } = await start();
    const result = await session.run(`head -c ${MAX_STREAM / 2} /dev/zero | tr '\\0' a; echo`);
    expect(result.exitCode).toBe(0);
    expect(result.truncated).toBe(true);
    expect((await session.run('echo again')).output).toBe('again\n');
    expect(channelLimitOf(sandbox)).toBeUndefined();
  });

  it('ends the sandbox with RESOURCE_LIMIT when one command floods the terminal', async () => {
    const { session, sandbox } = await start();
    const result = await session.run('yes', { timeoutMs: 60_000 });
    expect(result.output).toContain('the sandbox was ended');
    expect(session.limitExceeded()).toMatch(/terminal carried more than/);
    expect(channelLimitOf(sandbox)).toBe(session.limitExceeded());
    expect(await sandbox.status()).toBe('stopped');
    await expect(session.run('echo hi')).rejects.toMatchObject({ code: 'RESOURCE_LIMIT' });
  });

  it('ends the sandbox when a background job floods the terminal between commands', async () => {
    const { session, sandbox } = await start();
    expect((await session.run('yes > /dev/tty 2>&1 &')).exitCode).toBe(0);
    const deadline = Date.now() + 20_000;
    while (channelLimitOf(sandbox) === undefined && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50));
    expect(channelLimitOf(sandbox)).toMatch(/terminal carried more than/);
    await expect(session.run('echo hi')).rejects.toMatchObject({ code: 'RESOURCE_LIMIT' });
  });
});
