import { pino, type Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import { DIRECT_BACKENDS_FEATURE, type NodeClaim, type NodeRegistration } from '../protocol/nodes.ts';
import { RolloutRunner } from '../runner/runner.ts';
import { NodeClient } from './client.ts';
import { CommitQueue } from './commits.ts';
import { ServiceContact } from './contact.ts';
import { Leases } from './leases.ts';
import type { NodeEvent, NodeTimings, RolloutNodeOptions } from './options.ts';
import { defaultNodeId, nodeRegistration } from './registration.ts';
import { RemoteModelProvider } from './remote-models.ts';
import { DirectModelProvider } from './direct-models.ts';

export type { NodeEvent, NodeTimings, RolloutNodeOptions } from './options.ts';
export { defaultNodeId, slurmFromEnv } from './registration.ts';

/**
 * A rollout node (`rollserve node`): runs the INIT/RUN/EVAL pools and sandboxes of this machine
 * for a central service. It registers, pulls work while it has free slots (each rollout under a
 * lease), heartbeats the leases it holds, runs each rollout's whole session here, and commits the
 * results. A lease it loses (the service says so, or it could not reach the service for longer
 * than the node timeout, after which the service has given the work to another node) is aborted
 * here, sandbox and all, and never committed.
 *
 * Assembled from its parts: Leases (the claim loop and the leases held), CommitQueue (finished
 * results on their way), ServiceContact (registration, heartbeats, the watch for a service or Slurm
 * job that is gone); this class starts them and ends them.
 */
export class RolloutNode {
  readonly nodeId: string;
  readonly runner: RolloutRunner;
  readonly logger: Logger;
  readonly #client: NodeClient;
  readonly #options: RolloutNodeOptions;
  readonly #registration: NodeRegistration;
  readonly #leases: Leases;
  readonly #commits: CommitQueue;
  readonly #contact: ServiceContact;
  readonly #stop = new AbortController();
  /** The policy's turns sent to the backends from here (unless `directBackends: false`). */
  readonly #direct: DirectModelProvider | undefined;
  #loops: Promise<unknown>[] = [];
  #closing: Promise<void> | undefined;

  private constructor(options: RolloutNodeOptions) {
    this.#options = options;
    this.logger = options.logger ?? pino({ name: 'rollserve-node', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
    this.nodeId = options.nodeId ?? defaultNodeId(options.host);
    const direct = options.directBackends !== false;
    this.#client = new NodeClient({
      serviceUrl: options.serviceUrl,
      ...(options.token ? { token: options.token } : {}),
      features: direct ? ['weights', 'prefetch', DIRECT_BACKENDS_FEATURE] : ['weights', 'prefetch'],
    });
    const lease = {
      client: this.#client,
      nodeId: this.nodeId,
      attemptOf: (id: string) => this.#leases.attemptOf(id),
      reregister: () => this.#contact.reregister(),
      leaseLost: (id: string) => this.#leases.lose(id, 'service'),
    };
    const remote = new RemoteModelProvider(lease);
    const models = direct ? new DirectModelProvider({ ...lease, remote, drained: () => this.#contact.beatNow() }) : remote;
    if (models instanceof DirectModelProvider) {
      this.#direct = models;
      this.#client.onWeights = (weights) => models.heard(weights);
    }
    this.runner = new RolloutRunner({
      environments: options.environments,
      models,
      logger: this.logger,
      ...(options.environmentConfigs ? { environmentConfigs: options.environmentConfigs } : {}),
      ...(options.pools ? { pools: options.pools } : {}),
      ...(options.sandboxProvider ? { sandboxProvider: options.sandboxProvider } : {}),
    });
    this.#registration = nodeRegistration(this.nodeId, this.runner, options);
    const common = { client: this.#client, nodeId: this.nodeId, logger: this.logger, signal: this.#stop.signal, emit: (event: NodeEvent) => this.#emit(event) };
    this.#leases = new Leases({
      ...common,
      runner: this.runner,
      maxRollouts: this.#registration.max_rollouts,
      claimWaitMs: options.claimWaitMs ?? 5_000,
      registering: () => this.#contact.registering,
      reregister: () => this.#contact.reregister(),
      ...(this.#direct ? { claimed: (claim: NodeClaim) => this.#direct!.claimed(claim) } : {}),
      finished: (held) => this.#commits.add(held),
      lost: (held) => this.#commits.drop(held),
    });
    this.#commits = new CommitQueue({ ...common, reregister: () => this.#contact.reregister(), committed: (held, status) => this.#leases.committed(held, status) });
    this.#contact = new ServiceContact({
      ...common,
      registration: this.#registration,
      runner: this.runner,
      leases: this.#leases,
      serviceLostMs: options.serviceLostMs ?? 300_000,
      generationPaused: (paused) => models.generationPaused(paused),
      ...(this.#direct ? { generation: () => this.#direct!.generation() } : {}),
      slurmCheck: options.slurmCheck,
      closing: () => this.#closing !== undefined,
      end: (leave) => void this.#close(leave),
    });
  }

  /**
   * Starts a node: resolves once it is registered (retrying while the service cannot be reached);
   * a refusal (a missing environment, a wrong token) rejects.
   */
  static async start(options: RolloutNodeOptions): Promise<RolloutNode> {
    const node = new RolloutNode(options);
    node.#contact.watch();
    try {
      await node.#contact.reregister();
    } catch (error) {
      const orphaned = node.#contact.orphaned;
      if (orphaned !== undefined) {
        await node.#closing;
        throw new RolloutError({ code: 'UNAVAILABLE', message: orphaned, cause: error });
      }
      node.#contact.stopWatching();
      await node.runner.close();
      await node.#direct?.close();
      await node.#client.close();
      throw error;
    }
    node.#loops = [node.#leases.claimLoop(), node.#contact.heartbeatLoop()].map((loop) =>
      loop.catch((error: unknown) => node.logger.error({ err: error }, 'node loop failed')),
    );
    return node;
  }

  /**
   * Resolves once the node has left: after close(), or by itself when the service refused to take
   * it back (then with that refusal).
   */
  async ended(): Promise<{ refused?: RolloutError; orphaned?: string }> {
    await new Promise<void>((resolve) => {
      if (this.#closing) resolve();
      else this.#stop.signal.addEventListener('abort', () => resolve(), { once: true });
    });
    await this.#closing;
    const { refused, orphaned } = this.#contact;
    return { ...(refused ? { refused } : {}), ...(orphaned !== undefined ? { orphaned } : {}) };
  }

  get registration(): NodeRegistration {
    return this.#registration;
  }

  get timings(): NodeTimings {
    return this.#contact.timings;
  }

  /** Leases held now (running or waiting to be committed). */
  get held(): number {
    return this.#leases.size;
  }

  #emit(event: NodeEvent): void {
    // registered again (its service restarted, or lost it a while): the routes are asked for again
    if (event.type === 'registered' && event.again) this.#direct?.registeredAgain();
    try {
      this.#options.onEvent?.(event);
    } catch (error) {
      this.logger.error({ err: error }, 'node event listener failed');
    }
  }

  /**
   * Leaves: stops claiming, aborts what runs here (sandboxes killed, nothing of it committed),
   * commits what had already finished (one try), and deregisters, so the service re-queues the
   * rest at once.
   */
  close(): Promise<void> {
    return this.#close(true);
  }

  /** `leave`: commit what has finished and deregister (not for an orphan: its service is gone). */
  #close(leave: boolean): Promise<void> {
    this.#closing ??= (async () => {
      this.#contact.stopWatching();
      this.#leases.abandonUnfinished();
      this.#stop.abort();
      this.#leases.wake();
      await Promise.all(this.#loops);
      await this.runner.close(leave ? 'the node is leaving' : 'the node is ending: its service or Slurm job is gone');
      await this.#commits.flushing;
      if (!leave) {
        this.#leases.clear();
        await this.#direct?.close();
        await this.#client.close();
        return;
      }
      await this.#commits.commitFinished();
      this.#leases.clear();
      try {
        const { released } = await this.#client.deregister(this.nodeId);
        this.#emit({ type: 'left', released });
      } catch (error) {
        this.logger.warn({ err: error }, 'could not deregister (the service re-issues the work after the node timeout)');
      }
      await this.#direct?.close();
      await this.#client.close();
    })();
    return this.#closing;
  }
}

/** Starts a rollout node (see RolloutNode). */
export function startRolloutNode(options: RolloutNodeOptions): Promise<RolloutNode> {
  return RolloutNode.start(options);
}
