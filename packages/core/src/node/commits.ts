import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import type { NodeCommit, NodeCommitStatus } from '../protocol/nodes.ts';
import { isRetryable, type NodeClient } from './client.ts';
import type { Held } from './leases.ts';
import { mustRegisterAgain } from './registration.ts';

export interface CommitQueueOptions {
  client: NodeClient;
  nodeId: string;
  logger: Logger;
  /** Aborted when the node stops (what is still waiting then is committed by `commitFinished`). */
  signal: AbortSignal;
  reregister: () => Promise<void>;
  /** The service answered a commit (or refused it for good: 'not_found'). */
  committed: (held: Held, status: NodeCommitStatus) => void;
}

const commitOf = (held: Held): NodeCommit => ({ rollout_id: held.claim.rollout_id, attempt: held.claim.attempt, result: held.result! });

/**
 * The results a node has finished, on their way to the service: committed in batches (what
 * finished together goes together), each until it is answered or its lease is lost; a batch too
 * large goes again in halves, and to a service that does not read results with each token id sent
 * once, whole.
 */
export class CommitQueue {
  readonly #options: CommitQueueOptions;
  /** Finished rollouts waiting for a commit. */
  #pending: Held[] = [];
  /** Results go to the service whole, not with each token id once (it refused that form). */
  #wholeCommits = false;
  #committing: Promise<void> | undefined;

  constructor(options: CommitQueueOptions) {
    this.#options = options;
  }

  /** A finished rollout: committed with the next batch. */
  add(held: Held): void {
    this.#pending.push(held);
    this.#flush();
  }

  /** A lost lease: its result is not committed. */
  drop(held: Held): void {
    this.#pending = this.#pending.filter((p) => p !== held);
  }

  /** The batches under way, if any. */
  get flushing(): Promise<void> | undefined {
    return this.#committing;
  }

  /** Commits what has finished, in batches, until each is answered or its lease is lost. */
  #flush(): void {
    if (this.#committing) return;
    const { client, nodeId, logger, signal } = this.#options;
    this.#committing = (async () => {
      let failures = 0;
      // set when the service refused a batch sent with each token id once: it goes again whole
      let wholeAgain = false;
      await new Promise((resolve) => setImmediate(resolve)); // what finished together goes together
      // the service caps a request's body (--max-body-mib, 4 times that for results): a batch it
      // refuses as too large goes again in halves
      let batchSize = 256;
      while (this.#pending.length > 0 && !signal.aborted) {
        const batch = this.#pending.slice(0, batchSize);
        const commits = batch.map(commitOf);
        const whole = this.#wholeCommits || wholeAgain;
        try {
          const statuses = await client.commit(nodeId, commits, { whole });
          if (whole && !this.#wholeCommits) {
            // a service from before that form (an older rollserve): whole from now on
            this.#wholeCommits = true;
            logger.warn({ service: client.serviceUrl }, 'the service does not read results with their token ids sent once (an older rollserve?): sending them whole');
          }
          wholeAgain = false;
          failures = 0;
          batch.forEach((held, i) => this.#committed(held, statuses[i] ?? 'not_found'));
        } catch (error) {
          if (mustRegisterAgain(error)) {
            await this.#options.reregister().catch(() => undefined);
            continue;
          }
          if (RolloutError.isInstance(error) && error.code === 'UNPROCESSABLE' && !whole) {
            wholeAgain = true;
            continue;
          }
          if (RolloutError.isInstance(error) && error.code === 'PAYLOAD_TOO_LARGE' && batch.length > 1) {
            batchSize = Math.ceil(batch.length / 2);
            continue;
          }
          if (!isRetryable(error)) {
            wholeAgain = false;
            // a commit the service refuses as malformed will not get better: drop it (its lease expires)
            logger.error({ err: error, rollouts: commits.map((c) => c.rollout_id) }, 'commit refused');
            for (const held of batch) this.#committed(held, 'not_found');
            continue;
          }
          logger.debug({ err: error }, 'commit failed; retrying');
          const wait = Math.min(5_000, 100 * 2 ** Math.min(failures++, 10));
          await sleep(wait, undefined, { signal }).catch(() => undefined);
        }
      }
    })().finally(() => {
      this.#committing = undefined;
      if (this.#pending.length > 0 && !signal.aborted) this.#flush();
    });
  }

  #committed(held: Held, status: NodeCommitStatus): void {
    this.#pending = this.#pending.filter((p) => p !== held);
    this.#options.committed(held, status);
  }

  /** On leaving: commits what has finished and is still held, in one try (the service re-issues the rest). */
  async commitFinished(): Promise<void> {
    const { client, nodeId, logger } = this.#options;
    const finished = this.#pending.filter((held) => !held.lost);
    if (finished.length === 0) return;
    await client.commit(nodeId, finished.map(commitOf)).then(
      (statuses) => finished.forEach((held, i) => this.#committed(held, statuses[i] ?? 'not_found')),
      (error: unknown) => logger.warn({ err: error }, 'finished results not committed on leaving'),
    );
  }
}
