import { BlockList, isIPv6 } from 'node:net';
import { RolloutError } from '../errors.ts';

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** True for `localhost`, 127.0.0.0/8 and ::1 (IPv4-mapped forms included). */
export function isLoopbackHost(host: string): boolean {
  const address = host.replace(/^\[(.*)\]$/, '$1').toLowerCase();
  if (address === 'localhost') return true;
  try {
    return LOOPBACK.check(address, isIPv6(address) ? 'ipv6' : 'ipv4');
  } catch {
    return false; // a host name: it may resolve anywhere
  }
}

// RFC 6750's b64token, the only tokens hono's bearerAuth accepts in a header.
const TOKEN = /^[A-Za-z0-9._~+/-]+=*$/;

/** The token itself, if a client can send it as `Authorization: Bearer <token>`; throws otherwise. */
export function checkToken(token: string): string {
  if (!TOKEN.test(token)) {
    throw new RolloutError({
      code: 'BAD_REQUEST',
      message: 'the token must be letters, digits and -._~+/ (optionally ending in =), as a Bearer header carries it',
    });
  }
  return token;
}

export interface BindPolicy {
  host: string;
  token?: string | undefined;
  /** Serve a non-loopback address without a token anyway (`--allow-no-token`). */
  allowNoToken?: boolean | undefined;
}

/**
 * Refuses to serve a non-loopback address without a token: anyone who can reach the port could
 * otherwise drive the service (add LLM backends, read results) or the environments' tools.
 */
export function assertBindAllowed({ host, token, allowNoToken = false }: BindPolicy): void {
  if (token !== undefined) checkToken(token);
  if (token !== undefined || allowNoToken || isLoopbackHost(host)) return;
  throw new RolloutError({
    code: 'BAD_REQUEST',
    message:
      `refusing to serve ${host} without a token: anyone who can reach it could use it. ` +
      'Set --token (or ROLLSERVE_TOKEN), bind 127.0.0.1, or pass --allow-no-token (ROLLSERVE_ALLOW_NO_TOKEN=1) to serve it open.',
  });
}
