import { RolloutError } from '../errors.ts';
import type { RolloutResult, RolloutTask } from '../protocol/rollout.ts';
import type { ClaimOptions, StoreRolloutState } from './types.ts';

export const TERMINAL_STATES = ['done', 'failed', 'cancelled'] as const;

/** A task's rollout ids: the task id for one sample, `taskId:k` for each of several. */
export function rolloutIdsOf(taskId: string, n: number): string[] {
  return Array.from({ length: n }, (_, k) => (n === 1 ? taskId : `${taskId}:${k}`));
}

/** JSON with object keys sorted: equal bodies give equal strings (a task's fingerprint). */
export function stableStringify(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    v && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v,
  );
}

export interface PreparedTask {
  id: string;
  task: RolloutTask;
  body: string;
  fingerprint: string;
  rolloutIds: string[];
}

const badRequest = (message: string) => new RolloutError({ code: 'BAD_REQUEST', message });

export const conflict = (message: string, cause?: unknown) => new RolloutError({ code: 'CONFLICT', message, cause });

/** Tasks ready to write, in order, a repeated id kept once (a repeat with another body is a CONFLICT). */
export function prepareTasks(tasks: readonly RolloutTask[]): PreparedTask[] {
  const byId = new Map<string, PreparedTask>();
  for (const task of tasks) {
    if (!task.id) throw badRequest('a stored task needs an id');
    const fingerprint = stableStringify(task);
    const seen = byId.get(task.id);
    if (seen) {
      if (seen.fingerprint !== fingerprint) throw conflict(`task id "${task.id}" appears twice in the batch with different bodies`);
      continue;
    }
    byId.set(task.id, { id: task.id, task, body: JSON.stringify(task), fingerprint, rolloutIds: rolloutIdsOf(task.id, task.n) });
  }
  return [...byId.values()];
}

export function checkResult(result: RolloutResult): void {
  if (!(TERMINAL_STATES as readonly string[]).includes(result.state)) {
    throw badRequest(`result "${result.id}" has state "${result.state}": only done, failed or cancelled results are stored`);
  }
}

export function checkPositiveInt(name: string, value: number, max = Number.MAX_SAFE_INTEGER): void {
  if (!Number.isInteger(value) || value <= 0 || value > max) throw badRequest(`${name} must be an integer in 1..${max} (got ${value})`);
}

/** A claim's limit (at most 10,000) and lease length. */
export function checkClaim({ limit, leaseMs }: ClaimOptions): void {
  checkPositiveInt('limit', limit, 10_000);
  checkPositiveInt('leaseMs', leaseMs);
}

/** A page cursor is the sequence number of the last item seen. */
export function parseCursor(cursor: string | null | undefined): number {
  if (cursor === undefined || cursor === null || cursor === '') return 0;
  if (!/^\d{1,15}$/.test(cursor)) throw badRequest(`bad cursor "${cursor}"`);
  return Number(cursor);
}

export function pageLimit(limit: number | undefined): number {
  const value = limit ?? 100;
  checkPositiveInt('limit', value, 10_000);
  return value;
}

export function asList<T>(value: T | readonly T[] | undefined): T[] | undefined {
  if (value === undefined) return undefined;
  return (Array.isArray(value) ? [...value] : [value]) as T[];
}

export function emptyCounts(): Record<StoreRolloutState, number> {
  return { queued: 0, leased: 0, done: 0, failed: 0, cancelled: 0 };
}
