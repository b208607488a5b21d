import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bashTool, defineEnvironment, type Environment } from '@rollserve/core';
import { serveFetch } from '@rollserve/core/gym';
import { createRolloutApi, type RolloutTaskInput } from '@rollserve/core/service';
import { startTestRolloutService } from '@rollserve/testing';
import { z } from 'zod';
import { heading, percentile } from './stats.ts';
import { startPolicyProcess } from './policy-process.ts';

// How long POST /v1/rollouts takes to answer 202 for a batch of sandboxed tasks (each one's INIT
// creates a bwrap sandbox) on a journaled service: accepting must not wait for the work to start.
// Also how long GET /health waits while that batch's sandboxes are being started behind it.

const shell: Environment<any, any, any> = defineEnvironment({
  name: 'submit-bench',
  domain: 'agent',
  row: z.object({}),
  tools: { bash: bashTool },
  sandbox: { network: false },
  verify: () => ({ reward: 1 }),
});


const task = (prefix: string, i: number): RolloutTaskInput => ({
  id: `${prefix}-${i}`,
  env: 'submit-bench',
  row: { responses_create_params: { input: `shell #${i}` } },
  policy: { model: 'fake-policy' },
});

/** Milliseconds from sending the batch to having read the 202. */
async function post(url: string, tasks: RolloutTaskInput[]): Promise<number> {
  const body = JSON.stringify({ tasks });
  const started = performance.now();
  const response = await fetch(`${url}/v1/rollouts`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const answer = (await response.json()) as { tasks?: unknown[] };
  const elapsed = performance.now() - started;
  if (response.status !== 202 || answer.tasks?.length !== tasks.length) throw new Error(`submit answered ${response.status}: ${JSON.stringify(answer).slice(0, 300)}`);
  return elapsed;
}

/** GET /health round trips, one after another, for `ms`. */
async function healthWhile(url: string, ms: number): Promise<number[]> {
  const latencies: number[] = [];
  const until = performance.now() + ms;
  while (performance.now() < until) {
    const started = performance.now();
    await (await fetch(`${url}/health`)).text();
    latencies.push(performance.now() - started);
    await new Promise((r) => setTimeout(r, 20));
  }
  return latencies;
}

export default async function bench(): Promise<void> {
  const runs = 3;
  const size = Number(process.env.SUBMIT_BENCH_TASKS ?? 1_000);
  const logLevel = process.env.ROLLSERVE_LOG_LEVEL;
  process.env.ROLLSERVE_LOG_LEVEL ??= 'silent'; // the services' own logs would drown the figures
  // The policy answers slowly: the batch's sandboxes are being created, not torn down, meanwhile.
  const policy = await startPolicyProcess({ reply: 'done', latencyMs: 10_000 });
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-submit-bench-'));
  try {
    for (const fsync of [false, true]) {
      heading(`submit: POST /v1/rollouts, 202 for ${size.toLocaleString('en')} sandboxed tasks in one body (SQLite store, synchronous ${fsync ? 'full' : 'normal'}; ${runs} runs)`);
      const one: number[] = [];
      const batch: number[] = [];
      const health: number[] = [];
      for (let run = 0; run < runs; run++) {
        const store = `sqlite://${join(dir, `store-${fsync}-${run}.db`)}${fsync ? '?synchronous=full' : ''}`;
        const { service, close } = await startTestRolloutService({ environments: [shell], backends: [policy.url], store });
        const server = await serveFetch(createRolloutApi(service));
        try {
          one.push(await post(server.url, [task(`one${run}`, 0)]));
          batch.push(await post(server.url, Array.from({ length: size }, (_, i) => task(`batch${run}`, i))));
          if (service.status().rollouts.total !== size + 1) throw new Error('the batch is not all known after its 202');
          health.push(...(await healthWhile(server.url, 2_000)));
        } finally {
          await server.close();
          await close();
        }
      }
      const fmt = (values: number[]) => `p50 ${percentile(values, 50).toFixed(1)} ms (runs: ${values.map((v) => v.toFixed(1)).join(', ')})`;
      console.log(`1 task (baseline): ${fmt(one)}`);
      console.log(`${size.toLocaleString('en')} tasks: ${fmt(batch)}  (target < 1 s)`);
      console.log(`GET /health in the 2 s after, while the batch starts: p50 ${percentile(health, 50).toFixed(1)} ms  p99 ${percentile(health, 99).toFixed(1)} ms  max ${Math.max(...health).toFixed(1)} ms`);
    }
  } finally {
    policy.child.kill('SIGTERM');
    if (logLevel === undefined) delete process.env.ROLLSERVE_LOG_LEVEL;
    await rm(dir, { recursive: true, force: true });
  }
}
