import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import type { Grader } from './grader.ts';
import { createGrader, createInlineGrader } from './grader.ts';

const open: Grader[] = [];
function pool(...args: Parameters<typeof createGrader>): Grader {
  const grader = createGrader(...args);
  open.push(grader);
  return grader;
}
afterAll(async () => {
  await Promise.all(open.map((g) => g.close()));
});

describe('pooled grader (TypeScript worker, from source)', () => {
  it('grades in worker threads', async () => {
    const grader = pool({ timeoutSeconds: 10 });
    expect(grader.threads).toBeGreaterThanOrEqual(1);
    const results = await Promise.all([
      grader.grade('\\(\\sqrt{2}\\)', 'so \\boxed{\\sqrt{2}}'),
      grader.grade('\\(\\frac{333}{1997}\\)', '\\boxed{\\frac{83}{499}}'),
      grader.grade('32', '\\boxed{32}'),
      grader.grade('-3', '\\boxed{-4}'),
    ]);
    expect(results).toEqual([
      { reward: 1, extracted_answer: 'sqrt(2)', timedOut: false },
      { reward: 0, extracted_answer: '83/499', timedOut: false },
      { reward: 1, extracted_answer: '32', timedOut: false },
      { reward: 0, extracted_answer: '-4', timedOut: false },
    ]);
  });

  it('caps the threads at the concurrency asked for', () => {
    expect(pool({ maxConcurrency: 1 }).threads).toBe(1);
  });

  const limit = 10;
  // [name, expected answer, model output, reward]
  const pathological: Array<[string, string, string, number]> = [
    ['a tower of powers', '5', '\\boxed{10^{10^{10}}}', 0],
    ['a tower with a symbol', 'x', '\\boxed{x^{10^{10}}+y}', 0],
    ['a tiny power', '5', '\\boxed{10^{-10^{10}}+5}', 0],
    ['a huge binomial power', '1', '\\boxed{(1+x)^{1000000}}', 0],
    // Too deep to parse; the plain-number fallback still finds the 7.
    // Math-Verify cannot parse it either (latex2sympy recurses once per brace: Python's recursion
    // limit), so math_with_judge gives 0.
    ['5,000 nested braces', '7', `\\boxed{${'{'.repeat(5000)}7${'}'.repeat(5000)}}`, 0],
    ['5,000 unbalanced braces', '8', `\\boxed{${'{'.repeat(5000)}7}`, 0],
    ['a 1 MB answer', '5', `\\boxed{${'1+'.repeat(500_000)}1}`, 0],
    ['a 1 MB output without an answer', '5', 'x'.repeat(1_000_000), 0],
    ['a huge factorial', '5', '\\boxed{1000000!}', 0],
    ['100,000 unclosed \\boxed{', '5', '\\boxed{'.repeat(100_000), 0],
    ['100,000 unclosed \\[', '5', '\\['.repeat(100_000), 0],
    ['20,000 unclosed final answers', '5', 'final answer \\[ '.repeat(20_000), 0],
    ['a sine of a huge number', '0', '\\boxed{\\sin(10^{10^{5}})}', 0],
  ];
  let shared: Grader | undefined;
  it.each(pathological)('%s comes back within the limit', async (_name, expected, text, reward) => {
    const grader = (shared ??= pool({ timeoutSeconds: limit, maxConcurrency: 2 }));
    // a call past the hard limit comes back as a time-out (reward 0), never hangs the pool
    const result = await grader.grade(expected, text);
    expect(result.error).toBeUndefined();
    if (result.timedOut) expect(result).toMatchObject({ reward: 0, extracted_answer: null });
    expect(result.reward).toBe(reward);
  }, 60_000);

  it('a slow grading times out with reward 0 and the pool keeps working', async () => {
    // Equal magnitudes, no common term, not rational: only the engine's 300-digit evaluation of
    // 100000! can settle it, which takes many seconds.
    const grader = pool({ timeoutSeconds: 1, maxConcurrency: 2 });
    const slow = await grader.grade('100000!\\cdot 2\\sqrt{2}', '\\boxed{100000!\\sqrt{8}+1}');
    expect(slow).toEqual({ reward: 0, extracted_answer: null, timedOut: true });
    const after = await Promise.all([grader.grade('2', '\\boxed{2}'), grader.grade('3', '\\boxed{\\frac{6}{2}}')]);
    expect(after.map((r) => r.reward)).toEqual([1, 1]);
  }, 60_000);
});

