import { RolloutError } from '../errors.ts';
import { SERVICE_WORKER_ID } from '../protocol/nodes.ts';

/** The id under which the service leases what its own pools run (no node may register under it). */
export const LOCAL = SERVICE_WORKER_ID;

export const unavailable = () => new RolloutError({ code: 'UNAVAILABLE', message: 'the service is shutting down', retryable: true });
