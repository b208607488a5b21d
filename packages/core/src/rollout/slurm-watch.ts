import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import type { NodeRegistration } from './nodes.ts';

const run = promisify(execFile);

/** Job states in which the job's processes are gone or going (Slurm's squeue --states names). */
const GONE = new Set(['BOOT_FAIL', 'CANCELLED', 'COMPLETED', 'DEADLINE', 'FAILED', 'NODE_FAIL', 'OUT_OF_MEMORY', 'PREEMPTED', 'REQUEUED', 'REQUEUE_FED', 'REQUEUE_HOLD', 'REVOKED', 'SPECIAL_EXIT', 'TIMEOUT', 'PENDING', 'SUSPENDED', 'STOPPED']);

/** The id squeue shows for a node's job: `<array job>_<task>` for an array task, else the job id. */
export function slurmJobOf(registration: Pick<NodeRegistration, 'slurm'>): string | undefined {
  const slurm = registration.slurm;
  if (!slurm) return undefined;
  if (slurm.arrayJobId && slurm.arrayTaskId) return `${slurm.arrayJobId}_${slurm.arrayTaskId}`;
  return slurm.jobId;
}

/**
 * Which of `jobs` Slurm says are gone: no longer known to the controller, or in a state whose
 * processes have ended or are being ended (requeued, cancelled, node failure, …). Undefined when
 * Slurm cannot be asked (no squeue here, the controller down): nothing is concluded then.
 */
export async function goneSlurmJobs(jobs: readonly string[], options: { squeue?: string; env?: NodeJS.ProcessEnv } = {}): Promise<Set<string> | undefined> {
  if (jobs.length === 0) return new Set();
  let stdout: string;
  try {
    ({ stdout } = await run(options.squeue ?? 'squeue', ['--noheader', '--states=all', '--format=%i %T', `--jobs=${jobs.join(',')}`], { env: options.env ?? process.env, timeout: 10_000 }));
  } catch (error) {
    // one purged job id makes squeue fail for the whole list: ask about each alone
    if (jobs.length === 1 || (error as { code?: unknown }).code === 'ENOENT') return (error as { stderr?: string }).stderr?.includes('Invalid job id') ? new Set(jobs) : undefined;
    const each = await Promise.all(jobs.map((job) => goneSlurmJobs([job], options)));
    if (each.some((gone) => gone === undefined)) return undefined;
    return new Set(each.flatMap((gone) => [...gone!]));
  }
  const states = new Map<string, string>();
  for (const line of stdout.split('\n')) {
    const [id, state] = line.trim().split(/\s+/);
    if (id && state) states.set(id, state);
  }
  return new Set(jobs.filter((job) => {
    const state = states.get(job);
    return state === undefined || GONE.has(state);
  }));
}
