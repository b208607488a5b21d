/**
 * A container image a sandbox runs on, named by reference:
 *
 * - `oci:<dir>[:<tag>]`: an OCI image layout directory (tag from `index.json`'s
 *   `org.opencontainers.image.ref.name`; the only manifest when omitted).
 * - `docker-archive:<file.tar>`: a `docker save` tarball; `oci-archive:<file.tar>`: an OCI layout
 *   as a tarball (both copied into an OCI layout with skopeo first).
 * - `sif:<file>`: an Apptainer/Singularity SIF (its primary squashfs partition).
 * - `squashfs:<file>`: a plain squashfs root filesystem.
 * - A bare path is recognised by its form: a directory with `oci-layout` is `oci:`, `*.sif` is
 *   `sif:`, `*.sqfs`/`*.squashfs`/`*.img` is `squashfs:`, `*.tar` is `docker-archive:`.
 * - Registry references (`docker://…`) are refused: there is no network to pull from.
 *
 * @example 'oci:/images/sweb.eval.x86_64.django__django-11099:latest'
 */
export type ImageReference = string;

export type ImageKind = 'oci' | 'docker-archive' | 'oci-archive' | 'sif' | 'squashfs';

/** A reference taken apart. */
export interface ParsedImageReference {
  kind: ImageKind;
  /** Absolute host path of the layout directory or the file. */
  path: string;
  /** OCI tag (`oci:` only). */
  tag?: string;
}

/** What of the image's config a sandbox honours (OCI `config.Env`, `WorkingDir`, `User`). */
export interface ImageConfig {
  /** `config.Env` as a map. @example { PATH: '/opt/miniconda3/bin:/usr/bin:/bin' } */
  env: Record<string, string>;
  /** `config.WorkingDir`, when set. @example '/testbed' */
  workdir?: string;
  /**
   * `config.User` resolved against the image's `/etc/passwd` and `/etc/group`, when it can be
   * (numeric, or a name found there). Undefined means root.
   */
  user?: { uid: number; gid: number };
}

/** An image unpacked in the cache, ready to be a sandbox's root. */
export interface ResolvedImage {
  /** The reference as given. */
  reference: ImageReference;
  /** The cache key: `sha256:<hex>` of the OCI manifest, or of the SIF/squashfs/archive file. */
  digest: string;
  /** The unpacked, sealed root filesystem (the service's; sandboxes see it read-only, through their overlay). */
  rootfs: string;
  config: ImageConfig;
  /** True when this call unpacked the image (false when the cache already held it). */
  unpacked: boolean;
  /**
   * With `hold`: ends this use of the entry (a sandbox on it closed); until then no eviction
   * removes it, in this process or another sharing the cache. Idempotent.
   */
  release?: () => void;
}

export interface ResolveImageOptions {
  /**
   * The image cache: one directory per image under it, the service's alone (0700; 0711 under
   * root, each entry 0700).
   * @default $ROLLSERVE_IMAGE_CACHE, else `<os.tmpdir()>/rollserve-images`
   */
  cacheDir?: string;
  /** How long to wait for another process unpacking the same image. @default 600_000 */
  lockTimeoutMs?: number;
  /**
   * Who runs the unpack tools when the service runs as root (the image's files are then taken by
   * the service and sealed). Ignored otherwise. @default { uid: 65534, gid: 65534 } (the bwrap
   * provider's default sandbox user)
   */
  unpackAs?: { uid: number; gid: number };
  /**
   * The cache's cap in bytes (du of the entries). After an unpack, and at the first resolve in a
   * cache, entries least recently used go until the cache is under it, never one in use (held, by
   * any process sharing the cache) nor one being unpacked; an image in use may keep the cache over
   * it. @default $ROLLSERVE_IMAGE_CACHE_MAX (`200G`, `512M`, bytes), else no cap
   */
  maxCacheBytes?: number;
  /**
   * First uses (unpacks) of different images at once, on this host, across every process sharing
   * the cache (lock files of the cache). @default $ROLLSERVE_IMAGE_UNPACKS, else 2
   */
  maxConcurrentUnpacks?: number;
  /**
   * Hold the entry for the caller (a sandbox running on it) until `release()` of the result: no
   * eviction removes it meanwhile. Without it, a resolve marks the entry used and holds nothing.
   * @default false
   */
  hold?: boolean;
}
