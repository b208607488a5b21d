import type { ImageConfig, ParsedImageReference } from '../types.ts';

/** One image unpacked by its kind: where it goes and who unpacks it. */
export interface UnpackJob {
  /** The reference as given (for errors). */
  reference: string;
  parsed: ParsedImageReference;
  /** The entry's staging directory (the unpacking uid's under a root service): scratch space goes here. */
  staging: string;
  /** Where the root filesystem is unpacked (inside `staging`). */
  rootfs: string;
  /** The unprivileged uid that runs the tools under a root service; undefined otherwise. */
  unpackAs: { uid: number; gid: number } | undefined;
  /** Aborted when the unpack is no longer wanted (the cache turned out to hold the image): the tools are killed. */
  signal?: AbortSignal;
  /** Told how the image was unpacked when a kind has more than one way (`tar`, `umoci (<why not tar>)`): kept in the entry's record. */
  report?: (how: string) => void;
}

/**
 * What one kind of image (`oci`, `sif`, ...) brings to the resolver (resolve.ts): how its source
 * is stamped and keyed, and how it is unpacked. The resolver does the rest (cache, lock, staging,
 * ownership, sealing) alike for every kind.
 */
export interface ImageKindHandler {
  /**
   * The file whose size, mtime and inode stand for the source's state (what a cached digest was
   * computed from), and what to say when it is not there.
   */
  source(parsed: ParsedImageReference): { path: string; missing: string };
  /** The cache key, when the kind names one itself (an OCI manifest's digest); else the sha256 of the source file. */
  digest?(reference: string, parsed: ParsedImageReference): string;
  /**
   * Unpacks the image into `job.rootfs` and returns how its config is read: called once the
   * service owns the unpacked files.
   */
  unpack(job: UnpackJob): Promise<(rootfs: string) => ImageConfig>;
}
