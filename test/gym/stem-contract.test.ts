import { join } from 'node:path';
import stem from '@rollserve/env-stem';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { call, describeContract, referenceCases, workspaceRoot, type VerifyCase } from '@rollserve/testing';
import { describe, expect, it } from 'vitest';
import { parsePythonTyped, pythonReferenceTyped, pythonTypeDifferences } from './python-json.ts';

// Today's mcqa answers for its fixtures (the README: index 2 is 1.0 and "C" now).
const verifyCases: VerifyCase[] = referenceCases('mcqa').map(({ row, recorded, reference }) => ({
  name: `mcqa rollout ${reference.recorded_rollout_index}`,
  request: { ...row, response: recorded.response },
  expectedReward: reference.reward,
  expectedExtras: reference.extras,
}));

describeContract({
  env: stem,
  extraKeys: ['expected_answer', 'extracted_answer'],
  sampleRow: {
    options: [{ A: 'opt1' }, { B: 'opt2' }],
    expected_answer: 'B',
    responses_create_params: { input: [{ role: 'user', content: 'Q?' }] },
  },
  verifyCases,
  packageDir: join(workspaceRoot(), 'environments', 'stem'),
});

describe("stem: mcqa's JSON types on /verify and /aggregate_metrics", () => {
  it("writes what mcqa writes for its fixtures: reward 1.0/0.0, metrics byte for byte", async () => {
    const app = createResourcesServer(stem, { instanceName: 'mcqa' });
    const running = await serveFetch(app);
    try {
      const reference = pythonReferenceTyped('mcqa');
      const entries: Array<Record<string, unknown>> = [];
      for (const [i, { row, recorded, reference: ref }] of referenceCases('mcqa').entries()) {
        const verified = await call(running.url, 'POST', '/verify', { ...row, response: recorded.response });
        expect(verified.status).toBe(200);
        const ours = parsePythonTyped(verified.text) as Record<string, unknown>;
        const theirs = reference.rows.find((r) => r.recorded_rollout_index.value === ref.recorded_rollout_index)!;
        expect(ours.reward).toEqual(theirs.reward);
        expect(verified.text).toContain(`"reward":${theirs.reward.raw}`);
        const { responses_create_params: _p, response, ...rest } = verified.json as Record<string, unknown>;
        entries.push({ ...rest, response: { usage: (response as { usage: unknown }).usage }, _ng_task_index: i, _ng_rollout_index: 0, agent_ref: { type: 'responses_api_agents', name: 'mcqa_simple_agent' } });
      }
      // The collector's /aggregate_metrics over these: NeMo Gym's answer in python_reference.json.
      const metrics = await call(running.url, 'POST', '/aggregate_metrics', { verify_responses: entries });
      expect(pythonTypeDifferences(parsePythonTyped(metrics.text), reference.aggregate_metrics)).toEqual([]);
    } finally {
      await running.close();
      await app.close();
    }
  });
});
