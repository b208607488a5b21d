import { defineEnvironment, type Environment } from '@rollserve/core';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore, trainingView, type RolloutResult, type RolloutService, type RolloutStore, type RolloutTaskInput, type Sampling } from '@rollserve/core/service';
import { startTestRolloutService } from '@rollserve/testing';
import { z } from 'zod';
import { heading, percentile } from './stats.ts';
import { startPolicyProcess } from './policy-process.ts';

// Dynamic sampling's cost at the service: a pool of groups every other one of which is all-equal
// by construction, sampled until 40% of the pool is kept, against running the whole pool plainly; and
// the training view's response cap against the uncapped view of a long multi-turn rollout. The store
// is a SQLite file (SAMPLING_BENCH_STORE=memory: in memory); the time the sampling spends writing its
// own records (what a restart goes on from) is reported apart.

/** 'same' rows score 1 in every sample; 'mixed' rows alternate 1, 0, 1, ... over their samples. */
const seen = new Map<string, number>();
const coin: Environment<any, any, any> = defineEnvironment({
  name: 'sampling-bench',
  domain: 'other',
  row: z.object({ key: z.string(), kind: z.enum(['same', 'mixed']) }),
  verify: (row) => {
    if (row.kind === 'same') return { reward: 1 };
    const count = seen.get(row.key) ?? 0;
    seen.set(row.key, count + 1);
    return { reward: count % 2 === 0 ? 1 : 0 };
  },
});

const task = (prefix: string, i: number): RolloutTaskInput => {
  const key = `${prefix}-${i}`;
  return { id: key, env: 'sampling-bench', n: 4, row: { responses_create_params: { input: key }, key, kind: i % 2 === 0 ? 'same' : 'mixed' }, policy: { model: 'fake-policy' } };
};

async function plain(svc: RolloutService, tasks: RolloutTaskInput[]): Promise<number> {
  const started = performance.now();
  const submitted = await svc.submit(tasks);
  await Promise.all(submitted.flatMap((t) => t.rolloutIds.map((id) => svc.wait(id))));
  return (performance.now() - started) / 1000;
}

async function sampled(svc: RolloutService, tasks: RolloutTaskInput[], groups: number, maxInFlight: number): Promise<{ seconds: number; sampling: Sampling }> {
  const started = performance.now();
  const { sampling } = await svc.sample(tasks, { groups, max_in_flight: maxInFlight, metric: 'reward' });
  await new Promise<void>((resolve) => {
    const check = () => {
      if (!sampling.finished) return;
      sampling.events.off('change', check);
      resolve();
    };
    sampling.events.on('change', check);
    check();
  });
  return { seconds: (performance.now() - started) / 1000, sampling };
}

/** A finished rollout of `turns` turns of `tokens` generated tokens each, with tool output between. */
function longResult(turns: number, tokens: number): RolloutResult {
  let prompt = Array.from({ length: 200 }, (_, i) => i);
  const records = [];
  for (let t = 0; t < turns; t++) {
    const generated = Array.from({ length: tokens }, (_, i) => 1000 + t * tokens + i);
    records.push({
      index: t,
      prompt_token_ids: prompt,
      generation_token_ids: generated,
      generation_logprobs: generated.map(() => -0.5),
      finish_reason: t + 1 < turns ? 'tool_calls' : 'length',
      tool_calls: [],
      code: null,
      status: 'none',
      malformed: null,
      rewards: { format: 0, tool: 1, outcome: 0, shaping: 0 },
      reward: 0,
      return: 0,
      normalized_return: null,
    });
    prompt = [...prompt, ...generated, ...Array.from({ length: 50 }, (_, i) => 900 + i)];
  }
  return { id: 'r', task_id: 't', sample_index: 0, reward: 1, advantage: 0, filter: false, credit: null, turns: records } as unknown as RolloutResult;
}

