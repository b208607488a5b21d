import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { NodeClaim, NodeCommitStatus, NodeLease } from '../protocol/nodes.ts';
import type { RolloutResult } from '../protocol/rollout.ts';
import type { RolloutRunner } from '../runner/runner.ts';
import { isRetryable, type NodeClient } from './client.ts';
import type { NodeEvent } from './options.ts';
import { mustRegisterAgain } from './registration.ts';

/** A lease the node holds, from its claim until its commit is answered (or it is lost). */
export interface Held {
  claim: NodeClaim;
  lost: boolean;
  /** Set when the rollout has finished: waiting to be committed. */
  result?: RolloutResult;
  /** Its run here, until the runner lets go of it. */
  done?: Promise<unknown>;
}

export interface LeasesOptions {
  client: NodeClient;
  nodeId: string;
  runner: RolloutRunner;
  logger: Logger;
  /** Rollouts held at most (the registration's `max_rollouts`). */
  maxRollouts: number;
  /** How long a claim waits for work (the service's long poll). */
  claimWaitMs: number;
  /** Aborted when the node stops. */
  signal: AbortSignal;
  /** The registration under way, if one is: claims wait for it. */
  registering: () => Promise<void> | undefined;
  reregister: () => Promise<void>;
  /** A claim came in (before its rollout starts). */
  claimed?: (claim: NodeClaim) => void;
  /** A rollout has finished here: its result waits to be committed. */
  finished: (held: Held) => void;
  /** A lease is lost: whatever of it waits to be committed is not. */
  lost: (held: Held) => void;
  emit: (event: NodeEvent) => void;
}

/**
 * The leases a node holds and the loop that claims them: it asks the service for work while the
 * node has room, runs each claimed rollout on the runner, and stops a lease that is lost (its
 * rollout aborted, sandbox and all; a claim of it again waits until that run has let go).
 */
export class Leases {
  readonly #options: LeasesOptions;
  readonly #held = new Map<string, Held>();
  /** Rollouts aborted here whose runner has not let go yet (a re-issued claim of one waits for it). */
  readonly #draining = new Map<string, Promise<unknown>>();
  #slotFreed: (() => void) | undefined;

  constructor(options: LeasesOptions) {
    this.#options = options;
  }

  /** Leases held now (running or waiting to be committed). */
  get size(): number {
    return this.#held.size;
  }

  /** The attempt under which the node runs `rolloutId` (undefined: not held, or lost). */
  attemptOf(rolloutId: string): number | undefined {
    const held = this.#held.get(rolloutId);
    return held && !held.lost ? held.claim.attempt : undefined;
  }

