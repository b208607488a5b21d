import { describe, expect, it } from 'vitest';
import { Weights } from './weights.ts';

/** A generation that ends when told to, or with its signal. */
function generation(backendId = 'b0') {
  let finish!: (value: string) => void;
  let calls = 0;
  const run = (signal: AbortSignal, started: (id: string) => void) => {
    calls++;
    started(backendId);
    return new Promise<string>((resolve, reject) => {
      finish = resolve;
      signal.addEventListener('abort', () => reject(signal.reason), { once: true });
    });
  };
  return { run, finish: (value: string) => finish(value), calls: () => calls };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('Weights', () => {
  it('records the version of the backend a generation was sent to: its own, else the default, else null', () => {
    const weights = new Weights();
    expect(weights.versionOf('b0')).toBeNull();
    weights.announce(3);
    weights.announce(5, ['b1']);
    expect([weights.versionOf('b0'), weights.versionOf('b1'), weights.newest]).toEqual([3, 5, 5]);
    // an announcement to all replaces the named ones
    weights.announce(4);
    expect([weights.versionOf('b1'), weights.newest]).toEqual([4, 5]);
    expect(() => weights.announce(-1)).toThrow(/integer/);
  });

  it('aborts generations in flight on a pause, runs them again after the resume on the new version, once', async () => {
    const weights = new Weights();
    weights.announce(1);
    const g = generation();
    const turn = weights.generate('r1', new AbortController().signal, g.run);
    await tick();
    expect(weights.inFlight).toBe(1);
    const paused = await weights.pause('abort');
    expect(paused).toMatchObject({ mode: 'abort', in_flight: 1, aborted: 1 });
    expect(weights.inFlight).toBe(0);
    await tick();
    expect(g.calls()).toBe(1); // nothing starts while paused
    weights.resume(2);
    await tick();
    expect(g.calls()).toBe(2);
    g.finish('done');
    const { value, version, pausedMs } = await turn;
    expect([value, version]).toEqual(['done', 2]);
    expect(pausedMs).toBeGreaterThan(0);
    expect(weights.pausedMs('r1')).toBe(pausedMs);
  });

  it('lets generations in flight finish on a pause in finish mode, answering once they have', async () => {
    const weights = new Weights();
    weights.announce(1);
    const g = generation();
    const turn = weights.generate('r1', new AbortController().signal, g.run);
    await tick();
    let answered = false;
    const pausing = weights.pause('finish').then((outcome) => ((answered = true), outcome));
    await tick();
    expect(answered).toBe(false);
    g.finish('old');
    expect(await pausing).toMatchObject({ in_flight: 1, aborted: 0 });
    expect(await turn).toMatchObject({ value: 'old', version: 1, pausedMs: 0 });
    weights.resume();
    expect(weights.state()).toMatchObject({ default: 1, pause: null });
  });

  it('ends a wait at the gate when the rollout is cancelled', async () => {
    const weights = new Weights();
    await weights.pause('abort');
    const cancel = new AbortController();
    const g = generation();
    const turn = weights.generate('r1', cancel.signal, g.run);
    cancel.abort(new Error('cancelled'));
    await expect(turn).rejects.toThrow('cancelled');
    expect(g.calls()).toBe(0);
  });

  it('restores a kept state, a pause included', async () => {
    const weights = new Weights();
    weights.announce(7, ['b0']);
    await weights.pause('finish');
    const again = new Weights();
    again.restore(JSON.parse(JSON.stringify(weights.state())));
    expect(again.state()).toEqual(weights.state());
    expect(again.paused).toBe(true);
    const g = generation();
    const turn = again.generate('r1', new AbortController().signal, g.run);
    await tick();
    expect(g.calls()).toBe(0);
    again.resume();
    await tick();
    g.finish('x');
    expect(await turn).toMatchObject({ value: 'x', version: 7 });
  });
});
