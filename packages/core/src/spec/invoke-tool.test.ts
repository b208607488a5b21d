import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { invokeTool } from './invoke-tool.ts';
import { defineTool } from './tool.ts';

const ctx = { session: { id: 's', state: {}, onClose: () => undefined }, config: {}, logger: console, tools: undefined, resources: undefined } as never;

/** A tool that answers after `ms` (never, for -1), unless its signal aborts first. */
const waits = defineTool({
  description: 'waits',
  parameters: z.object({ ms: z.number() }),
  handler: ({ ms }, { signal }) =>
    new Promise((resolve, reject) => {
      const timer = ms < 0 ? undefined : setTimeout(() => resolve(ms), ms);
      signal.addEventListener('abort', () => {
        clearTimeout(timer);
        reject(signal.reason);
      });
    }),
});

describe('invokeTool time limits', () => {
  it('times out each call that overruns its limit, whatever the calls around it do', async () => {
    // calls sharing one limit (one queue of deadlines): quick ones end before the slow ones, in
    // between and after them, and a new call begins once the first has expired
    const first = [invokeTool(waits, { ms: -1 }, ctx, { timeoutMs: 60 }), invokeTool(waits, { ms: 1 }, ctx, { timeoutMs: 60 })];
    const middle = [invokeTool(waits, { ms: 2 }, ctx, { timeoutMs: 60 }), invokeTool(waits, { ms: -1 }, ctx, { timeoutMs: 60 })];
    const outcomes = await Promise.all([...first, ...middle]);
    expect(outcomes.map((o) => (o.ok ? o.value : o.timedOut ? 'timeout' : 'error'))).toEqual(['timeout', 1, 2, 'timeout']);
    const after = await Promise.all([invokeTool(waits, { ms: -1 }, ctx, { timeoutMs: 60 }), invokeTool(waits, { ms: 3 }, ctx, { timeoutMs: 60 })]);
    expect(after.map((o) => (o.ok ? o.value : o.timedOut ? 'timeout' : 'error'))).toEqual(['timeout', 3]);
    const timedOut = outcomes[0]!;
    expect(!timedOut.ok && String(timedOut.error)).toMatch(/timed out after 60 ms/);
  });

  it('keeps each limit apart and reports a throw as the tool error', async () => {
    const throws = defineTool({ description: 'throws', parameters: z.object({}), handler: () => { throw new RangeError('bad'); } });
    const [short, long, thrown] = await Promise.all([
      invokeTool(waits, { ms: -1 }, ctx, { timeoutMs: 20 }),
      invokeTool(waits, { ms: 40 }, ctx, { timeoutMs: 10_000 }),
      invokeTool(throws, {}, ctx, { timeoutMs: 20 }),
    ]);
    expect(short).toMatchObject({ ok: false, timedOut: true });
    expect(long).toEqual({ ok: true, value: 40 });
    expect(thrown).toMatchObject({ ok: false, timedOut: false });
    expect(!thrown.ok && thrown.error).toBeInstanceOf(RangeError);
  });
});
