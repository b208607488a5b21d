import { existsSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { RolloutError } from '../../errors.ts';
import { IMAGE_KINDS } from './kinds/index.ts';
import type { ImageKind, ParsedImageReference } from './types.ts';

const KINDS = Object.keys(IMAGE_KINDS) as ImageKind[];

/**
 * Whether `image` is to be resolved as an image: anything but an existing plain root directory
 * (which bwrap binds as it is), so that a wrong or missing one gets `parseImageReference`'s error.
 */
export function isImageReference(image: string): boolean {
  let isDir = false;
  try {
    isDir = statSync(image).isDirectory();
  } catch {
    // not a path: a reference, or an error to report
  }
  return !isDir || existsSync(`${image}/oci-layout`);
}

/**
 * Takes a reference apart (see `ImageReference`). Throws a BAD_REQUEST RolloutError for one it
 * cannot read; whether the image exists is checked when it is resolved.
 */
export function parseImageReference(reference: string): ParsedImageReference {
  const bad = (why: string): RolloutError =>
    new RolloutError({ code: 'BAD_REQUEST', message: `image ${JSON.stringify(reference)}: ${why}`, details: { image: reference } });
  if (typeof reference !== 'string' || reference.trim() === '') throw bad('an image reference is a non-empty string');
  const colon = reference.indexOf(':');
  const prefix = colon > 0 ? reference.slice(0, colon) : '';
  if ((KINDS as string[]).includes(prefix)) {
    const rest = reference.slice(colon + 1);
    if (rest === '') throw bad('no path after the transport');
    if (prefix === 'oci') {
      // oci:<dir>[:<tag>]: a tag has no "/" (skopeo's rule), so "oci:/a:b/c" is a path
      const last = rest.lastIndexOf(':');
      if (last > 0 && !rest.slice(last + 1).includes('/') && rest.slice(last + 1) !== '') {
        return { kind: 'oci', path: resolve(rest.slice(0, last)), tag: rest.slice(last + 1) };
      }
      return { kind: 'oci', path: resolve(rest) };
    }
    return { kind: prefix as ImageKind, path: resolve(rest) };
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(reference) || prefix === 'docker' || prefix === 'library') {
    throw bad(
      'registry references need a network; give a local image: oci:<dir>[:tag], docker-archive:<file>, oci-archive:<file>, sif:<file> or squashfs:<file>',
    );
  }
  const path = resolve(reference);
  if (/\.sif$/i.test(path)) return { kind: 'sif', path };
  if (/\.(sqfs|squashfs|img)$/i.test(path)) return { kind: 'squashfs', path };
  if (/\.tar$/i.test(path)) return { kind: 'docker-archive', path };
  let isDir = false;
  try {
    isDir = statSync(path).isDirectory();
  } catch {
    // reported by resolveImage, with the path
  }
  if (isDir) return { kind: 'oci', path };
  if (!existsSync(path)) {
    throw new RolloutError({ code: 'UNPROCESSABLE', message: `image ${JSON.stringify(reference)}: nothing at ${path}`, details: { image: reference } });
  }
  throw bad('not an image reference (oci:<dir>[:tag], docker-archive:<file>, oci-archive:<file>, sif:<file>, squashfs:<file>)');
}