  /** The leases as a heartbeat quotes them, with the stage each rollout is in. */
  list(): NodeLease[] {
    return [...this.#held.values()].map(({ claim, result }) => ({
      rollout_id: claim.rollout_id,
      attempt: claim.attempt,
      stage: result ? 'eval' : (this.#options.runner.running(claim.rollout_id)?.stage ?? 'queued'),
    }));
  }

  /** Wakes the claim loop when it waits for room. */
  wake(): void {
    const wake = this.#slotFreed;
    this.#slotFreed = undefined;
    wake?.();
  }

  async claimLoop(): Promise<void> {
    const { client, nodeId, logger, signal } = this.#options;
    let failures = 0;
    while (!signal.aborted) {
      const free = this.#options.maxRollouts - this.#held.size;
      if (free <= 0) {
        await new Promise<void>((resolve) => {
          const done = () => {
            signal.removeEventListener('abort', done);
            resolve();
          };
          this.#slotFreed = done;
          signal.addEventListener('abort', done, { once: true });
        });
        continue;
      }
      try {
        const registering = this.#options.registering();
        if (registering) await registering;
        const { claims, upcoming } = await client.claimWork(nodeId, free, this.#options.claimWaitMs, signal);
        failures = 0;
        for (const claim of claims) this.#start(claim);
        // the work queued behind this claim: its images readied while this runs (after the claims')
        if (upcoming.length > 0) {
          this.#options.emit({ type: 'upcoming', taskIds: upcoming.map((next) => next.task_id) });
          for (const next of upcoming) this.#options.runner.prefetchTask(next.task);
        }
      } catch (error) {
        if (signal.aborted) break;
        if (mustRegisterAgain(error)) {
          await this.#options.reregister().catch(() => undefined);
          continue;
        }
        if (!isRetryable(error)) logger.error({ err: error }, 'claim refused');
        else logger.debug({ err: error }, 'claim failed');
        const wait = Math.min(5_000, 100 * 2 ** Math.min(failures++, 10));
        await sleep(wait, undefined, { signal }).catch(() => undefined);
      }
    }
  }

  #start(claim: NodeClaim): void {
    const { runner, emit } = this.#options;
    const id = claim.rollout_id;
    const previous = this.#held.get(id);
    if (previous) this.#lose(previous, 'service'); // re-issued to this node: the old attempt is over
    const held: Held = { claim, lost: false };
    this.#held.set(id, held);
    this.#options.claimed?.(claim);
    emit({ type: 'claimed', rolloutId: id, attempt: claim.attempt });
    const draining = this.#draining.get(id);
    const run = async () => {
      await draining;
      if (held.lost) return;
      const result = await runner.run({ id, taskId: claim.task_id, sampleIndex: claim.sample_index, attempt: claim.attempt, task: claim.task });
      if (held.lost || this.#held.get(id) !== held) {
        emit({ type: 'dropped', rolloutId: id, attempt: claim.attempt });
        return;
      }
      held.result = result;
      this.#options.finished(held);
    };
    held.done = run().catch((error: unknown) => {
      // the runner refused the job (it is closing): the lease is left for the service to re-issue
      this.#options.logger.warn({ err: error, rollout: id }, 'rollout not run');
      if (this.#held.get(id) === held) this.#held.delete(id);
      this.wake();
    });
  }

  /**
   * Stops the lease of `rolloutId`, if held (see #lose). A finished rollout's lease the service
   * calls lost is not stopped: its commit is on its way, and the service forgets a lease once it
   * takes its commit, so a heartbeat that crossed the commit's answer hears "lost" for a rollout
   * committed. The commit's own answer says what became of it (committed, duplicate or stale).
   */
  lose(rolloutId: string, reason: 'service' | 'timeout'): void {
    const held = this.#held.get(rolloutId);
    if (!held || (reason === 'service' && held.result)) return;
    this.#lose(held, reason);
  }

  /** Stops every lease held; answers how many. */
  loseAll(reason: 'service' | 'timeout'): number {
    const held = [...this.#held.values()];
    for (const lease of held) this.#lose(lease, reason);
    return held.length;
  }

  /** Stops a lease: its rollout is aborted (sandbox killed), and its result never committed. */
  #lose(held: Held, reason: 'service' | 'timeout'): void {
    if (held.lost) return;
    held.lost = true;
    const id = held.claim.rollout_id;
    if (this.#held.get(id) === held) this.#held.delete(id);
    this.#options.lost(held);
    if (!held.result && held.done) {
      const done = held.done;
      this.#draining.set(id, done);
      void done.then(() => {
        if (this.#draining.get(id) === done) this.#draining.delete(id);
      });
      if (this.#options.runner.running(id)?.attempt === held.claim.attempt) {
        this.#options.runner.abort(id, reason === 'timeout' ? 'the node lost contact with the service: its lease was given to another node' : 'the lease was lost');
      }
    }
    this.#options.emit({ type: 'lost', rolloutId: id, attempt: held.claim.attempt, reason });
    this.wake();
  }

  /** The service answered a lease's commit: the lease is done with. */
  committed(held: Held, status: NodeCommitStatus): void {
    const id = held.claim.rollout_id;
    if (this.#held.get(id) === held) this.#held.delete(id);
    if (!held.lost) this.#options.emit({ type: 'committed', rolloutId: id, attempt: held.claim.attempt, status, state: held.result!.state });
    held.lost = true; // done with
    this.wake();
  }

  /** The node is leaving: what has not finished is given up (what has waits for its commit). */
  abandonUnfinished(): void {
    for (const held of this.#held.values()) if (!held.result) held.lost = true;
  }

  clear(): void {
    this.#held.clear();
  }
}
