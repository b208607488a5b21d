import { RolloutError } from '@rollserve/core';
import { assertBindAllowed } from '@rollserve/core/gym';

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
