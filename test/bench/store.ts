import { execFileSync } from 'node:child_process';
import { mkdtemp, open, rm, stat } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { openStore, RolloutTask, type RolloutResult, type RolloutStore } from '@rollserve/core/service';
import { startTestPostgres } from '@rollserve/testing';
import { heading, latencyLine } from './stats.ts';

// The store (packages/core/src/store): claims + commits per second with realistic ~5 KB results,
// embedded (SQLite, WAL, synchronous=NORMAL) and PostgreSQL (fsync on, as in production), and the
// process's memory while 100,000 results are stored (results leave memory once committed).

const RESULTS = Number(process.env.STORE_BENCH_RESULTS ?? 100_000);
const THROUGHPUT_ROLLOUTS = Number(process.env.STORE_BENCH_ROLLOUTS ?? 5_000);

const task = (id: string): RolloutTask =>
  RolloutTask.parse({ id, env: 'math', row: { responses_create_params: { input: `What is ${id} squared? Think step by step.` }, expected_answer: '42' }, policy: { model: 'policy' } });

/** A ~5 KB result: three turns with token ids and logprobs, the messages and a tool call. */
function payload(id: string): RolloutResult {
  const tokens = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (seed * 7919 + i * 104_729) % 151_000);
  const turn = (index: number) => ({
    index,
    prompt_token_ids: null,
    generation_token_ids: tokens(60, index),
    generation_logprobs: tokens(60, index + 3).map((t) => -(t % 1000) / 1000),
    finish_reason: 'stop',
    text: 'Let me compute that with the calculator tool and check the result twice. ',
    reasoning: null,
    tool_calls: [{ id: `call_${index}`, name: 'python', arguments: '{"code":"print(6*7)"}', output: '42\n', status: 'ok' as const, execution: { exit_code: 0, timed_out: false, exception: null }, code: 'print(6*7)', duration_ms: 12.5 }],
    llm_latency_ms: 250,
    backend: 'b0',
    code: 'print(6*7)',
    status: 'ok' as const,
    malformed: null,
    rewards: { format: 0, tool: 1, outcome: null, shaping: null },
    reward: 0.25,
    return: 0.9,
    normalized_return: 0.1,
  });
  return {
    id,
    task_id: id,
    sample_index: 0,
    env: 'math',
    state: 'done',
    reward: 1,
    reward_components: { correctness: 1 },
    verify_extras: { extracted_answer: '42', expected_answer: '42' },
    critical_error: null,
    filter: false,
    error: null,
    advantage: 0.5,
    credit: null,
    timing: { init: { queued_ms: 1, active_ms: 20 }, run: { queued_ms: 2, active_ms: 900 }, eval: { queued_ms: 0, active_ms: 15 }, total_ms: 940 },
    response: null,
    messages: [
      { role: 'system', content: 'You are a careful assistant. Use the python tool to check arithmetic before answering.' },
      { role: 'user', content: `What is ${id} squared? Think step by step.` },
      { role: 'assistant', content: 'The answer is \\boxed{42}.' },
    ],
    turns: [turn(0), turn(1), turn(2)] as RolloutResult['turns'],
    weight_version_min: null,
    weight_version_max: null,
    stale: false,
    finished_at: new Date().toISOString(),
  };
}

/** `workers` loops of claim(up to `batch`) + one commit per rollout until the queue is empty; rollouts per second. */
async function claimCommitRate(store: RolloutStore, prefix: string, count: number, workers: number, batch: number): Promise<{ perSecond: number; latencies: number[] }> {
  for (let i = 0; i < count; i += 1_000) await store.putTasks(Array.from({ length: Math.min(1_000, count - i) }, (_, k) => task(`${prefix}-${i + k}`)));
  const latencies: number[] = [];
  let done = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      for (;;) {
        const t0 = performance.now();
        const work = await store.claim({ workerId: `w${w}`, limit: batch, leaseMs: 60_000 });
        if (work.length === 0) return;
        for (const rollout of work) {
          const outcome = await store.commit({ rolloutId: rollout.id, attempt: rollout.attempt, result: payload(rollout.id), workerId: `w${w}` });
          if (outcome.status !== 'committed') throw new Error(`commit of ${rollout.id}: ${outcome.status}`);
          done++;
        }
        latencies.push(performance.now() - t0);
      }
    }),
  );
  const seconds = (performance.now() - started) / 1_000;
  if (done !== count) throw new Error(`${done} of ${count} rollouts committed`);
  return { perSecond: count / seconds, latencies };
}

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;

// A full collection before each reading, so that the heap figure is what is retained, not garbage.
setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const memory = () => {
  gc();
  const { rss, heapUsed } = process.memoryUsage();
  return `RSS ${mib(rss)}, heap ${mib(heapUsed)}`;
};

