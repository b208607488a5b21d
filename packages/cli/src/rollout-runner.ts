import { createInterface } from 'node:readline';
import { request } from 'undici';
import { RolloutError } from '@rollserve/core';
import { isLegacyResult, toCurrentResult, type RolloutResult, type RolloutService, type RolloutTaskInput } from '@rollserve/core/service';

/** Where `rollserve rollout` sends its tasks: a service in this process, or one running elsewhere. */
export interface RolloutRunner {
  /**
   * Submits tasks (with ids) and calls `onResult` once per rollout as it finishes; results known
   * before (a resumed run) come too, with `resumed` true where the runner can tell. Resolves once
   * every rollout of `tasks` has been reported.
   */
  run(tasks: readonly RolloutTaskInput[], onResult: (result: RolloutResult, resumed: boolean) => void): Promise<void>;
}

/** The service in this process (its store beside the output makes a run resumable). */
export function inProcessRunner(service: RolloutService): RolloutRunner {
  return {
    async run(tasks, onResult) {
      const submitted = await service.submit(tasks);
      await Promise.all(
        submitted.flatMap((task) =>
          task.rolloutIds.map(async (id) => {
            const known = await service.result(id); // null while it runs
            onResult(known ?? (await service.wait(id)), known !== undefined);
          }),
        ),
      );
    },
  };
}

/** A result from the stream (a service from before the wire shape sends camelCase). */
function wireResult(value: unknown): RolloutResult {
  return isLegacyResult(value) ? toCurrentResult(value) : (value as RolloutResult);
}

function failure(url: string, statusCode: number, text: string): RolloutError {
  let message = text.slice(0, 500);
  try {
    const body = JSON.parse(text) as { error?: { message?: string } };
    if (typeof body.error?.message === 'string') message = body.error.message;
  } catch {
    // not JSON: the text as it came
  }
  return new RolloutError({ code: statusCode === 401 ? 'UNAUTHORIZED' : 'UNAVAILABLE', message: `${url}: HTTP ${statusCode}: ${message}` });
}

/** Longer id lists go in a POST body: a query string past 16 KiB of headers is an HTTP 431. */
const MAX_QUERY_IDS_CHARS = 4_000;

/** The NDJSON stream of `ids`' results: GET with a short list (as every release serves), else POST. */
function openStream(base: string, headers: Record<string, string>, ids: readonly string[]) {
  const query = encodeURIComponent(ids.join(','));
  // no idle limits: a rollout may take its whole time limit before the next line comes
  const options = { headers, headersTimeout: 0, bodyTimeout: 0 };
  if (query.length <= MAX_QUERY_IDS_CHARS) return request(`${base}/v1/rollouts/stream?format=ndjson&ids=${query}`, options);
  return request(`${base}/v1/rollouts/stream`, { ...options, method: 'POST', body: JSON.stringify({ ids, format: 'ndjson' }) });
}

/**
 * A running rollout service: `POST /v1/rollouts`, then the stream of their task ids (NDJSON)
 * until every rollout has come; a stream cut short is opened again for the rest.
 */
export function httpRunner(serviceUrl: string, token: string | undefined): RolloutRunner {
  const base = serviceUrl.replace(/\/+$/, '');
  const headers = { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) };
  return {
    async run(tasks, onResult) {
      let submit;
      try {
        submit = await request(`${base}/v1/rollouts`, { method: 'POST', headers, body: JSON.stringify({ tasks }) });
      } catch (error) {
        throw new RolloutError({ code: 'UNAVAILABLE', message: `rollout service ${base} unreachable: ${(error as Error).message}`, cause: error });
      }
      const text = await submit.body.text();
      if (submit.statusCode !== 202) throw failure(`${base}/v1/rollouts`, submit.statusCode, text);
      const accepted = JSON.parse(text) as { tasks: Array<{ task_id: string; rollout_ids: string[] }> };
      const remaining = new Set(accepted.tasks.flatMap((task) => task.rollout_ids));
      const taskIds = accepted.tasks.map((task) => task.task_id);
      for (let attempt = 0; remaining.size > 0; attempt++) {
        if (attempt === 5) throw new RolloutError({ code: 'UNAVAILABLE', message: `${base}/v1/rollouts/stream kept ending with ${remaining.size} rollouts to come` });
        const stream = await openStream(base, headers, taskIds);
        if (stream.statusCode !== 200) throw failure(`${base}/v1/rollouts/stream`, stream.statusCode, await stream.body.text());
        try {
          for await (const line of createInterface({ input: stream.body, crlfDelay: Infinity })) {
            if (line.trim() === '') continue;
            const result = wireResult(JSON.parse(line));
            if (!remaining.delete(result.id)) continue; // sent again on a reopened stream
            onResult(result, false);
          }
        } catch (error) {
          if (remaining.size === 0) break;
          if (attempt === 4) throw error;
        }
      }
    },
  };
}
