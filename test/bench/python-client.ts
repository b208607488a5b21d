import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { defineEnvironment } from '@rollserve/core';
import { startRolloutServer, type RolloutTaskInput } from '@rollserve/core/service';
import { z } from 'zod';
import { heading, percentile } from './stats.ts';
import { startPolicyProcess } from './policy-process.ts';

// Rollouts/s of single-turn rollouts (zero-latency scripted policy in its own process) submitted
// and streamed back through the Python client (clients/python, Debian's python3), against the same
// through HTTP from Node, in the same run, on the same service: the client's cost. The environment
// checks the answer in-process (no grader workers), so the service side is as cheap as it gets and
// the client's share as large as it gets.

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PYTHON = process.env.PYTHON ?? '/usr/bin/python3';


const exact = defineEnvironment({
  name: 'exact-bench',
  domain: 'other',
  row: z.object({ expected_answer: z.string() }),
  verify: (row, response) => ({ reward: JSON.stringify(response.output).includes(`\\\\boxed{${row.expected_answer}}`) ? 1 : 0 }),
});

const template: RolloutTaskInput = {
  env: 'exact-bench',
  row: { responses_create_params: { input: 'What is 3+5? (#{i})' }, question: 'What is 3+5?', expected_answer: '8' },
  policy: { model: 'fake-policy' },
};

interface Run {
  seconds: number;
  submitMs: number;
  results: number;
}

/** What the client does, from Node: one POST with uuid ids, then NDJSON streams of ~150 ids each. */
async function viaNode(url: string, count: number): Promise<Run> {
  const tasks = Array.from({ length: count }, (_, i) => ({
    ...template,
    id: randomUUID(),
    row: { ...template.row, responses_create_params: { input: `What is 3+5? (#${i})` } },
  }));
  const started = performance.now();
  const response = await fetch(`${url}/v1/rollouts`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ tasks }) });
  const answer = (await response.json()) as { tasks: Array<{ rollout_ids: string[] }> };
  const submitMs = performance.now() - started;
  if (response.status !== 202) throw new Error(`submit answered ${response.status}`);
  const ids = answer.tasks.flatMap((t) => t.rollout_ids);
  const chunks: string[][] = [];
  for (let i = 0; i < ids.length; i += 150) chunks.push(ids.slice(i, i + 150));
  let results = 0;
  await Promise.all(
    chunks.map(async (chunk) => {
      const stream = await fetch(`${url}/v1/rollouts/stream?format=ndjson&ids=${chunk.join(',')}`);
      const decoder = new TextDecoder();
      let buffered = '';
      for await (const part of stream.body!) {
        buffered += decoder.decode(part, { stream: true });
        let newline: number;
        while ((newline = buffered.indexOf('\n')) >= 0) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          if (line.trim()) {
            JSON.parse(line);
            results++;
          }
        }
      }
    }),
  );
  return { seconds: (performance.now() - started) / 1000, submitMs, results };
}

async function viaPython(url: string, count: number, mode: 'sync' | 'async'): Promise<Run & { processSeconds: number; cpuSeconds: number }> {
  const script = `${ROOT}clients/python/benchmarks/throughput.py`;
  const started = performance.now();
  const output = await new Promise<string>((resolve, reject) => {
    const child = spawn(PYTHON, [script, JSON.stringify({ url, count, mode, task: template })], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' } });
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`python exited with ${code}: ${out}`))));
  });
  const report = JSON.parse(output) as { seconds: number; submit_ms: number; results: number; rewards: number; cpu_seconds: number };
  if (report.rewards !== count) throw new Error(`${count - report.rewards} of ${count} rollouts got no reward: ${output}`);
  return { seconds: report.seconds, submitMs: report.submit_ms, results: report.results, cpuSeconds: report.cpu_seconds, processSeconds: (performance.now() - started) / 1000 };
}

export default async function bench(): Promise<void> {
  const count = Number(process.env.PYTHON_CLIENT_BENCH_TASKS ?? 1_000);
  const rounds = Number(process.env.PYTHON_CLIENT_BENCH_ROUNDS ?? 5);
  const logLevel = process.env.ROLLSERVE_LOG_LEVEL;
  process.env.ROLLSERVE_LOG_LEVEL ??= 'silent';
  heading(`python client: ${count.toLocaleString('en')} single-turn rollouts per run, Python client (sync, asyncio) against Node HTTP (${rounds} runs each, interleaved)`);
  const policy = await startPolicyProcess({ reply: '\\boxed{8}' });
  const server = await startRolloutServer({ environments: [exact], llmBackends: [policy.url] });
  try {
    // Warm-up: JIT, grader workers, the first connections.
    await viaNode(server.url, 200);
    await viaPython(server.url, 200, 'sync');
    const node: Run[] = [];
    const sync: Array<Run & { processSeconds: number; cpuSeconds: number }> = [];
    const asyncio: Array<Run & { processSeconds: number; cpuSeconds: number }> = [];
    for (let round = 0; round < rounds; round++) {
      node.push(await viaNode(server.url, count));
      sync.push(await viaPython(server.url, count, 'sync'));
      asyncio.push(await viaPython(server.url, count, 'async'));
    }
    for (const run of [...node, ...sync, ...asyncio]) if (run.results !== count) throw new Error(`a run read ${run.results} of ${count} results`);
    const rate = (runs: Run[]) => percentile(runs.map((r) => count / r.seconds), 50);
    const nodeRate = rate(node);
    const line = (name: string, runs: Run[]) => {
      const r = rate(runs);
      const slower = (1 - r / nodeRate) * 100;
      const overheadMs = ((1 / r - 1 / nodeRate) * 1000).toFixed(3);
      const submit = percentile(runs.map((x) => x.submitMs), 50).toFixed(1);
      return `${name}: ${r.toFixed(0)} rollouts/s (runs: ${runs.map((x) => (count / x.seconds).toFixed(0)).join(', ')}), submit 202 p50 ${submit} ms${runs === node ? '' : `; ${(r / nodeRate).toFixed(3)} of Node's rate, ${slower >= 0 ? `${slower.toFixed(1)} % slower` : `${(-slower).toFixed(1)} % faster (noise)`} (target: < 10 % slower), ${overheadMs} ms per rollout`}`;
    };
    console.log(line('Node HTTP (fetch)', node));
    console.log(line('Python Client (sync)', sync));
    console.log(line('Python AsyncClient', asyncio));
    const cpu = (runs: Array<{ cpuSeconds: number }>) => ((percentile(runs.map((r) => r.cpuSeconds), 50) / count) * 1000).toFixed(3);
    console.log(`Python client CPU (its process, submit to last result): p50 ${cpu(sync)} ms per rollout (sync), ${cpu(asyncio)} ms (asyncio)`);
    console.log(`python3 process wall time with interpreter start: p50 ${percentile(sync.map((r) => r.processSeconds), 50).toFixed(2)} s (sync), ${percentile(asyncio.map((r) => r.processSeconds), 50).toFixed(2)} s (asyncio)`);
  } finally {
    await server.close();
    policy.child.kill('SIGTERM');
    if (logLevel === undefined) delete process.env.ROLLSERVE_LOG_LEVEL;
  }
}
