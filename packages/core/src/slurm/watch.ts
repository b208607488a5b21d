import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import type { NodeRegistration } from '../protocol/nodes.ts';

const run = promisify(execFile);

/**
 * Job states in which the job's processes are gone or going (squeue's %T names). squeue names a
 * job by its flags before its base state, so a job whose processes are being ended shows COMPLETING.
 */
const GONE = new Set(['BOOT_FAIL', 'CANCELLED', 'COMPLETED', 'COMPLETING', 'DEADLINE', 'FAILED', 'NODE_FAIL', 'OUT_OF_MEMORY', 'PREEMPTED', 'REQUEUED', 'REQUEUE_FED', 'REQUEUE_HOLD', 'RESV_DEL_HOLD', 'REVOKED', 'SPECIAL_EXIT', 'STAGE_OUT', 'TIMEOUT', 'PENDING', 'SUSPENDED', 'STOPPED']);

/** The id squeue shows for a node's job: `<array job>_<task>` for an array task, else the job id. */
export function slurmJobOf(registration: Pick<NodeRegistration, 'slurm'>): string | undefined {
  const slurm = registration.slurm;
  if (!slurm) return undefined;
  if (slurm.array_job_id && slurm.array_task_id) return `${slurm.array_job_id}_${slurm.array_task_id}`;
  return slurm.job_id;
}

/**
 * One run of a node's Slurm job: the job, how many times Slurm had requeued it, and where it ran
 * (a requeued job keeps its id; its new run is another node).
 */
export function slurmRunOf(registration: Pick<NodeRegistration, 'slurm'>): string | undefined {
  const job = slurmJobOf(registration);
  return job && `${job}#${registration.slurm?.restart_count ?? '0'}@${registration.slurm?.node_name ?? ''}`;
}

/** A node's Slurm job: its squeue id and the Slurm node it ran on (when known). */
export interface SlurmJobRef {
  id: string;
  node?: string | undefined;
}

/** Why squeue could not answer: its own words when it gave any. */
export class SlurmUnanswered extends Error {
  override readonly name = 'SlurmUnanswered';
}

/**
 * Which of `jobs` Slurm says are gone: no longer known to the controller, in a state whose
 * processes have ended or are being ended (requeued, cancelled, node failure, …), or running
 * again on another Slurm node than the ref's (a requeued array task keeps its id, so of two refs
 * to one job, the old run's is gone and the new run's is not). Returns the refs themselves.
 * Rejects with SlurmUnanswered when Slurm cannot answer (the controller down, squeue timed out):
 * nothing is concluded then. Rejects with ENOENT without squeue at all.
 */
export async function goneSlurmJobs<Ref extends SlurmJobRef>(jobs: readonly Ref[], options: { squeue?: string; env?: NodeJS.ProcessEnv } = {}): Promise<Ref[]> {
  if (jobs.length === 0) return [];
  const ids = [...new Set(jobs.map((job) => job.id))];
  let stdout: string;
  try {
    ({ stdout } = await run(options.squeue ?? 'squeue', ['--noheader', '--states=all', '--format=%i %T %N', `--jobs=${ids.join(',')}`], { env: options.env ?? process.env, timeout: 10_000 }));
  } catch (error) {
    if ((error as { code?: unknown }).code === 'ENOENT') throw error; // no Slurm client here at all
    const stderr = (error as { stderr?: string }).stderr?.trim() ?? '';
    // a job id the controller does not know (purged) fails the whole list: ask about each alone
    if (!stderr.includes('Invalid job id')) {
      const said = stderr.split('\n').at(-1);
      const why = (error as { killed?: boolean }).killed ? `squeue gave no answer within 10 s${said ? ` (${said})` : ''}` : said || (error as Error).message;
      throw new SlurmUnanswered(why, { cause: error });
    }
    if (ids.length === 1) return [...jobs];
    return (await Promise.all(ids.map((id) => goneSlurmJobs(jobs.filter((job) => job.id === id), options)))).flat();
  }
  const seen = new Map<string, { state: string; nodes: string }>();
  for (const line of stdout.split('\n')) {
    const [id, state, nodes = ''] = line.trim().split(/\s+/);
    if (id && state) seen.set(id, { state, nodes });
  }
  return jobs.filter((job) => {
    const now = seen.get(job.id);
    if (now === undefined || GONE.has(now.state)) return true;
    // single-node tasks: a node list naming another host is a new run of the same task
    return job.node !== undefined && now.nodes !== '' && !now.nodes.includes('[') && now.nodes !== job.node;
  });
}
