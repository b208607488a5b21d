// Piscina worker: grades one answer per task. The engine is built when the worker starts, so the
// first task does not pay for it.

import { getEngine } from './compare.ts';
import type { GradeOptions, GradeResult } from './grade.ts';
import { gradeAnswer } from './grade.ts';

/** One grading task as the pool sends it. */
export interface GradeTask {
  expected: string;
  text: string;
  options?: GradeOptions;
  /** Where to stamp the start time (ms), so the pool starts the task's time limit then. */
  clock?: SharedArrayBuffer;
  slot?: number;
}

getEngine();

export default function grade(task: GradeTask): GradeResult {
  if (task.clock && task.slot !== undefined) Atomics.store(new BigInt64Array(task.clock), task.slot, BigInt(Date.now()));
  return gradeAnswer(task.expected, task.text, task.options);
}
