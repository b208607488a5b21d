import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import math from '@rollserve/env-math';
import { call, makeResponse } from '@rollserve/testing';
import { createServer } from 'node:net';
import { once } from 'node:events';
import { describe, expect, it } from 'vitest';

// NeMo Gym's judge_failsafe (CONTRACT.md §1.6): a judge call that fails is 200 with the request
// body plus the failure keys, so collection routes the row to <output>_failures.jsonl.
describe('math with a judge that is down', () => {
  it('answers 200 with the whole request, reward 0 and _ng_failure_class', async () => {
    const probe = createServer().listen(0, '127.0.0.1');
    await once(probe, 'listening');
    const { port } = probe.address() as { port: number };
    probe.close(); // nothing listens there now
    const app = createResourcesServer(math, { config: { should_use_judge: true, judge_base_url: `http://127.0.0.1:${port}/v1` } });
    const server = await serveFetch(app);
    try {
      const request = {
        responses_create_params: { input: [{ role: 'user', content: 'What is 3+5?' }] },
        question: 'What is 3+5?',
        expected_answer: '8',
        _ng_task_index: 4,
        agent_ref: { type: 'responses_api_agents', name: 'math_simple_agent' },
        response: makeResponse([{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: '\\boxed{9}', annotations: [] }] }]),
      };
      const answer = await call(server.url, 'POST', '/verify', request);
      expect(answer.status).toBe(200);
      expect(answer.json).toMatchObject({ ...request, reward: 0, _ng_failure_class: 'judge_failed' });
      expect(String((answer.json as Record<string, unknown>)._ng_failure_judge_error)).not.toBe('');
      // A right answer needs no judge.
      const right = await call(server.url, 'POST', '/verify', { ...request, response: makeResponse([{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: '\\boxed{8}', annotations: [] }] }]) });
      expect(right.json).toMatchObject({ reward: 1 });
      expect(right.json).not.toHaveProperty('_ng_failure_class');
    } finally {
      await server.close();
      await app.close();
    }
  });
});
