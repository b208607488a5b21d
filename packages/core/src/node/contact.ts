import type { Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import type { NodeGeneration, NodeRegistration } from '../protocol/nodes.ts';
import type { RolloutRunner } from '../runner/runner.ts';
import { goneSlurmJobs, slurmJobOf } from '../slurm/watch.ts';
import { isRetryable, withRetry, type NodeClient } from './client.ts';
import type { Leases } from './leases.ts';
import type { NodeEvent, NodeTimings, RolloutNodeOptions } from './options.ts';
import { mustRegisterAgain } from './registration.ts';

const DEFAULT_TIMINGS = { lease_ms: 30_000, heartbeat_ms: 2_000, node_timeout_ms: 10_000 };

export interface ServiceContactOptions {
  client: NodeClient;
  registration: NodeRegistration;
  runner: Pick<RolloutRunner, 'abort'>;
  leases: Pick<Leases, 'size' | 'list' | 'lose' | 'loseAll'>;
  logger: Logger;
  /** Aborted when the node stops. */
  signal: AbortSignal;
  serviceLostMs: number;
  slurmCheck: RolloutNodeOptions['slurmCheck'];
  /** Whether the node is closing (nothing is concluded then). */
  closing: () => boolean;
  /** Ends the node: `leave` after a refusal (it commits what finished and deregisters), not for an orphan. */
  end: (leave: boolean) => void;
  emit: (event: NodeEvent) => void;
  /** What each heartbeat answer says of a pause of generation for a weight update (see RemoteModelProvider). */
  generationPaused?: (paused: boolean) => void;
  /** What each heartbeat tells the service of the node's own calls to the backends (see DirectModelProvider). */
  generation?: () => NodeGeneration | undefined;
}

/**
 * A node's contact with its service: registration (again, under the same id, when the service
 * forgot the node or took its work away), heartbeats with the leases held, and the watch for a
 * service or Slurm job that is gone. A node that has not reached its service for longer than the
 * node timeout gives up its leases (the service has given them to others); one its service has not
 * answered for `serviceLostMs`, or whose Slurm job is gone, is an orphan and ends; one its service
 * refuses to take back leaves.
 */
export class ServiceContact {
  readonly #options: ServiceContactOptions;
  readonly #nodeId: string;
  #timings: NodeTimings;
  #registering: Promise<void> | undefined;
  #registeredOnce = false;
  /** When the service last answered a heartbeat or a registration (performance.now()). */
  #lastContact = performance.now();
  #refused: RolloutError | undefined;
  /** Why the node ended by itself (see the 'orphaned' event). */
  #orphaned: string | undefined;
  #watchdog: NodeJS.Timeout | undefined;
  #slurmTimer: NodeJS.Timeout | undefined;
  #slurmAsking = false;
  /** Ends the wait for the next heartbeat (see beatNow). */
  #wakeHeartbeat: (() => void) | undefined;
  /** A heartbeat was asked for while one was under way: the next goes at once. */
  #beatAgain = false;

  constructor(options: ServiceContactOptions) {
    this.#options = options;
    this.#nodeId = options.registration.node_id;
    this.#timings = { node_id: this.#nodeId, ...DEFAULT_TIMINGS };
  }

  get timings(): NodeTimings {
    return this.#timings;
  }

  /** The registration under way, if one is. */
  get registering(): Promise<void> | undefined {
    return this.#registering;
  }

  /** Why the service refused to take the node back, when it did. */
  get refused(): RolloutError | undefined {
    return this.#refused;
  }

  /** Why the node ended by itself, when it did. */
  get orphaned(): string | undefined {
    return this.#orphaned;
  }

  /** Starts watching for a service that does not answer and (under Slurm) for the node's job gone. */
  watch(): void {
    this.#watchdog = setInterval(() => this.#checkContact(), 250);
    this.#watchSlurm();
  }

  stopWatching(): void {
    clearInterval(this.#watchdog);
    clearInterval(this.#slurmTimer);
  }

  /** The node ends by itself: its service or its Slurm job is gone. Sandboxes are killed; the service is not called again. */
  #orphan(reason: string): void {
    if (this.#orphaned !== undefined || this.#options.closing()) return;
    this.#orphaned = reason;
    this.#options.logger.error({ service: this.#options.client.serviceUrl }, `${reason}: ending this node (its sandboxes killed)`);
    this.#options.emit({ type: 'orphaned', reason });
    this.#options.end(false);
  }

  /** Asks Slurm now and then whether this node's own job is gone (see `slurmCheck`). */
  #watchSlurm(): void {
    const { slurmCheck: check, registration, logger } = this.#options;
    const job = slurmJobOf(registration);
    if (check === false || job === undefined) return;
    const ask = async () => {
      if (this.#slurmAsking || this.#options.closing()) return;
      this.#slurmAsking = true;
      try {
        const gone = await goneSlurmJobs([{ id: job, node: registration.slurm?.node_name }], { ...(check?.squeue ? { squeue: check.squeue } : {}), ...(check?.env ? { env: check.env } : {}) });
        if (gone.length > 0) this.#orphan(`Slurm job ${job} of this node is gone (squeue)`);
      } catch (error) {
        if ((error as { code?: unknown }).code === 'ENOENT') clearInterval(this.#slurmTimer); // no Slurm client here
        else logger.debug({ err: error }, 'asking Slurm about this node\'s job failed; nothing concluded');
      } finally {
        this.#slurmAsking = false;
      }
    };
    this.#slurmTimer = setInterval(() => void ask(), check?.everyMs ?? 30_000);
    this.#slurmTimer.unref();
  }

  /**
   * Registers (again, under the same id); one registration at a time. `leaveFirst`: deregister
   * before (the service then releases at once whatever it still counts as this node's).
   */
  reregister(leaveFirst = false): Promise<void> {
    const { client, registration, logger, signal, emit } = this.#options;
    this.#registering ??= (async () => {
      try {
        if (leaveFirst) await client.deregister(this.#nodeId).catch(() => undefined);
        let tries = 0;
        const register = () =>
          client.register(registration, signal).catch((error: unknown) => {
            if (tries++ === 0 && isRetryable(error)) logger.warn({ err: error, service: client.serviceUrl }, 'cannot register with the service yet; trying again');
            throw error;
          });
        const registered = await withRetry(register, { signal, maxMs: 5_000 }).catch((error: unknown) => {
          // taken back no more: trying again would only spin; the node ends (start() reports a first refusal itself)
          if (this.#registeredOnce && !isRetryable(error) && !signal.aborted) {
            const refusal = RolloutError.from(error);
            logger.error({ err: error }, 'the service refused to take this node back: leaving');
            emit({ type: 'refused', code: refusal.code, message: refusal.message });
            this.#refused = refusal;
            this.#options.end(true);
          }
          throw error;
        });
        const { credential: _credential, features: _features, weights: _weights, ...timings } = registered; // the credential stays in the client
        this.#timings = timings;
        this.#lastContact = performance.now();
        emit({ type: 'registered', nodeId: this.#nodeId, timings, again: this.#registeredOnce });
        this.#registeredOnce = true;
      } finally {
        this.#registering = undefined;
      }
    })();
    return this.#registering;
  }

  /**
   * Past the node timeout without an answer, the service has declared this node lost and given its
   * work to others: everything held is aborted, and the node leaves and registers again (so that
   * whatever the service still counts as this node's is released at once).
   */
  #checkContact(): void {
    if (this.#options.closing()) return;
    const { client, serviceLostMs, leases, logger } = this.#options;
    const silent = performance.now() - client.lastAnswer;
    if (silent > serviceLostMs) {
      this.#orphan(`the service at ${client.serviceUrl} has not answered for ${Math.round(silent / 1000)} s (serviceLostMs ${serviceLostMs} ms)`);
      return;
    }
    if (!this.#registeredOnce || performance.now() - this.#lastContact <= this.#timings.node_timeout_ms) return;
    if (leases.size > 0) logger.warn({ held: leases.size }, 'no answer from the service for longer than the node timeout: aborting every lease');
    const lost = leases.loseAll('timeout');
    this.#lastContact = performance.now(); // (not again until another timeout has passed)
    void this.reregister(lost > 0).catch(() => undefined);
  }

  /** Sends the next heartbeat now (the node's turns have drained after a pause it heard of: the service waits for that). */
  beatNow(): void {
    if (this.#wakeHeartbeat) this.#wakeHeartbeat();
    else this.#beatAgain = true;
  }

  /** Waits `ms` for the next heartbeat, or less when beatNow is called. */
  #untilNextBeat(ms: number, signal: AbortSignal): Promise<void> {
    if (this.#beatAgain) {
      this.#beatAgain = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        this.#wakeHeartbeat = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener('abort', done, { once: true });
      this.#wakeHeartbeat = done;
    });
  }

  /** Heartbeats the leases held until the node stops: renewed, lost (stopped here) or cancelled (aborted here). */
  async heartbeatLoop(): Promise<void> {
    const { client, runner, leases, logger, signal, emit } = this.#options;
    try {
      while (!signal.aborted) {
        await this.#untilNextBeat(this.#timings.heartbeat_ms, signal);
        if (signal.aborted) break;
        this.#checkContact();
        if (this.#registering) continue;
        const held = leases.list();
        const sent = performance.now();
        try {
          const answer = await client.heartbeat(this.#nodeId, held, AbortSignal.any([signal, AbortSignal.timeout(this.#timings.node_timeout_ms)]), this.#options.generation?.());
          this.#lastContact = Math.max(this.#lastContact, sent);
          if (answer.generation_paused !== undefined) this.#options.generationPaused?.(answer.generation_paused);
          for (const id of answer.lost) leases.lose(id, 'service');
          for (const id of answer.cancel) {
            if (runner.abort(id, 'cancelled by a client')) emit({ type: 'cancel', rolloutId: id });
          }
        } catch (error) {
          if (signal.aborted) break;
          if (mustRegisterAgain(error)) await this.reregister().catch(() => undefined);
          else logger.debug({ err: error }, 'heartbeat failed');
        }
      }
    } finally {
      this.stopWatching();
    }
  }
}