describe('a stuck worker', () => {
  const stuck = fileURLToPath(new URL('./fixtures/stuck-worker.mjs', import.meta.url));

  it('is terminated at the time limit, and later calls still work', async () => {
    const grader = pool({ timeoutSeconds: 1, maxConcurrency: 2, workerFilename: stuck });
    const hung = await grader.grade('1', 'HANG');
    expect(hung).toEqual({ reward: 0, extracted_answer: null, timedOut: true });
    // Both threads hang at once, then the pool is used again.
    const both = await Promise.all([grader.grade('1', 'HANG'), grader.grade('1', 'HANG')]);
    expect(both.every((r) => r.timedOut)).toBe(true);
    const after = await Promise.all([grader.grade('a', 'a'), grader.grade('a', 'b'), grader.grade('c', 'c')]);
    expect(after).toEqual([
      { reward: 1, extracted_answer: 'a', timedOut: false },
      { reward: 0, extracted_answer: 'b', timedOut: false },
      { reward: 1, extracted_answer: 'c', timedOut: false },
    ]);
  }, 60_000);

  it('calls beyond the thread count wait for a thread; their time limit starts then', async () => {
    const grader = pool({ timeoutSeconds: 1, maxConcurrency: 1, workerFilename: stuck });
    const results = await Promise.all([grader.grade('1', 'HANG'), grader.grade('x', 'x')]);
    expect(results[0]?.timedOut).toBe(true);
    expect(results[1]).toEqual({ reward: 1, extracted_answer: 'x', timedOut: false });
  }, 60_000);

  it('a worker that cannot start gives reward 0 with the error, and does not crash the process', async () => {
    const broken = fileURLToPath(new URL('./fixtures/broken-worker.mjs', import.meta.url));
    const grader = pool({ timeoutSeconds: 1, maxConcurrency: 1, workerFilename: broken });
    const result = await grader.grade('1', '1');
    expect(result).toMatchObject({ reward: 0, extracted_answer: null, timedOut: false });
    expect(result.error).toMatch(/broken worker/);
  });

  it('a closed grader answers reward 0 instead of throwing', async () => {
    const grader = createGrader({ workerFilename: stuck, maxConcurrency: 1 });
    await grader.close();
    expect(await grader.grade('a', 'a')).toMatchObject({ reward: 0, timedOut: false, error: 'grader closed' });
  });
});

describe('inline grader', () => {
  it('grades in the calling thread with the same interface', async () => {
    const grader = createInlineGrader();
    expect(await grader.grade('\\frac{1}{2}', '\\boxed{0.5}')).toEqual({
      reward: 1,
      extracted_answer: '1/2',
      timedOut: false,
    });
    await grader.close();
  });
});

const dist = fileURLToPath(new URL('../dist/index.js', import.meta.url));

describe('pooled grader (JavaScript worker, from the build)', () => {
  // Build first: pnpm exec tsc -b environments/math
  it.skipIf(!existsSync(dist))('works from dist with plain node', async () => {
    const script = `
      const { createGrader } = await import(${JSON.stringify(dist)});
      const grader = createGrader({ timeoutSeconds: 10, maxConcurrency: 2 });
      const results = await Promise.all([
        grader.grade('\\\\(\\\\sqrt{2}\\\\)', '\\\\boxed{\\\\sqrt{2}}'),
        grader.grade('5', '\\\\boxed{10^{10^{10}}}'),
      ]);
      await grader.close();
      console.log(JSON.stringify(results));
    `;
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], { timeout: 60_000 });
    expect(JSON.parse(stdout)).toEqual([
      { reward: 1, extracted_answer: 'sqrt(2)', timedOut: false },
      { reward: 0, extracted_answer: '10**(10**10)', timedOut: false },
    ]);
  }, 60_000);
});
