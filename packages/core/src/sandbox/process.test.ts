import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { killTree } from './process.ts';

describe('killTree by an environment tag', () => {
  const started: ChildProcess[] = [];
  const tagged = (tag: string): ChildProcess => {
    const child = spawn('sleep', ['60'], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', RS_TEST_TAG: tag }, stdio: 'ignore' });
    started.push(child);
    return child;
  };
  const ended = (child: ChildProcess): Promise<NodeJS.Signals | null> =>
    child.exitCode !== null || child.signalCode !== null ? Promise.resolve(child.signalCode) : new Promise((resolve) => child.once('exit', (_code, signal) => resolve(signal)));
  const alive = (child: ChildProcess): boolean => child.exitCode === null && child.signalCode === null;
  afterEach(() => {
    for (const child of started.splice(0)) child.kill('SIGKILL');
  });

  it('looks only at the candidates it is given (a sandbox cgroup), and at every process of the host without them', async () => {
    const tag = `RS_TEST_TAG=${randomBytes(6).toString('hex')}`;
    const value = tag.split('=')[1]!;
    const inside = tagged(value);
    const outside = tagged(value);
    const other = tagged('another');
    await new Promise((resolve) => setTimeout(resolve, 50));
    killTree(undefined, { envTag: tag, candidates: () => [inside.pid!] });
    expect(await ended(inside)).toBe('SIGKILL');
    expect(alive(outside)).toBe(true);
    // candidates that cannot be read (a cgroup removed): the whole host, as before
    killTree(undefined, { envTag: tag, candidates: () => undefined });
    expect(await ended(outside)).toBe('SIGKILL');
    expect(alive(other)).toBe(true);
  });
});
