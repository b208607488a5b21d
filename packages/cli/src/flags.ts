import { RolloutError } from '@rollserve/core';
import { assertBindAllowed } from '@rollserve/core/gym';
import { parseSize } from '@rollserve/core/sandbox';

export const hostArg = { type: 'string', description: 'Address to bind', default: '127.0.0.1' } as const;
export const tokenArgs = {
  token: { type: 'string', description: 'Bearer token every server requires (also ROLLSERVE_TOKEN)' },
  'allow-no-token': {
    type: 'boolean',
    description: 'Serve a non-loopback --host without a token (also ROLLSERVE_ALLOW_NO_TOKEN=1)',
    default: false,
  },
} as const;
export const bodyArgs = {
  'max-body-mib': {
    type: 'string',
    description: 'Largest request body read, MiB: a larger one is a 413 before it is read (a node\'s results: 4 times as much; also ROLLSERVE_MAX_BODY_MIB)',
    default: '64',
  },
} as const;

export interface ServeAccess {
  host: string;
  token: string | undefined;
  allowNoToken: boolean;
  /** The largest request body a server reads (`--max-body-mib`). */
  maxBodyBytes?: number;
}

export const imageArgs = {
  'image-cache-max': {
    type: 'string',
    description: "Cap of this host's image cache (200G, 512M, bytes): least recently used images not in use are evicted (also ROLLSERVE_IMAGE_CACHE_MAX; default no cap)",
  },
  'image-unpacks': {
    type: 'string',
    description: 'Images unpacked at once on this host, first uses and prefetches alike (also ROLLSERVE_IMAGE_UNPACKS; default 2)',
  },
} as const;

/**
 * `--image-cache-max` and `--image-unpacks`, checked, put where every sandbox provider of this
 * process reads them (its environment variables; the flags win over them).
 */
export function applyImageFlags(args: { 'image-cache-max'?: string | undefined; 'image-unpacks'?: string | undefined }): void {
  const cap = args['image-cache-max'];
  if (cap !== undefined && cap !== '') {
    try {
      parseSize(cap, '--image-cache-max');
    } catch {
      throw new RolloutError({ code: 'BAD_REQUEST', message: `--image-cache-max takes a size (bytes, or a number with K, M, G or T: 200G), not "${cap}"` });
    }
    process.env.ROLLSERVE_IMAGE_CACHE_MAX = cap;
  }
  const unpacks = numberFlag('image-unpacks', args['image-unpacks'], { integer: true, min: 1 });
  if (unpacks !== undefined) process.env.ROLLSERVE_IMAGE_UNPACKS = String(unpacks);
}

/** The token and bind policy from the flags and the environment, checked before anything starts. */
export function serveAccess(args: { host: string; token?: string | undefined; 'allow-no-token'?: boolean; 'max-body-mib'?: string | undefined }): ServeAccess {
  const access = {
    host: args.host,
    token: (args.token ?? process.env.ROLLSERVE_TOKEN) || undefined,
    allowNoToken: args['allow-no-token'] === true || process.env.ROLLSERVE_ALLOW_NO_TOKEN === '1',
    ...maxBodyOf(args['max-body-mib']),
  };
  assertBindAllowed(access);
  return access;
}

/** `--max-body-mib` (its default yields to ROLLSERVE_MAX_BODY_MIB), in bytes. */
export function maxBodyOf(flag: string | undefined): { maxBodyBytes?: number } {
  const given = process.argv.some((arg) => arg === '--max-body-mib' || arg.startsWith('--max-body-mib='));
  const value = given ? flag : (process.env.ROLLSERVE_MAX_BODY_MIB ?? flag);
  const mib = numberFlag('max-body-mib', value, { min: 1 / 1024 });
  return mib === undefined ? {} : { maxBodyBytes: Math.floor(mib * 1024 * 1024) };
}

/** A comma-separated flag, as a list. */
export const listFlag = (value: string | undefined) => (value ?? '').split(',').map((s) => s.trim()).filter(Boolean);

/** A numeric flag, checked: a typo is an error that names the flag, not NaN sent on. */
export function numberFlag(name: string, value: string | undefined, { integer = false, min = 0 }: { integer?: boolean; min?: number } = {}): number | undefined {
  if (value === undefined || value === '') return undefined;
  const number = Number(value);
  if (!Number.isFinite(number) || (integer && !Number.isInteger(number)) || number < min) {
    throw new RolloutError({ code: 'BAD_REQUEST', message: `--${name} takes ${integer ? 'an integer' : 'a number'} >= ${min}, not "${value}"` });
  }
  return number;
}
