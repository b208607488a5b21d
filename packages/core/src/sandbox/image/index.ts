export { defaultImageCacheDir, resolveImage } from './resolve.ts';
export { isImageReference, parseImageReference } from './reference.ts';
export { defaultOverlayMounter, overlayPrefix, overlayRoot, type OverlayMounter } from './overlay.ts';
export { sifRootPartition } from './sif.ts';
export type { ImageConfig, ImageKind, ImageReference, ParsedImageReference, ResolvedImage, ResolveImageOptions } from './types.ts';
