import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startPolicyProcess } from './policy-process.ts';
import { adopt, cpuSeconds, dispatcher, load, mathTask, openStream, pollUntil, rssBytes, startService, stopAll, submit, type WireResult } from './cluster.ts';
import { heading } from './stats.ts';

// `pnpm bench service-memory`: the memory of `rollserve start` (SQLite store) while 100,000 results
// go through it: a zero-latency scripted policy in its own process, single-turn math tasks
// submitted in batches, results read from one NDJSON stream. Results leave memory once stored, so
// the service's RSS should stay flat, not grow with history. The heap is read without changing
// the product: a preload (`--import data:...`, `--expose-gc`) answers SIGUSR2 with a full
// collection and process.memoryUsage() written to a file.

const TOTAL = Number(process.env.SERVICE_MEMORY_ROLLOUTS ?? 100_000);
const BATCH = Number(process.env.SERVICE_MEMORY_BATCH ?? 2_000);
const EVERY = TOTAL / 10;

const PROBE = `
import { writeFileSync } from 'node:fs';
let seq = 0;
process.on('SIGUSR2', () => {
  globalThis.gc?.();
  writeFileSync(process.env.ROLLSERVE_BENCH_HEAP_FILE, JSON.stringify({ seq: ++seq, ...process.memoryUsage() }));
});`;

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;

export default async function bench(): Promise<void> {
  heading(`rollserve start (SQLite store): memory while ${TOTAL.toLocaleString('en')} single-turn math results go through it (batches of ${BATCH.toLocaleString('en')}, zero-latency policy in its own process; target: RSS flat)`);
  console.log(`(${load()} at the start)`);
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-memory-bench-'));
  const heapFile = join(dir, 'heap.json');
  const storeFile = join(dir, 'store.db');
  const policy = await startPolicyProcess({ reply: '\\boxed{8}' });
  adopt(policy.child, 'policy');
  try {
    const service = await startService(policy.url, storeFile, {
      nodeArgs: ['--expose-gc', '--import', `data:text/javascript,${encodeURIComponent(PROBE)}`],
      env: { ROLLSERVE_BENCH_HEAP_FILE: heapFile },
    });
    let probes = 0;
    /** The service's heap after a full collection (asks the preload, waits for its answer). */
    const heap = async () => {
      const seq = ++probes;
      process.kill(service.pid, 'SIGUSR2');
      return pollUntil('the heap probe', async () => {
        const read = JSON.parse(await readFile(heapFile, 'utf8').catch(() => '{"seq":0}')) as { seq: number; heapUsed: number; external: number; arrayBuffers: number };
        return read.seq >= seq ? read : undefined;
      }, 20, 10_000);
    };
    const size = async () => (await stat(storeFile)).size + (await stat(`${storeFile}-wal`).catch(() => ({ size: 0 }))).size;

    const startRss = await rssBytes(service.pid);
    const startHeap = await heap();
    console.log(`${'0'.padStart(7)} results: RSS ${mib(startRss)}, heap ${mib(startHeap.heapUsed)} (after a full GC)`);

    let received = 0;
    let submitted = 0;
    let wakeup: (() => void) | undefined;
    const seen = new Set<string>();
    let bad: WireResult | undefined;
    let ready = false;
    const stream = openStream(service.url, (result) => {
      if (result.task_id.startsWith('hello-')) {
        ready = true;
        return;
      }
      if (seen.has(result.task_id)) bad ??= result;
      seen.add(result.task_id);
      if (result.state !== 'done' || result.reward !== 1) bad ??= result;
      received++;
      wakeup?.();
    });
    let failed: unknown;
    stream.done.catch((error: unknown) => {
      failed = error;
      wakeup?.();
    });
    // the stream sees only what finishes after the service took it: a task of its own shows when
    for (let hello = 0; !ready && !failed; hello++) {
      await submit(service.url, [mathTask(`hello-${hello}`)]);
      await sleep(500);
    }
    const rss: Record<number, number> = {};
    const started = performance.now();
    const cpuBefore = await cpuSeconds(service.pid);
    let lastMark = started;
    let nextMark = EVERY;
    for (;;) {
      if (failed) throw new Error('the result stream failed', { cause: failed });
      if (bad) throw new Error(`a result twice or not done with reward 1: ${JSON.stringify(bad).slice(0, 400)}`);
      while (received >= nextMark && nextMark <= TOTAL) {
        const mark = nextMark;
        nextMark += EVERY;
        const rate = EVERY / ((performance.now() - lastMark) / 1000);
        rss[mark] = await rssBytes(service.pid);
        const { heapUsed } = await heap();
        console.log(`${mark.toLocaleString('en').padStart(7)} results: RSS ${mib(rss[mark])}, heap ${mib(heapUsed)}, store on disk ${mib(await size())}  (${rate.toFixed(0)} rollouts/s over the last ${EVERY.toLocaleString('en')}; ${((performance.now() - started) / 1000).toFixed(0)} s)`);
        lastMark = performance.now();
      }
      if (received >= TOTAL) break;
      // two batches in flight at most: another goes in once no more than one batch is outstanding
      if (submitted < TOTAL && submitted - received <= BATCH) {
        const count = Math.min(BATCH, TOTAL - submitted);
        await submit(service.url, Array.from({ length: count }, (_, i) => mathTask(`m${submitted + i}`)));
        submitted += count;
        continue;
      }
      await new Promise<void>((resolve) => (wakeup = resolve));
      wakeup = undefined;
    }
    const seconds = (performance.now() - started) / 1000;
    const cpu = (await cpuSeconds(service.pid)) - cpuBefore;
    stream.close();
    await stream.done;
    if (seen.size !== TOTAL) throw new Error(`${seen.size} distinct results for ${TOTAL} tasks`);
    await sleep(1_000); // a last reading with nothing in flight
    const idleRss = await rssBytes(service.pid);
    const idleHeap = await heap();
    console.log(`   idle afterwards: RSS ${mib(idleRss)}, heap ${mib(idleHeap.heapUsed)}`);
    const at20 = rss[2 * EVERY];
    const at100 = rss[TOTAL];
    console.log(
      `RSS(${TOTAL.toLocaleString('en')}) / RSS(${(2 * EVERY).toLocaleString('en')}) = ${at20 && at100 ? (at100 / at20).toFixed(2) : 'n/a'} (target: ~1.0, flat); ` +
        `${(TOTAL / seconds).toFixed(0)} rollouts/s overall (${seconds.toFixed(0)} s, readings included), service CPU ${((cpu / TOTAL) * 1000).toFixed(2)} ms per rollout  (${load()} at the end)`,
    );
  } finally {
    await stopAll();
    await dispatcher.close();
    await rm(dir, { recursive: true, force: true });
  }
}
