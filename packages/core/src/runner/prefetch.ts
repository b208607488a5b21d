import PQueue from 'p-queue';
import type { Logger } from 'pino';
import { defaultMaxConcurrentUnpacks } from '../sandbox/image/index.ts';
import type { SandboxProvider, SandboxSpec } from '../sandbox/types.ts';

/**
 * Readies the sandbox images of rollouts that wait for INIT while others run (provider.prefetch:
 * unpacked into the cache, unheld), so that their INIT starts on a cached image. At most as many
 * at once as the host unpacks (`ROLLSERVE_IMAGE_UNPACKS`), one per image, and only so many ahead
 * (`lookahead`): the rollouts next in INIT's queue, in the order they were admitted; the later
 * ones unpack their own in INIT, as without a prefetch, rather than evict the images of the ones
 * about to start. The cache's cap is kept by the unpacks themselves, which never evict an image
 * a sandbox runs on.
 */
export class ImagePrefetcher {
  readonly #queue: PQueue;
  readonly #lookahead: number;
  readonly #concurrency: number;
  /** Hints queued or being readied (see prefetch's `hint`). */
  #hints = 0;
  /** Images queued or being readied, by provider, with whether each asker still wants it (see prefetch's `stale`). */
  readonly #pending = new Map<SandboxProvider, Map<string, Array<(() => boolean) | undefined>>>();
  readonly #logger: Logger | undefined;
  #closed = false;

  constructor(options: { concurrency?: number; lookahead?: number; logger?: Logger | undefined } = {}) {
    const concurrency = options.concurrency ?? defaultMaxConcurrentUnpacks();
    this.#queue = new PQueue({ concurrency });
    this.#concurrency = concurrency;
    this.#lookahead = options.lookahead ?? 2 * concurrency;
    this.#logger = options.logger;
  }

  /** Images queued or being readied now. */
  get pending(): number {
    return this.#queue.size + this.#queue.pending;
  }

  /**
   * Queues the readying of `spec`'s image on `provider` (a no-op without an image, or when the
   * provider readies nothing). `hint`: the image of a task only queued next (a node's `upcoming`),
   * readied after the images of rollouts held here and only so many at once as the host unpacks,
   * never taking the lookahead of those. `stale`: true once the asker no longer wants it (its
   * rollout's INIT has begun); checked when its turn comes, and skipped only when every asker of
   * the image is.
   */
  prefetch(provider: SandboxProvider, spec: SandboxSpec, { hint = false, stale }: { hint?: boolean; stale?: () => boolean } = {}): void {
    const image = spec.image;
    if (this.#closed || image === undefined || provider.prefetch === undefined) return;
    let images = this.#pending.get(provider);
    const askers = images?.get(image);
    if (askers !== undefined) {
      askers.push(stale);
      return;
    }
    if (hint ? this.#hints >= this.#concurrency : this.pending - this.#hints >= this.#lookahead) return;
    if (images === undefined) this.#pending.set(provider, (images = new Map()));
    const wanted: Array<(() => boolean) | undefined> = [stale];
    images.set(image, wanted);
    if (hint) this.#hints++;
    void this.#queue
      .add(
        async () => {
          // readied unless every rollout that asked has begun its INIT (which readies it itself)
          if (!this.#closed && wanted.some((isStale) => isStale?.() !== true)) await provider.prefetch!(spec);
        },
        { priority: hint ? -1 : 0 },
      )
      .catch((error: unknown) => this.#logger?.debug({ err: error, image }, 'prefetching an image failed (its INIT will say why)'))
      .finally(() => {
        images.delete(image);
        if (hint) this.#hints--;
      });
  }

  /** Drops what is queued and waits for the prefetches under way. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#queue.clear();
    await this.#queue.onIdle();
  }
}