/** The store, its sampling records' writes timed (calls and milliseconds since the last `take`). */
function timedSamplingWrites(store: RolloutStore): { store: RolloutStore; take: () => { writes: number; ms: number } } {
  let writes = 0;
  let ms = 0;
  const timed = new Set(['putSampling', 'updateSampling', 'pruneSamplings']);
  const proxy = new Proxy(store, {
    get(target, key, receiver) {
      const value = Reflect.get(target, key, receiver) as unknown;
      if (typeof value !== 'function') return value;
      if (!timed.has(String(key))) return value.bind(target);
      return async (...args: unknown[]) => {
        const started = performance.now();
        try {
          return await (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
        } finally {
          writes++;
          ms += performance.now() - started;
        }
      };
    },
  });
  return {
    store: proxy,
    take: () => {
      const taken = { writes, ms };
      writes = 0;
      ms = 0;
      return taken;
    },
  };
}

export default async function bench(): Promise<void> {
  const pool = Number(process.env.SAMPLING_BENCH_POOL ?? 256);
  const keep = Math.floor(pool * 0.4);
  const inMemory = process.env.SAMPLING_BENCH_STORE === 'memory';
  heading(`dynamic sampling: a pool of ${pool} groups of 4 (every other one all-equal), ${keep} kept, zero-latency policy, store ${inMemory ? 'in memory' : 'a SQLite file'}`);
  const policy = await startPolicyProcess({ reply: 'ok' });
  const logLevel = process.env.ROLLSERVE_LOG_LEVEL;
  process.env.ROLLSERVE_LOG_LEVEL = 'warn';
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-sampling-bench-'));
  const opened = await openStore(inMemory ? 'sqlite::memory:' : `sqlite://${join(dir, 'store.db')}`);
  const { store, take } = timedSamplingWrites(opened);
  try {
    const { service, close } = await startTestRolloutService({ environments: [coin], backends: [policy.url], store });
    try {
      await plain(service, Array.from({ length: 32 }, (_, i) => task('warm', i))); // JIT, pools
      for (let run = 0; run < 3; run++) {
        take();
        const whole = await plain(service, Array.from({ length: pool }, (_, i) => task(`plain${run}`, i)));
        for (const maxInFlight of [keep, 2 * keep]) {
          const { seconds, sampling } = await sampled(service, Array.from({ length: pool }, (_, i) => task(`ds${run}-${maxInFlight}`, i)), keep, maxInFlight);
          const s = sampling.status();
          const records = take();
          console.log(
            `run ${run + 1}: whole pool plainly ${whole.toFixed(2)} s; sampled (max_in_flight ${maxInFlight}) ${seconds.toFixed(2)} s: ` +
              `${s.state}, tried ${s.tried}, kept ${s.kept}, all-equal ${s.dropped_all_equal}, cancelled ${s.cancelled}; ` +
              `its records: ${records.writes} writes, ${records.ms.toFixed(0)} ms in them`,
          );
        }
      }
    } finally {
      await close();
    }
  } finally {
    await opened.close();
    await rm(dir, { recursive: true, force: true });
    policy.child.kill('SIGTERM');
    if (logLevel === undefined) delete process.env.ROLLSERVE_LOG_LEVEL;
    else process.env.ROLLSERVE_LOG_LEVEL = logLevel;
  }

  heading('training view of a 20-turn rollout of 1,000 generated tokens a turn (~21k response tokens), with and without a cap');
  const result = longResult(20, 1_000);
  for (const [label, options] of [
    ['uncapped', {}],
    ['max_response_tokens 8192', { maxResponseTokens: 8_192 }],
  ] as const) {
    const times: number[] = [];
    for (let i = 0; i < 200; i++) {
      const started = performance.now();
      trainingView(result, options);
      times.push(performance.now() - started);
    }
    console.log(`${label}: p50 ${percentile(times, 50).toFixed(2)} ms  p99 ${percentile(times, 99).toFixed(2)} ms per view`);
  }
}