/** Stores `total` results (claims of 100, one commit each), printing RSS as it goes. */
async function fill(store: RolloutStore, prefix: string, total: number, size: () => Promise<number>): Promise<void> {
  const checkpoints = new Set([total / 10, total / 4, total / 2, (3 * total) / 4, total].map(Math.round));
  let stored = 0;
  const started = performance.now();
  console.log(`before: ${memory()}`);
  while (stored < total) {
    const batch = Math.min(1_000, total - stored);
    await store.putTasks(Array.from({ length: batch }, (_, k) => task(`${prefix}-${stored + k}`)));
    for (let claimed = 0; claimed < batch; ) {
      const work = await store.claim({ workerId: 'filler', limit: 100, leaseMs: 600_000 });
      await Promise.all(work.map((w) => store.commit({ rolloutId: w.id, attempt: w.attempt, workerId: 'filler', result: payload(w.id) })));
      claimed += work.length;
    }
    stored += batch;
    if (checkpoints.has(stored)) {
      console.log(`${stored.toLocaleString('en').padStart(7)} results: ${memory()}, on disk ${mib(await size())}  (${((performance.now() - started) / 1_000).toFixed(0)} s)`);
    }
  }
  const counts = await store.counts();
  if (counts.done !== total) throw new Error(`stored ${counts.done} of ${total}`);
  const last = await store.getResult(`${prefix}-${total - 1}`);
  if (last?.turns.length !== 3) throw new Error('the last result does not read back');
}

/** What bounds a durable commit on this disk: 8 KB appended + fdatasync, 200 times. */
async function fsyncLatencies(dir: string): Promise<number[]> {
  const file = await open(join(dir, 'fsync-probe'), 'a');
  const block = Buffer.alloc(8_192, 1);
  const latencies: number[] = [];
  try {
    for (let i = 0; i < 200; i++) {
      const started = performance.now();
      await file.write(block);
      await file.datasync();
      latencies.push(performance.now() - started);
    }
  } finally {
    await file.close();
  }
  return latencies;
}

export default async function bench(): Promise<void> {
  console.log(`(load average ${loadavg().map((l) => l.toFixed(1)).join(' ')} on ${cpus().length} cores; result payload: ${(JSON.stringify(payload('t-12345')).length / 1024).toFixed(1)} KB of JSON)`);
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-store-bench-'));
  const postgres = await startTestPostgres({ fsync: true });
  try {
    console.log(`this disk: 8 KB write + fdatasync ${latencyLine(await fsyncLatencies(dir))}`);
    for (const batch of [1, 8]) {
      heading(`store: SQLite (WAL, synchronous=NORMAL), one process, claims of ${batch} + a commit per rollout, ${THROUGHPUT_ROLLOUTS.toLocaleString('en')} rollouts`);
      const sqlite = await openStore(`sqlite://${join(dir, `throughput-${batch}.db`)}`);
      try {
        const { perSecond, latencies } = await claimCommitRate(sqlite, 's', THROUGHPUT_ROLLOUTS, 1, batch);
        console.log(`${perSecond.toFixed(0)} rollouts/s  (target ≥ 2,000/s)  claim + ${batch} commit${batch > 1 ? 's' : ''}: ${latencyLine(latencies)}`);
      } finally {
        await sqlite.close();
      }
    }
    for (const [workers, batch] of [[1, 1], [8, 1], [8, 8]] as const) {
      heading(`store: PostgreSQL (fsync on, loopback TCP), ${workers} concurrent worker${workers > 1 ? 's' : ''}, claims of ${batch} + a commit per rollout, ${THROUGHPUT_ROLLOUTS.toLocaleString('en')} rollouts`);
      const pg = await openStore(await postgres.createDatabase(), { poolSize: workers });
      try {
        const { perSecond, latencies } = await claimCommitRate(pg, 'p', THROUGHPUT_ROLLOUTS, workers, batch);
        console.log(`${perSecond.toFixed(0)} rollouts/s  (target ≥ 500/s)  claim + ${batch} commit${batch > 1 ? 's' : ''}: ${latencyLine(latencies)}`);
      } finally {
        await pg.close();
      }
    }

    heading(`store: memory of this process while ${RESULTS.toLocaleString('en')} results are stored (SQLite; target: RSS flat)`);
    const file = join(dir, 'memory.db');
    const big = await openStore(`sqlite://${file}`);
    try {
      const size = async () => (await stat(file)).size + (await stat(`${file}-wal`).catch(() => ({ size: 0 }))).size;
      await fill(big, 'm', RESULTS, size);
    } finally {
      await big.close();
    }

    heading(`store: memory of this process while ${RESULTS.toLocaleString('en')} results are stored (PostgreSQL; target: RSS flat)`);
    const pgBig = await openStore(await postgres.createDatabase());
    try {
      const size = async () => Number(execFileSync('du', ['-sb', postgres.dataDir], { encoding: 'utf8' }).split('\t')[0]);
      await fill(pgBig, 'm', RESULTS, size);
    } finally {
      await pgBig.close();
    }
  } finally {
    await postgres.close();
    await rm(dir, { recursive: true, force: true });
  }
}
