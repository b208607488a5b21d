import type { Logger } from 'pino';
import { goneSlurmJobs, slurmJobOf, slurmRunOf, type SlurmJobRef } from '../slurm/watch.ts';
import type { RolloutStore } from '../store/types.ts';
import type { NodeRegistry, NodeState } from './node-registry.ts';

export interface NodeWatchOptions {
  store: RolloutStore;
  logger: Logger;
  nodes: NodeRegistry;
  closed: () => boolean;
  /** Work went back to the queue: the service's pools and waiting claims take it. */
  workArrived: () => void;
  /** The service's own pools look for work (they may run it now that a node is gone). */
  pump: () => void;
  nodeTimeoutMs: number;
  nodeRetentionMs: number;
  slurmWatch: false | { everyMs?: number; squeue?: string; env?: NodeJS.ProcessEnv } | undefined;
}

/**
 * Finds the nodes that are gone and re-issues their work: those silent past their node timeout
 * (and leases that ran out), and, sooner, those whose Slurm job Slurm reports gone.
 */
export class NodeWatch {
  readonly #store: RolloutStore;
  readonly #logger: Logger;
  readonly #nodes: NodeRegistry;
  readonly #closed: () => boolean;
  readonly #workArrived: () => void;
  readonly #pump: () => void;
  readonly #nodeTimeoutMs: number;
  readonly #nodeRetentionMs: number;
  readonly #slurmWatch: NodeWatchOptions['slurmWatch'];
  /** Runs of Slurm jobs seen gone (see slurmRunOf): a node of one of them is not taken back. */
  readonly #goneRuns = new Set<string>();
  #slurmUnavailable = false;
  /** A squeue is running (a slow controller must not pile them up). */
  #slurmAsking = false;
  /** The last squeue did not answer (said once in the log until one does). */
  #slurmSilent = false;

  constructor(options: NodeWatchOptions) {
    this.#store = options.store;
    this.#logger = options.logger;
    this.#nodes = options.nodes;
    this.#closed = options.closed;
    this.#workArrived = options.workArrived;
    this.#pump = options.pump;
    this.#nodeTimeoutMs = options.nodeTimeoutMs;
    this.#nodeRetentionMs = options.nodeRetentionMs;
    this.#slurmWatch = options.slurmWatch;
  }

  /** Whether Slurm reported this run of a job gone (see slurmRunOf). */
  isGoneRun(run: string): boolean {
    return this.#goneRuns.has(run);
  }

  /** Expired leases and silent nodes: their work goes back to the queue. Old departed nodes are forgotten. */
  async sweep(): Promise<void> {
    if (this.#closed()) return;
    try {
      const expired = await this.#store.expireLeases();
      for (const id of expired) this.#nodes.forgetLease(id);
      let released = expired.length;
      const now = Date.now();
      for (const [nodeId, node] of this.#nodes.entries()) {
        if (node.state !== 'up') {
          if (now - node.lastSeen > this.#nodeRetentionMs) {
            this.#nodes.delete(nodeId);
            await this.#store.deleteNodeCredential(nodeId);
          }
          continue;
        }
        if (now - node.lastSeen <= this.#nodeTimeoutMs) continue;
        released += await this.#lose(nodeId, node, `no heartbeat for ${now - node.lastSeen} ms`);
      }
      if (released > 0) this.#workArrived();
      else this.#pump();
    } catch (error) {
      this.#logger.warn({ err: error }, 'lease sweep failed');
    }
  }

  /** A node is lost: what it holds goes back to the queue. Returns how many rollouts. */
  async #lose(nodeId: string, node: NodeState, reason: string): Promise<number> {
    node.state = 'lost';
    node.lostReason = reason;
    const ids = await this.#store.releaseWorker(nodeId);
    this.#nodes.dropNode(nodeId);
    this.#logger.warn({ node: nodeId, released: ids.length, reason }, 'node lost: its work is re-issued');
    return ids.length;
  }

  /** Nodes whose Slurm job is gone are lost now, not at their node timeout. */
  async watchSlurm(): Promise<void> {
    if (this.#closed() || this.#slurmUnavailable || this.#slurmAsking || this.#slurmWatch === false) return;
    const refs: Array<SlurmJobRef & { nodeId: string }> = [];
    for (const [nodeId, node] of this.#nodes.entries()) {
      const job = node.state === 'up' ? slurmJobOf(node.registration) : undefined;
      if (job) refs.push({ id: job, node: node.registration.slurm?.node_name, nodeId });
    }
    if (refs.length === 0) return;
    this.#slurmAsking = true;
    try {
      const options = this.#slurmWatch || {};
      const gone = await goneSlurmJobs(refs, { ...(options.squeue ? { squeue: options.squeue } : {}), ...(options.env ? { env: options.env } : {}) });
      if (this.#slurmSilent) this.#logger.warn('Slurm answers about node jobs again');
      this.#slurmSilent = false;
      let released = 0;
      for (const { id, nodeId } of gone) {
        const node = this.#nodes.get(nodeId);
        if (node?.state !== 'up' || slurmJobOf(node.registration) !== id) continue; // gone, or registered again from another job meanwhile
        this.#goneRuns.add(slurmRunOf(node.registration)!);
        released += await this.#lose(nodeId, node, `Slurm job ${id} is gone`);
      }
      if (released > 0) this.#workArrived();
    } catch (error) {
      if ((error as { code?: unknown }).code === 'ENOENT') this.#slurmUnavailable = true;
      else if (!this.#slurmSilent) {
        // said once until Slurm answers again: nodes are lost by their heartbeats meanwhile
        this.#slurmSilent = true;
        this.#logger.warn({ err: error }, 'asking Slurm about node jobs failed; nodes are lost only by their node timeout until it answers');
      }
    } finally {
      this.#slurmAsking = false;
    }
  }
}
