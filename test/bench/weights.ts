import { LlmBackendPool, PoolModelProvider, RolloutService, type RolloutTaskInput } from '@rollserve/core/service';
import { counterEnvironment } from '@rollserve/testing';
import { heading } from './stats.ts';
import { startPolicyProcess } from './policy-process.ts';

// The cost of a pause for a weight update with 512 multi-turn rollouts in flight: throughput
// (policy turns per second) before the pause, how long the pause takes to drain the generations
// in flight (abort mode), and after the resume how soon the first turn is generated and the
// throughput is back to 90% of what it was before, all in the same run.

const IN_FLIGHT = 512;
const LATENCY_MS = 250;
const WINDOW_MS = 500;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export default async function bench(): Promise<void> {
  heading(`weights: a pause/resume cycle with ${IN_FLIGHT} ten-turn-plus tool rollouts in flight (policy ${LATENCY_MS} ms per turn)`);
  const policy = await startPolicyProcess({ tool: 'increment_counter', reply: '{"count": 1}', turns: 200, latencyMs: LATENCY_MS });
  // each generation that came back, by when
  const done: number[] = [];
  const pool = new LlmBackendPool({ onRequest: (event) => event.outcome === 'ok' && done.push(performance.now()) });
  pool.add({ id: 'policy', baseUrl: policy.url });
  const models = new PoolModelProvider(pool);
  const service = await RolloutService.create({ environments: [counterEnvironment], models });
  try {
    await service.announceWeights(0);
    const tasks: RolloutTaskInput[] = Array.from({ length: IN_FLIGHT }, (_, i) => ({
      env: 'counter',
      row: { responses_create_params: { input: `count #${i}` }, initial_count: 0, expected_count: 0 },
      policy: { model: 'fake-policy' },
      limits: { max_turns: 1_000, time_limit_s: 3_600 },
    }));
    await service.submit(tasks);
    while (service.weightState().in_flight < IN_FLIGHT) await sleep(20);
    // steady state first, then the rate before the pause
    await sleep(2_000);
    const rate = (from: number, to: number) => (done.filter((t) => t >= from && t < to).length * 1_000) / (to - from);
    const beforeEnd = performance.now();
    const before = rate(beforeEnd - 2_000, beforeEnd);

    const paused = await service.pauseGeneration('abort');
    // the trainer loads its weights
    await sleep(1_000);
    const resumedAt = performance.now();
    await service.resumeGeneration(1);
    const resumeCallMs = performance.now() - resumedAt;
    // back to 90% of the rate before: the end of the first window after the resume at that rate
    let backMs = Number.NaN;
    for (let waited = 0; waited < 10_000 && Number.isNaN(backMs); waited += 50) {
      await sleep(50);
      const now = performance.now();
      for (let end = resumedAt + WINDOW_MS; end <= now; end += 25) {
        if (rate(end - WINDOW_MS, end) >= 0.9 * before) {
          backMs = end - resumedAt;
          break;
        }
      }
    }
    // (the rollouts come back in step: the rate swings for a few seconds)
    const series: string[] = [];
    while (performance.now() < resumedAt + 4_000) await sleep(100);
    for (let k = 0; k < 4; k++) series.push(rate(resumedAt + k * 1_000, resumedAt + (k + 1) * 1_000).toFixed(0));
    const first = done.find((t) => t >= resumedAt);
    console.log(
      `before the pause ${before.toFixed(0)} turns/s; pause (abort) drained ${paused.in_flight} generations in ${paused.drained_ms.toFixed(1)} ms; ` +
        `resume call ${resumeCallMs.toFixed(1)} ms, first turn back after ${first === undefined ? 'none' : `${(first - resumedAt).toFixed(0)} ms`}; ` +
        `back to 90% of the throughput within ${backMs.toFixed(0)} ms (a ${WINDOW_MS} ms window; target < 1000 ms); each second after the resume: ${series.join(', ')} turns/s`,
    );
  } finally {
    await service.close();
    await models.close();
    policy.child.kill('SIGTERM');
  }
}
