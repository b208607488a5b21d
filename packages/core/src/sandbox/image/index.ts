export { createImageResolver, defaultImageCacheDir, defaultMaxCacheBytes, defaultMaxConcurrentUnpacks, resolveImage, type ImageResolver, type SealReport } from './resolve.ts';
export { parseSize } from './cache.ts';
export { isImageReference, parseImageReference } from './reference.ts';
export { defaultOverlayMounter, overlayPrefix, overlayRoot, rootOverlayPrefix, type OverlayMounter } from './overlay.ts';
export { sifRootPartition } from './sif.ts';
export type { ImageConfig, ImageKind, ImageReference, ParsedImageReference, ResolvedImage, ResolveImageOptions } from './types.ts';
