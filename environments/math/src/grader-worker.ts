// Piscina worker: grades one answer per task, first stamping the time it starts into the pool's
// shared clock (the task's time limit runs from there). The engine is built when the worker
// starts, so the first task does not pay for it.

import { pathToFileURL } from 'node:url';
import { workerData } from 'node:worker_threads';
import { getEngine } from './compare/index.ts';
import type { GradeOptions, GradeResult } from './grade.ts';
import { gradeAnswer } from './grade.ts';

/** One grading task as the pool sends it. */
export interface GradeTask {
  expected: string;
  text: string;
  options?: GradeOptions;
  /** The task's cell in the clock. */
  slot?: number;
}

/** What the pool gives each worker once. */
export interface GraderWorkerData {
  /** Start times (ms since the epoch), one cell per task in flight. */
  clock: SharedArrayBuffer;
  /** A module whose default export grades instead of gradeAnswer (GraderOptions.workerFilename). */
  grading?: string;
}

/** Gradings a worker started during the start-up warm-up runs first (see below). */
const WARM_UP_GRADES = 600;

const data = workerData as GraderWorkerData | undefined;
const startedAt = data?.clock ? new BigInt64Array(data.clock) : undefined;
const gradeTask: (task: GradeTask) => GradeResult | Promise<GradeResult> = data?.grading
  ? ((await import(data.grading.startsWith('file:') ? data.grading : pathToFileURL(data.grading).href)) as { default: (task: GradeTask) => GradeResult }).default
  : (getEngine(), (task) => gradeAnswer(task.expected, task.text, task.options));

// Started during rollserve's start-up warm-up (which sets ROLLSERVE_WARMING_UP in the process's
// environment while it runs, and a worker thread starts with a copy of it): the worker grades a few
// hundred answers of its own first. Each worker is an isolate of its own, whose code V8 compiles
// apart from the main thread's and the other workers'; the warm-up's rollouts, shared among the
// workers, left each too few gradings to compile the grading path, and the first real gradings
// paid for it (issue 28, `--trace-opt`: gradeTask, the extraction and comparison functions).
// A worker started later (piscina replacing one that timed out) does not.
if (process.env.ROLLSERVE_WARMING_UP === '1' && !data?.grading) {
  const answers = ['\\boxed{8}', 'The answer is \\boxed{8}.', 'So $x = \\boxed{-3}$.', '\\boxed{\\frac{3}{4}}', 'Thus \\boxed{2\\sqrt{2}}.', '\\boxed{0.5}'];
  const golds = ['8', '\\frac{3}{4}', '-3', '2\\sqrt{2}', '0.5', '42'];
  // In the tasks' own shape: the pool's message (the math environment's options, a slot), cloned
  // as a message is (objects built by the deserializer, whose hidden classes a literal's are not).
  for (let i = 0; i < WARM_UP_GRADES; i++) {
    const task: GradeTask = { expected: golds[i % golds.length]!, text: answers[Math.floor(i / golds.length) % answers.length]!, options: { corrections: true }, slot: 0 };
    await gradeTask(structuredClone(task));
  }
}

export default function grade(task: GradeTask): GradeResult | Promise<GradeResult> {
  if (startedAt && task.slot !== undefined) Atomics.store(startedAt, task.slot, BigInt(Date.now()));
  return gradeTask(task);
}
