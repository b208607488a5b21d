import type { Logger } from 'pino';
import type { NodeCommitStatus, NodeRegistered, NodeRegistration } from '../protocol/nodes.ts';
import type { RolloutResult, StageName } from '../protocol/rollout.ts';
import type { SandboxProvider } from '../sandbox/types.ts';
import type { Environment } from '../spec/environment.ts';

export interface RolloutNodeOptions {
  /** The central service, `http://host:8100`. */
  serviceUrl: string;
  /** Its bearer token. */
  token?: string;
  /** @default `${host}-${SLURM_JOB_ID or pid}-${random}` */
  nodeId?: string;
  /** The environments this node runs (the service refuses a node that lacks one of its own). */
  environments: ReadonlyArray<Environment<any, any, any>>;
  environmentConfigs?: Record<string, Record<string, unknown>>;
  /** Worker slots per stage. @default the runner's: { init: 64, run: 512, eval: 32 } */
  pools?: Partial<Record<StageName, number>>;
  /** Rollouts held at most at once (claimed, running or waiting to be committed). @default pools.init + pools.run */
  maxRollouts?: number;
  /** The host name the node registers with. @default os.hostname() */
  host?: string;
  /** @default slurmFromEnv(process.env) */
  slurm?: NodeRegistration['slurm'];
  version?: string;
  /** How long a claim waits for work (the service's long poll). @default 5_000 */
  claimWaitMs?: number;
  /**
   * A node the service has not answered for this long (unreachable, or only 5xx answers) is an
   * orphan: it kills its sandboxes and ends (see `ended`), instead of retrying for ever after its
   * service or Slurm job is gone. Counts from the start, so a first registration is bounded too.
   * @default 300_000
   */
  serviceLostMs?: number;
  /**
   * Asks Slurm (squeue) every `everyMs` whether the node's own job (SLURM_JOB_ID, or its array
   * task) is gone (cancelled, requeued, ended): then the node is an orphan and ends. Only when the
   * node runs as a Slurm task and squeue exists; nothing is concluded while squeue cannot answer.
   * @default { everyMs: 30_000 }
   */
  slurmCheck?: false | { everyMs?: number; squeue?: string; env?: NodeJS.ProcessEnv };
  /**
   * Send the policy's turns to its backends from here, on the routes the service hands out
   * (least in flight and sticky per rollout across the cluster), instead of through the service.
   * Used only with a service that takes it up; an older one gets the turns through /model.
   * @default true
   */
  directBackends?: boolean;
  sandboxProvider?: SandboxProvider;
  logger?: Logger;
  /** What the node does, as it happens (the CLI's line on registration, tests). */
  onEvent?: (event: NodeEvent) => void;
}

export type NodeEvent =
  | { type: 'registered'; nodeId: string; timings: NodeTimings; again: boolean }
  | { type: 'claimed'; rolloutId: string; attempt: number }
  /** Tasks the service said are queued next (a claim's `upcoming`): their images are readied here. */
  | { type: 'upcoming'; taskIds: string[] }
  | { type: 'committed'; rolloutId: string; attempt: number; status: NodeCommitStatus; state: RolloutResult['state'] }
  /** A lease the node stopped: the service said so, or the node could not reach it for longer than the node timeout. */
  | { type: 'lost'; rolloutId: string; attempt: number; reason: 'service' | 'timeout' }
  /** The run of a lost lease has ended here (its sandbox is gone); nothing of it is committed. */
  | { type: 'dropped'; rolloutId: string; attempt: number }
  | { type: 'cancel'; rolloutId: string }
  | { type: 'left'; released: number }
  /**
   * The service refused to take the node back (its Slurm job reported gone, an environment it
   * lacks now, a token that no longer fits): the node leaves, as on SIGTERM (see `ended`).
   */
  | { type: 'refused'; code: string; message: string }
  /**
   * The node ends by itself: the service did not answer for `serviceLostMs`, or its Slurm job is
   * gone. Its sandboxes are killed; it does not try to reach the service again (see `ended`).
   */
  | { type: 'orphaned'; reason: string };

/** What a registration answered but the credential (which stays in the client). */
export type NodeTimings = Omit<NodeRegistered, 'credential' | 'features' | 'weights'>;
