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

const data = workerData as GraderWorkerData | undefined;
const startedAt = data?.clock ? new BigInt64Array(data.clock) : undefined;
const gradeTask: (task: GradeTask) => GradeResult | Promise<GradeResult> = data?.grading
  ? ((await import(data.grading.startsWith('file:') ? data.grading : pathToFileURL(data.grading).href)) as { default: (task: GradeTask) => GradeResult }).default
  : (getEngine(), (task) => gradeAnswer(task.expected, task.text, task.options));

export default function grade(task: GradeTask): GradeResult | Promise<GradeResult> {
  if (startedAt && task.slot !== undefined) Atomics.store(startedAt, task.slot, BigInt(Date.now()));
  return gradeTask(task);
}
