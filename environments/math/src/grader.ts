// The pooled grader: answers are graded in piscina worker threads, off the event loop, each under a
// hard time limit. A task over its limit is aborted, which terminates its worker (a parse stuck in
// a loop cannot be interrupted any other way); piscina starts a fresh one for the next task.

import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { Piscina } from 'piscina';
import type { GradeOptions, GradeResult } from './grade.ts';
import { gradeAnswer } from './grade.ts';
import type { GradeTask, GraderWorkerData } from './grader-worker.ts';

export interface GraderOptions {
  /** Hard limit on one grading, in seconds (math_with_judge's `library_verifier_timeout_seconds`). @default 10 */
  timeoutSeconds?: number;
  /**
   * Most gradings at once (`library_verifier_max_concurrency`). The pool never has more threads
   * than the machine has cores; extra calls wait their turn, and their time limit starts when
   * they start. @default 32
   */
  maxConcurrency?: number;
  /**
   * A grading module, a file path: its default export grades one `GradeTask` (in the pool's worker,
   * which stamps the task's start for its time limit). Tests use it to simulate a stuck worker.
   * @default the built-in grader (gradeAnswer)
   */
  workerFilename?: string;
}

/** What the grader returns: the grade, and whether it came from a time-out or a worker failure. */
export interface GradeOutcome extends GradeResult {
  /** True when grading went over the time limit (reward 0, extracted_answer null). */
  timedOut: boolean;
  /** Why the worker failed, when it did (reward 0). */
  error?: string;
}

export interface Grader {
  /** Grades `text` against `expected`. Never rejects. */
  grade(expected: string, text: string, options?: GradeOptions): Promise<GradeOutcome>;
  /** Worker threads in the pool (1 for the inline grader). */
  readonly threads: number;
  /** Stops the workers. */
  close(): Promise<void>;
}

/** How long a task may wait for a worker to start before it counts as timed out too. */
const WORKER_START_GRACE_MS = 30_000;

function workerFilename(): string {
  const built = new URL('./grader-worker.js', import.meta.url);
  if (existsSync(fileURLToPath(built))) return fileURLToPath(built);
  return fileURLToPath(new URL('./grader-worker-source.mjs', import.meta.url));
}

/** Numbered places for the tasks in flight; a task's number is its cell in the start clock. */
class Slots {
  readonly #free: number[];
  readonly #waiting: Array<(slot: number) => void> = [];

  constructor(size: number) {
    this.#free = Array.from({ length: size }, (_, i) => size - 1 - i);
  }

  /** A free slot, or undefined when all are taken (then wait for one with `acquire`). */
  tryAcquire(): number | undefined {
    return this.#free.pop();
  }

  acquire(): Promise<number> {
    return new Promise<number>((resolve) => this.#waiting.push(resolve));
  }

  release(slot: number): void {
    const next = this.#waiting.shift();
    if (next) next(slot);
    else this.#free.push(slot);
  }
}

/**
 * Creates the pooled grader.
 * @example
 * const grader = createGrader({ timeoutSeconds: 10 });
 * await grader.grade('\\frac{1}{2}', 'So \\boxed{0.5}.'); // { reward: 1, extracted_answer: '0.500000000000000', timedOut: false }
 * await grader.close();
 */
export function createGrader(options: GraderOptions = {}): Grader {
  const timeoutMs = Math.max(1, (options.timeoutSeconds ?? 10) * 1000);
  const maxConcurrency = Math.max(1, Math.floor(options.maxConcurrency ?? 32));
  const threads = Math.max(1, Math.min(maxConcurrency, availableParallelism()));
  // Two tasks per thread in flight: one running, one queued in piscina so the thread never idles
  // for a round trip. The queued one's time limit starts only when it starts running: each worker
  // stamps the time it starts a task into shared memory (no message per task). The memory goes to
  // each worker once, as its workerData: sent with every task, it cost as much as the rest of the
  // task's round trip.
  const inFlight = threads * 2;
  const clock = new SharedArrayBuffer(8 * inFlight);
  const startedAt = new BigInt64Array(clock);
  const workerData: GraderWorkerData = { clock, ...(options.workerFilename ? { grading: options.workerFilename } : {}) };
  const pool = new Piscina<GradeTask, GradeResult>({
    filename: workerFilename(),
    workerData,
    minThreads: threads,
    maxThreads: threads,
    concurrentTasksPerWorker: 1,
    idleTimeout: 60_000,
  });
  // A worker that fails to start (out of threads, a broken install) must not crash the process:
  // the tasks it would have run fail with reward 0, and piscina starts another worker.
  let lastError: string | undefined;
  pool.on('error', (error: unknown) => {
    lastError = error instanceof Error ? error.message : String(error);
  });
  const slots = new Slots(inFlight);
  let closed = false;

  async function grade(expected: string, text: string, options: GradeOptions = {}): Promise<GradeOutcome> {
    if (closed) return { reward: 0, extracted_answer: null, timedOut: false, error: 'grader closed' };
    const slot = slots.tryAcquire() ?? (await slots.acquire());
    Atomics.store(startedAt, slot, 0n);
    // piscina takes an EventEmitter that emits 'abort' as well as an AbortSignal: an AbortController
    // and its listener cost ~15 µs a task (of a ~85 µs round trip with grading), the emitter ~2 µs.
    const abort = new EventEmitter();
    let timedOut = false;
    const submitted = Date.now();
    let timer: NodeJS.Timeout | undefined;
    const check = (): void => {
      const started = Number(Atomics.load(startedAt, slot));
      const now = Date.now();
      // Not started yet (a worker is still starting): wait, up to a grace period.
      const remaining = started === 0 ? Math.min(250, submitted + timeoutMs + WORKER_START_GRACE_MS - now) : started + timeoutMs - now;
      if (remaining > 0) {
        timer = setTimeout(check, remaining);
        return;
      }
      timedOut = true;
      abort.emit('abort');
    };
    timer = setTimeout(check, timeoutMs);
    try {
      const result = await pool.run({ expected, text, options, slot }, { signal: abort });
      return { ...result, timedOut: false };
    } catch (error) {
      if (timedOut) return { reward: 0, extracted_answer: null, timedOut: true };
      const message = error instanceof Error ? error.message : String(error);
      return { reward: 0, extracted_answer: null, timedOut: false, error: lastError ? `${message} (${lastError})` : message };
    } finally {
      clearTimeout(timer);
      slots.release(slot);
    }
  }

  return {
    grade,
    threads,
    async close() {
      closed = true;
      await pool.destroy();
    },
  };
}

/**
 * A grader with the same interface that grades in the calling thread, with no time limit: for tests
 * and as the benchmark's baseline. Do not use it in a server.
 */
export function createInlineGrader(): Grader {
  return {
    threads: 1,
    async grade(expected, text, options) {
      try {
        return { ...gradeAnswer(expected, text, options), timedOut: false };
      } catch (error) {
        return { reward: 0, extracted_answer: null, timedOut: false, error: String(error) };
      }
    },
    async close() {},
  };
}
