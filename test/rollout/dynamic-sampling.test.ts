import { defineEnvironment, defineTool } from '@rollserve/core';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { call, startFakePolicy, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';

// Dynamic sampling (DAPO) over the real service with the scripted policy: a pool whose groups are
// informative, all-equal or filtered by construction, and the training view's response cap.

let fake: FakePolicy;
let server: RolloutServer;

/**
 * The row's `kind` makes its group: 'mixed' (sample 0 scores 1, the others 0), 'same' (every
 * sample 1), 'broken' (verify cannot score: filtered), 'slow' (the policy never answers), 'tool'
 * (two tool turns, then an answer cut by max_tokens).
 */
const coin = defineEnvironment({
  name: 'coin',
  domain: 'other',
  row: z.object({ kind: z.enum(['mixed', 'same', 'broken', 'slow', 'tool']) }),
  tools: {
    add: defineTool({ description: 'Adds one', parameters: z.object({ to: z.number() }), handler: ({ to }) => ({ sum: to + 1 }) }),
  },
  verify: (row, response) => {
    const text = JSON.stringify(response.output);
    if (row.kind === 'broken') return { reward: 0, _ng_failure_class: 'judge_failed' };
    if (row.kind === 'mixed') return { reward: text.includes('sample 0') ? 1 : 0 };
    return { reward: 1 };
  },
});

const task = (id: string, kind: string, extra: Record<string, unknown> = {}) => ({
  id,
  env: 'coin',
  n: 3,
  row: { responses_create_params: { input: `${kind} ${id}` }, kind },
  policy: { model: 'fake-policy' },
  ...extra,
});

beforeAll(async () => {
  fake = await startFakePolicy({
    script: (req, ctx): FakeReply => {
      const first = (req.messages.find((m) => (m as { role: string }).role === 'user') as { content: string }).content;
      const sample = (ctx.headers['x-rollout-id'] ?? '').split(':').at(-1);
      if (first.startsWith('slow')) return { content: 'never', hang: true };
      if (first.startsWith('tool')) {
        if (ctx.turn < 2) return { toolCalls: [{ name: 'add', arguments: { to: ctx.turn } }] };
        return { content: 'the sum is two', finishReason: 'length' };
      }
      return `sample ${sample}`;
    },
  });
  server = await startRolloutServer({ environments: [coin], llmBackends: [fake.url], defaultModel: 'fake-policy' });
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

/** The NDJSON lines of a stream, read to its end. */
async function lines(path: string): Promise<any[]> {
  const response = await fetch(`${server.url}${path}`);
  expect(response.status).toBe(200);
  return (await response.text())
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line));
}

const submitted = async (body: unknown) => {
  const response = await call(server.url, 'POST', '/v1/rollouts', body);
  expect(response.status, JSON.stringify(response.json)).toBe(202);
  return response.json as { tasks: Array<{ task_id: string; rollout_ids: string[] }>; sampling: any };
};

describe('dynamic sampling', () => {
  it('delivers exactly the informative groups asked for, trying the pool in order, and counts what it dropped', async () => {
    const pool = [
      task('ds-same-a', 'same'),
      task('ds-mixed-1', 'mixed'),
      task('ds-broken-1', 'broken'),
      task('ds-same-b', 'same'),
      task('ds-mixed-2', 'mixed'),
      task('ds-mixed-3', 'mixed'),
      task('ds-mixed-4', 'mixed'),
    ];
    // one group at a time: the order of the outcomes is the pool's
    const answer = await submitted({ tasks: pool, dynamic_sampling: { id: 'ds-1', groups: 3, max_in_flight: 1 } });
    expect(answer.tasks.map((t) => t.task_id)).toEqual(['ds-same-a']);
    expect(answer.sampling).toMatchObject({ id: 'ds-1', state: 'running', groups: 3, max_groups: 7, max_in_flight: 1, metric: 'reward', pool: 7, tried: 1 });

    const items = await lines('/v1/rollouts/sampling/ds-1/stream');
    const groups = items.slice(0, -1);
    expect(groups.map((g) => g.task_id)).toEqual(['ds-mixed-1', 'ds-mixed-2', 'ds-mixed-3']);
    for (const group of groups) {
      expect(group.results.map((r: any) => r.reward)).toEqual([1, 0, 0]);
      // delivered whole: the group's advantages are filled
      expect(group.results.every((r: any) => typeof r.advantage === 'number')).toBe(true);
    }
    const end = items.at(-1).sampling;
    expect(end).toMatchObject({ state: 'done', tried: 6, kept: 3, dropped_all_equal: 2, filtered: 1, cancelled: 0, running: 0, error: null });
    expect(end.kept_task_ids).toEqual(['ds-mixed-1', 'ds-mixed-2', 'ds-mixed-3']);
    expect(end.tasks).toEqual([
      { task_id: 'ds-same-a', outcome: 'all_equal' },
      { task_id: 'ds-mixed-1', outcome: 'kept' },
      { task_id: 'ds-broken-1', outcome: 'filtered' },
      { task_id: 'ds-same-b', outcome: 'all_equal' },
      { task_id: 'ds-mixed-2', outcome: 'kept' },
      { task_id: 'ds-mixed-3', outcome: 'kept' },
    ]);
    expect((await call(server.url, 'GET', '/v1/rollouts/sampling/ds-1')).json).toEqual(end);

    // every sample tried is readable by id; the task never tried was never stored
    for (const { task_id } of end.tasks) {
      const group = await call(server.url, 'GET', `/v1/rollouts/${task_id}`);
      expect(group.status).toBe(200);
      expect((group.json as any).rollouts.map((r: any) => r.state)).toEqual(task_id === 'ds-broken-1' ? ['failed', 'failed', 'failed'] : ['done', 'done', 'done']);
    }
    expect((await call(server.url, 'GET', '/v1/rollouts/ds-mixed-4')).status).toBe(404);

    // the same sampling id again starts nothing and answers the sampling
    const again = await submitted({ tasks: pool, dynamic_sampling: { id: 'ds-1', groups: 3 } });
    expect(again.tasks).toEqual([]);
    expect(again.sampling).toEqual(end);
  });

  it('cancels the groups still running once enough are kept; their samples stay readable', async () => {
    const pool = [task('dc-slow-1', 'slow'), task('dc-mixed-1', 'mixed'), task('dc-slow-2', 'slow'), task('dc-mixed-2', 'mixed')];
    const answer = await submitted({ tasks: pool, dynamic_sampling: { id: 'dc', groups: 2, max_in_flight: 4 } });
    expect(answer.tasks.map((t) => t.task_id)).toEqual(['dc-slow-1', 'dc-mixed-1', 'dc-slow-2', 'dc-mixed-2']);

    const items = await lines('/v1/rollouts/sampling/dc/stream?view=training');
    expect(items.slice(0, -1).map((g) => g.task_id)).toEqual(['dc-mixed-1', 'dc-mixed-2']);
    // training views: the group's samples with their ids
    expect(items[0].results.map((v: any) => v.response_ids !== undefined && v.truncated === false)).toEqual([true, true, true]);
    expect(items.at(-1).sampling).toMatchObject({ state: 'done', tried: 4, kept: 2, dropped_all_equal: 0, filtered: 0, cancelled: 2, running: 0 });
    expect(items.at(-1).sampling.tasks).toEqual([
      { task_id: 'dc-slow-1', outcome: 'cancelled' },
      { task_id: 'dc-mixed-1', outcome: 'kept' },
      { task_id: 'dc-slow-2', outcome: 'cancelled' },
      { task_id: 'dc-mixed-2', outcome: 'kept' },
    ]);
    for (const id of ['dc-slow-1', 'dc-slow-2']) {
      const rollouts = (await call(server.url, 'GET', `/v1/rollouts/${id}`)).json as any;
      // cancelled rollouts end once their stage lets go of them
      for (const r of rollouts.rollouts) {
        const ended = await call(server.url, 'DELETE', `/v1/rollouts/${r.id}`);
        expect((ended.json as any).state).toBe('cancelled');
        expect((ended.json as any).result.critical_error).toBe('cancelled');
      }
    }
  });

  it('ends exhausted when the cap is reached before the target, and says so at the end of its stream', async () => {
    const pool = [task('dx-same-1', 'same'), task('dx-broken-1', 'broken'), task('dx-same-2', 'same'), task('dx-mixed-1', 'mixed')];
    await submitted({ tasks: pool, dynamic_sampling: { id: 'dx', groups: 2, max_groups: 3 } });
    const items = await lines('/v1/rollouts/sampling/dx/stream?format=ndjson');
    expect(items).toHaveLength(1);
    expect(items[0].sampling).toMatchObject({ state: 'exhausted', max_groups: 3, tried: 3, kept: 0, dropped_all_equal: 2, filtered: 1, cancelled: 0, kept_task_ids: [] });
    expect((await call(server.url, 'GET', '/v1/rollouts/dx-mixed-1')).status).toBe(404);

    // SSE: the same end as a `sampling` event, then `end`
    const sse = await (await fetch(`${server.url}/v1/rollouts/sampling/dx/stream?format=sse`)).text();
    expect(sse).toMatch(/^event: sampling\ndata: \{"sampling":\{"id":"dx","state":"exhausted"/);
    expect(sse.endsWith('event: end\ndata: {}\n\n')).toBe(true);
  });

  it('stops on request: nothing more starts, running groups are cancelled', async () => {
    await submitted({ tasks: [task('dd-slow-1', 'slow'), task('dd-mixed-1', 'mixed')], dynamic_sampling: { id: 'dd', groups: 1, max_in_flight: 1 } });
    const stopped = await call(server.url, 'DELETE', '/v1/rollouts/sampling/dd');
    expect(stopped.status).toBe(200);
    expect(stopped.json).toMatchObject({ state: 'stopped', tried: 1, kept: 0, cancelled: 1, tasks: [{ task_id: 'dd-slow-1', outcome: 'cancelled' }] });
    const items = await lines('/v1/rollouts/sampling/dd/stream');
    expect(items).toEqual([{ sampling: stopped.json }]);
    expect((await call(server.url, 'GET', '/v1/rollouts/dd-mixed-1')).status).toBe(404);
  });

  it('refuses bad options with a 422 naming the field, and an unknown sampling with a 404', async () => {
    const pool = [task('bad-1', 'mixed'), task('bad-2', 'mixed')];
    const cases: Array<[unknown, string]> = [
      [{ groups: 0 }, 'dynamic_sampling.groups'],
      [{ groups: 3 }, 'dynamic_sampling.groups'],
      [{ groups: 2, max_groups: 1 }, 'dynamic_sampling.max_groups'],
      [{ groups: 1, max_in_flight: 0 }, 'dynamic_sampling.max_in_flight'],
      [{ groups: 1, metric: 'acc' }, 'dynamic_sampling.metric'],
      [{ groups: 1, max_group: 2 }, 'dynamic_sampling'],
    ];
    for (const [options, field] of cases) {
      const response = await call(server.url, 'POST', '/v1/rollouts', { tasks: pool, dynamic_sampling: options });
      expect(response.status, JSON.stringify(options)).toBe(422);
      expect((response.json as any).error.message).toContain(field);
    }
    const twice = await call(server.url, 'POST', '/v1/rollouts', { tasks: [pool[0], pool[0]], dynamic_sampling: { groups: 1 } });
    expect(twice.status).toBe(422);
    expect((twice.json as any).error.message).toMatch(/in the pool twice/);
    // a task that does not fit its environment refuses the whole pool, before anything starts
    const unfit = await call(server.url, 'POST', '/v1/rollouts', { tasks: [pool[0], task('bad-3', 'nope')], dynamic_sampling: { groups: 1 } });
    expect(unfit.status).toBe(422);
    expect((await call(server.url, 'GET', '/v1/rollouts/bad-1')).status).toBe(404);
    expect((await call(server.url, 'GET', '/v1/rollouts/sampling/nope')).status).toBe(404);
    expect((await call(server.url, 'GET', '/v1/rollouts/sampling/nope/stream')).status).toBe(404);
  });
});

describe('over-long responses in the training view', () => {
  it('cuts a view at max_response_tokens element by element against the uncapped view, and flags it', async () => {
    await submitted(task('long-1', 'tool', { n: 1 }));
    await lines('/v1/rollouts/stream?ids=long-1');
    const whole = (await call(server.url, 'GET', '/v1/rollouts/long-1?view=training')).json as any;
    expect(whole.sequence_error).toBeNull();
    expect(whole.turns.map((t: any) => t.finish_reason)).toEqual(['tool_calls', 'tool_calls', 'length']);
    // the last generation stopped on max_tokens: truncated without a cap
    expect(whole).toMatchObject({ finish_reason: 'length', truncated: true });
    const length = whole.response_ids.length;
    const [, second] = whole.turns.map((t: any) => t.generation_span);
    // caps: inside the second turn's generation, inside the context before it, and past the end
    for (const cap of [second[0] + 1, second[0] - 1, length, length + 5]) {
      const view = (await call(server.url, 'GET', `/v1/rollouts/long-1?view=training&max_response_tokens=${cap}`)).json as any;
      const kept = Math.min(cap, length);
      for (const field of ['response_ids', 'response_mask', 'response_logprobs', 'response_turn']) {
        expect(view[field], field).toHaveLength(kept);
        for (let i = 0; i < kept; i++) expect(view[field][i], `${field}[${i}]`).toBe(whole[field][i]);
      }
      expect(view.prompt_ids).toEqual(whole.prompt_ids);
      expect(view.turns.map((t: any) => t.generation_span)).toEqual(whole.turns.map((t: any) => [Math.min(t.generation_span[0], cap), Math.min(t.generation_span[1], cap)]));
      expect(view.turns.map((t: any) => t.finish_reason)).toEqual(['tool_calls', 'tool_calls', 'length']);
      expect(view.truncated).toBe(true);
    }
    // the streams take the cap too; without view=training it is a 400, a bad one a 422
    const streamed = await lines(`/v1/rollouts/stream?ids=long-1&view=training&max_response_tokens=3`);
    expect(streamed[0].response_ids).toEqual(whole.response_ids.slice(0, 3));
    const posted = await fetch(`${server.url}/v1/rollouts/groups/stream`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ids: ['long-1'], view: 'training', max_response_tokens: 2 }),
    });
    expect(JSON.parse((await posted.text()).trim()).results[0].response_mask).toEqual(whole.response_mask.slice(0, 2));
    expect((await call(server.url, 'GET', '/v1/rollouts/long-1?max_response_tokens=3')).status).toBe(400);
    expect((await call(server.url, 'GET', '/v1/rollouts/long-1?view=training&max_response_tokens=0')).status).toBe(422);
    // overlong=mask: a truncated view stays whole but out of the loss (its mask all 0), on the GET and the streams
    expect(whole.response_mask).toContain(1);
    const masked = (await call(server.url, 'GET', '/v1/rollouts/long-1?view=training&overlong=mask&max_response_tokens=4')).json as any;
    expect(masked.response_ids).toEqual(whole.response_ids.slice(0, 4));
    expect(masked.response_mask).toEqual([0, 0, 0, 0]);
    expect(masked.truncated).toBe(true);
    const maskedWhole = (await lines('/v1/rollouts/stream?ids=long-1&view=training&overlong=mask'))[0];
    expect(maskedWhole.response_mask).toEqual(whole.response_mask.map(() => 0));
    const maskedGroup = await fetch(`${server.url}/v1/rollouts/groups/stream`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ids: ['long-1'], view: 'training', overlong: 'mask' }),
    });
    expect(JSON.parse((await maskedGroup.text()).trim()).results[0].response_mask).toEqual(whole.response_mask.map(() => 0));
    expect((await call(server.url, 'GET', '/v1/rollouts/long-1?overlong=mask')).status).toBe(400);
    expect((await call(server.url, 'GET', '/v1/rollouts/long-1?view=training&overlong=drop')).status).toBe(422);
  });

  it('a view that ends where the model stopped is not truncated', async () => {
    await submitted(task('short-1', 'mixed', { n: 1 }));
    await lines('/v1/rollouts/stream?ids=short-1');
    const view = (await call(server.url, 'GET', '/v1/rollouts/short-1?view=training')).json as any;
    expect(view).toMatchObject({ finish_reason: 'stop', truncated: false });
    expect(view.turns[0].finish_reason).toBe('stop');
    // and keeps its mask with overlong=mask
    const masked = (await call(server.url, 'GET', '/v1/rollouts/short-1?view=training&overlong=mask')).json as any;
    expect(masked.response_mask).toEqual(view.response_mask);
    expect(masked.response_mask).toContain(1);
  });
});
