import { RolloutError } from '../errors.ts';
import type { Environment } from '../spec/environment.ts';
import type { RolloutResult, RolloutTask, StageName, StageTiming } from '../protocol/rollout.ts';

/** A rollout to run: a leased attempt of one sample of a task. */
export interface RunnerJob {
  id: string;
  taskId: string;
  sampleIndex: number;
  /** The lease's fencing number, carried back with the result. */
  attempt: number;
  task: RolloutTask;
}

/** A rollout the runner holds. */
export interface RunningRollout {
  id: string;
  attempt: number;
  /** The stage it is in (waiting for a slot counts): `queued` until INIT begins. */
  stage: 'queued' | StageName;
  /** Whether it holds a slot of its stage now. */
  active: boolean;
}

/** A rollout as the runner holds it: where it is, how to stop it, and the time it has used. */
export interface Job extends RunnerJob {
  env: Environment<any, any, any> | undefined;
  stage: 'queued' | StageName;
  active: boolean;
  abort: AbortController;
  /** Stage time charged to `time_limit_s` (RUN and EVAL; INIT has a limit of its own). */
  usedMs: number;
  /** Whether `time_limit_s` ran out (in RUN, or before or in EVAL): only that time-out is attributed. */
  outOfTime: boolean;
  timing: Record<StageName, StageTiming>;
  startedAt: number;
  done: Promise<RolloutResult>;
  resolve: (result: RolloutResult) => void;
}

/** A job for a rollout just handed to the runner, queued for INIT. */
export function createJob(input: RunnerJob, env: Environment<any, any, any> | undefined): Job {
  let resolve!: (result: RolloutResult) => void;
  const done = new Promise<RolloutResult>((r) => (resolve = r));
  return {
    ...input,
    env,
    stage: 'queued',
    active: false,
    abort: new AbortController(),
    usedMs: 0,
    outOfTime: false,
    timing: { init: { queued_ms: 0, active_ms: 0 }, run: { queued_ms: 0, active_ms: 0 }, eval: { queued_ms: 0, active_ms: 0 } },
    startedAt: performance.now(),
    done,
    resolve,
  };
}

export function runningOf(job: Job): RunningRollout {
  return { id: job.id, attempt: job.attempt, stage: job.stage, active: job.active };
}

export const cancelled = (message = 'rollout cancelled') => new RolloutError({ code: 'CANCELLED', message });
