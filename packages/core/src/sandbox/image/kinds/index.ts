import type { ImageKind } from '../types.ts';
import { archive } from './archive.ts';
import type { ImageKindHandler } from './kind.ts';
import { oci } from './oci.ts';
import { squashfs } from './squashfs.ts';

export type { ImageKindHandler, UnpackJob } from './kind.ts';

/** Every kind of image, by the name its references carry (a new kind: one file and one line here). */
export const IMAGE_KINDS: Record<ImageKind, ImageKindHandler> = {
  oci,
  'docker-archive': archive,
  'oci-archive': archive,
  sif: squashfs,
  squashfs,
};
