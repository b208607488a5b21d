import type { RolloutResult } from '@rollserve/core/service';
import { startFakePolicy } from '@rollserve/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { getJson, Resources, sandboxDir, sleep, startNode, startService, until } from './helpers.ts';

// A rollout node's turns, sent to the backend by the node itself on the service's route or through
// the service (--proxy-turns), record the weight version of the backend that generated them, wait
// while generation is paused for a weight update (at the node, or at the service), and their time
// limit leaves the pause out (the node hears of it with its registration and heartbeats).

const resources = new Resources();
afterEach(() => resources.cleanup(), 60_000);

describe.each([
  ['sending its turns to the backend itself', true],
  ['sending its turns through the service', false],
])('a rollout node %s across a weight update', (_, directBackends) => {
  it('waits while generation is paused, then runs on the announced version; the pause is not charged to its time limit', async () => {
    const fake = await startFakePolicy({
      script: (request) => {
        const messages = request.messages as Array<{ role: string }>;
        if (messages.some((m) => m.role === 'tool')) return 'done';
        const tag = /tag (\w+)/.exec(JSON.stringify(messages))![1]!;
        return { toolCalls: [{ name: 'bash', arguments: { command: `echo tag-${tag}` } }] };
      },
    });
    resources.add(() => fake.close());
    const { url, results } = await startService(resources, fake.url);
    expect((await getJson(url, '/v1/weights', { body: { version: 4 } })).json).toMatchObject({ newest: 4 });
    expect((await getJson(url, '/v1/weights/pause', { body: { mode: 'abort' } })).json).toMatchObject({ in_flight: 0 });
    const sandboxes = await sandboxDir(resources);
    await startNode(resources, { serviceUrl: url, nodeId: 'weights-node', pools: { init: 2, run: 2, eval: 2 }, maxRollouts: 2, directBackends }, sandboxes);
    const tasks = ['wn1', 'wn2'].map((id) => ({
      id,
      env: 'shell',
      row: { responses_create_params: { input: `print tag ${id}` }, tag: id },
      policy: { model: 'fake-policy' },
      // shorter than the pause below, and long enough for the rollout's own work on a loaded host
      limits: { time_limit_s: 4 },
    }));
    expect((await getJson(url, '/v1/rollouts', { body: { tasks } })).status).toBe(202);
    // the node holds both (past INIT, at their first turn) while no policy call reaches a backend
    await until(async () => (await getJson(url, '/v1/nodes')).json.nodes[0]?.leases === 2 || results.length > 0);
    await sleep(5_000);
    expect(fake.calls).toHaveLength(0);
    expect(results).toHaveLength(0);

    expect((await getJson(url, '/v1/weights/resume', { body: { version: 5 } })).json).toMatchObject({ newest: 5, pause: null });
    await until(() => results.length === 2);
    for (const result of results as RolloutResult[]) {
      expect(result).toMatchObject({ state: 'done', reward: 1, critical_error: null, weight_version_min: 5, weight_version_max: 5 });
      expect(result.turns.map((turn) => turn.weight_version)).toEqual([5, 5]);
    }
  }, 90_000);
});
