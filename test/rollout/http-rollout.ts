import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';
import { expect } from 'vitest';

/** A rollout service reached over HTTP with its bearer token (what these suites submit through). */
export interface HttpService {
  url: string;
  token: string;
}

const headers = (service: HttpService) => ({ authorization: `Bearer ${service.token}`, 'content-type': 'application/json' });

/** Submits one task (a POST /v1/rollouts body) and waits for its result, as a trainer polling GET /v1/rollouts/{id} would. */
export async function submitAndWait<Result>(service: HttpService, task: Record<string, unknown>): Promise<Result> {
  const submitted = await request(`${service.url}/v1/rollouts`, { method: 'POST', headers: headers(service), body: JSON.stringify(task) });
  const accepted = (await submitted.body.json()) as { tasks?: Array<{ rollout_ids: string[] }> };
  expect(submitted.statusCode, JSON.stringify(accepted)).toBe(202);
  const rolloutId = accepted.tasks![0]!.rollout_ids[0]!;
  for (;;) {
    const got = await request(`${service.url}/v1/rollouts/${rolloutId}`, { headers: headers(service) });
    const view = (await got.body.json()) as { result: Result | null };
    if (view.result !== null) return view.result;
    await sleep(100);
  }
}

/** The service's live sandboxes (GET /v1/status). */
export async function liveSandboxes(service: HttpService): Promise<number> {
  const got = await request(`${service.url}/v1/status`, { headers: headers(service) });
  return ((await got.body.json()) as { live_sandboxes: number }).live_sandboxes;
}
