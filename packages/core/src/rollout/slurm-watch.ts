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
 * One run of a node's Slurm job: the job, how many times Slurm had requeued it, and where it ran
 * (a requeued job keeps its id; its new run is another node).
 */
export function slurmRunOf(registration: Pick<NodeRegistration, 'slurm'>): string | undefined {
  const job = slurmJobOf(registration);
  return job && `${job}#${registration.slurm?.restartCount ?? '0'}@${registration.slurm?.nodeName ?? ''}`;
}

/** A node's Slurm job: its squeue id and the Slurm node it ran on (when known). */
export interface SlurmJobRef {
  id: string;
  node?: string | undefined;
}

/**
 * Which of `jobs` Slurm says are gone: no longer known to the controller, in a state whose
 * processes have ended or are being ended (requeued, cancelled, node failure, …), or running
 * again on another Slurm node (a requeued array task keeps its id). Undefined when Slurm cannot
 * answer (the controller down): nothing is concluded then. Throws ENOENT without squeue at all.
 */
export async function goneSlurmJobs(jobs: readonly SlurmJobRef[], options: { squeue?: string; env?: NodeJS.ProcessEnv } = {}): Promise<Set<string> | undefined> {
  if (jobs.length === 0) return new Set();
  let stdout: string;
  try {
    const ids = [...new Set(jobs.map((job) => job.id))];
    ({ stdout } = await run(options.squeue ?? 'squeue', ['--noheader', '--states=all', '--format=%i %T %N', `--jobs=${ids.join(',')}`], { env: options.env ?? process.env, timeout: 10_000 }));
  } catch (error) {
    if ((error as { code?: unknown }).code === 'ENOENT') throw error; // no Slurm client here at all
    // a job id the controller does not know (purged) fails the whole list: ask about each alone
    if (!(error as { stderr?: string }).stderr?.includes('Invalid job id')) return undefined;
    if (jobs.length === 1) return new Set([jobs[0]!.id]);
    const each = await Promise.all(jobs.map((job) => goneSlurmJobs([job], options)));
    if (each.some((gone) => gone === undefined)) return undefined;
    return new Set(each.flatMap((gone) => [...gone!]));
  }
  const seen = new Map<string, { state: string; nodes: string }>();
  for (const line of stdout.split('\n')) {
    const [id, state, nodes = ''] = line.trim().split(/\s+/);
    if (id && state) seen.set(id, { state, nodes });
  }
  return new Set(
    jobs
      .filter((job) => {
        const now = seen.get(job.id);
        if (now === undefined || GONE.has(now.state)) return true;
        // single-node tasks: a node list naming another host is a new run of the same task
        return job.node !== undefined && now.nodes !== '' && !now.nodes.includes('[') && now.nodes !== job.node;
      })
      .map((job) => job.id),
  );
}
