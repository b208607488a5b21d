import { availableParallelism, loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import { createCodeRunner, type CodeRunner, type Submission } from '@rollserve/env-code';
import { heading, latencyLine, percentile } from './stats.ts';

// Code verification in the sandbox (bwrap by default): one sandbox and one Python per submission,
// as /verify runs it. A typical competitive-programming answer (read, compute, print) on n tests.

const SOLUTION = [
  'import sys',
  'def main():',
  '    data = sys.stdin.read().split()',
  '    n = int(data[0])',
  '    xs = list(map(int, data[1:1 + n]))',
  '    best = cur = xs[0]',
  '    for x in xs[1:]:',
  '        cur = max(x, cur + x)',
  '        best = max(best, cur)',
  '    print(best)',
  'if __name__ == "__main__":',
  '    main()',
].join('\n');

export function problem(tests: number): Submission {
  const inputs: string[] = [];
  const outputs: string[] = [];
  for (let t = 0; t < tests; t++) {
    const xs = Array.from({ length: 200 }, (_, i) => ((i * 7919 + t * 104729) % 201) - 100);
    let best = xs[0]!;
    let cur = xs[0]!;
    for (const x of xs.slice(1)) {
      cur = Math.max(x, cur + x);
      best = Math.max(best, cur);
    }
    inputs.push(`${xs.length}\n${xs.join(' ')}\n`);
    outputs.push(`${best}\n`);
  }
  return { code: SOLUTION, inputs, outputs, fnName: null, timeoutSecs: 10 };
}

/** NeMo Gym code_gen's verifications/s on this machine (issue 28: 11-12/s; it cannot be installed here to run beside). */
const CODE_GEN_PER_S = 11.5;
/** This bench before the grading parent left the sandbox (README, "Code verification, where its CPU goes"). */
const PREVIOUS =
  'before (three runs alternating with this one, load 8-13): 22.5-31.4 submissions/s against 26.8-37.1; ' +
  'perf (six pairs, load 6-11): 28.6-34.4 ms of CPU per verification against 22.7-30.4 now';

async function throughput(runner: CodeRunner, submission: Submission, count: number, concurrency: number) {
  const latencies: number[] = [];
  let next = 0;
  let failures = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        next++;
        const t0 = performance.now();
        const { result } = await runner.run(submission);
        latencies.push(performance.now() - t0);
        if (!result.every((r) => r === true)) failures++;
      }
    }),
  );
  const seconds = (performance.now() - start) / 1000;
  return { perSecond: count / seconds, latencies, failures };
}

export default async function bench(): Promise<void> {
  const cores = availableParallelism();
  heading(`code verification in the sandbox (${cores} cores)`);
  const concurrency = 8;
  const runner = createCodeRunner({ concurrency });
  try {
    await throughput(runner, problem(10), 16, concurrency); // warm-up: page cache, warm sandboxes
    const ten = await throughput(runner, problem(10), 200, concurrency);
    console.log(
      `10-test problem, concurrency ${concurrency}: ${ten.perSecond.toFixed(1)} submissions/s ` +
        `(${(ten.perSecond / CODE_GEN_PER_S).toFixed(1)}× NeMo Gym code_gen's ${CODE_GEN_PER_S}/s, issue 28's target ≥ 5×; load ${loadavg()[0]!.toFixed(1)})  ` +
        `${latencyLine(ten.latencies)}${ten.failures > 0 ? `  FAILURES ${ten.failures}` : ''}`,
    );
    console.log(`previous figure: ${PREVIOUS}`);
    // Cost per test: the same answer on 1 and on 1000 tests, one at a time, interleaved; medians.
    const small = problem(1);
    const large = problem(1000);
    const smallTimes: number[] = [];
    const largeTimes: number[] = [];
    for (let i = 0; i < 15; i++) {
      smallTimes.push((await throughput(runner, small, 1, 1)).latencies[0]!);
      largeTimes.push((await throughput(runner, large, 1, 1)).latencies[0]!);
    }
    const fixed = percentile(smallTimes, 50);
    const perTestMs = (percentile(largeTimes, 50) - fixed) / 999;
    console.log(`fixed cost per submission (sandbox + Python + harness, 1 test): p50 ${fixed.toFixed(1)} ms`);
    console.log(`cost per test: ${(perTestMs * 1000).toFixed(0)} µs  (1000-test submission p50 ${percentile(largeTimes, 50).toFixed(1)} ms)`);
  } finally {
    await runner.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await bench();
