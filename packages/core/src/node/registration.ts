import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { RolloutError } from '../errors.ts';
import { MAX_NODE_ROLLOUTS, type NodeRegistration, type NodeSlurm } from '../protocol/nodes.ts';
import type { RolloutRunner } from '../runner/runner.ts';
import type { RolloutNodeOptions } from './options.ts';

/** Slurm's ids of the task the node runs as (`registration.slurm`); undefined outside Slurm. */
export function slurmFromEnv(env: NodeJS.ProcessEnv = process.env): NodeRegistration['slurm'] {
  const names = {
    job_id: 'SLURM_JOB_ID',
    array_job_id: 'SLURM_ARRAY_JOB_ID',
    array_task_id: 'SLURM_ARRAY_TASK_ID',
    step_id: 'SLURM_STEP_ID',
    node_name: 'SLURMD_NODENAME',
    proc_id: 'SLURM_PROCID',
    restart_count: 'SLURM_RESTART_COUNT',
  } as const;
  const slurm: NodeSlurm = {};
  for (const [key, name] of Object.entries(names) as Array<[keyof typeof names, string]>) if (env[name]) slurm[key] = env[name];
  return Object.keys(slurm).length > 0 ? slurm : undefined;
}

/** `${host}-${SLURM_JOB_ID or pid}-${random}`, in the characters a node id allows. */
export function defaultNodeId(host = hostname(), env: NodeJS.ProcessEnv = process.env): string {
  const id = `${host}-${env.SLURM_JOB_ID ?? process.pid}-${randomBytes(3).toString('hex')}`.replace(/[^A-Za-z0-9._:-]/g, '-').replace(/^[^A-Za-z0-9]+/, '');
  return id.slice(-128);
}

/** What the node registers as: this process, its runner's pools and environments, its Slurm task. */
export function nodeRegistration(nodeId: string, runner: Pick<RolloutRunner, 'capacity' | 'environments'>, options: RolloutNodeOptions): NodeRegistration {
  const capacity = runner.capacity;
  const slurm = options.slurm ?? slurmFromEnv();
  return {
    node_id: nodeId,
    host: options.host ?? hostname(),
    pid: process.pid,
    capacity,
    max_rollouts: options.maxRollouts ?? Math.min(MAX_NODE_ROLLOUTS, capacity.init + capacity.run),
    environments: runner.environments,
    ...(slurm ? { slurm } : {}),
    ...(options.version ? { version: options.version } : {}),
  };
}

/**
 * An error after which the node registers again: the service does not know it (it restarted, or
 * forgot it), or does not take its credential (another node took its id once it was lost). The
 * registration, with the credential it has, then settles it: taken back, or refused (and it leaves).
 */
export function mustRegisterAgain(error: unknown): boolean {
  return RolloutError.isInstance(error) && (error.code === 'NOT_FOUND' || error.code === 'UNAUTHORIZED');
}
