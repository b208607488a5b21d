import { join } from 'node:path';
import math from '@rollserve/env-math';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { describe, expect, it } from 'vitest';
import {
  call,
  describeContract,
  referenceCases,
  unhashReference,
  workspaceRoot,
  type VerifyCase,
} from '@rollserve/testing';

const EXTRAS = ['expected_answer', 'extracted_answer', 'library_reward', 'judge_evaluations'];

// The fixture README: rollout 1 is equivalent (math-verify proves it in ~9 s, past its own 5 s
// limit, so today's Python server gives 0). The expected behaviour is the recording's 1.0.
const RECORDED_WINS = new Set([1]);

const verifyCases: VerifyCase[] = referenceCases('math_with_judge').map(({ row, recorded, reference: ref }) => {
  const recordedWins = RECORDED_WINS.has(ref.recorded_rollout_index);
  const extras = unhashReference(ref.extras, [String(recorded.expected_answer)]);
  return {
    name: `math_with_judge rollout ${ref.recorded_rollout_index}`,
    request: { ...row, response: recorded.response },
    expectedReward: recordedWins ? ref.recorded_reward : ref.reward,
    expectedExtras: recordedWins ? { ...extras, library_reward: ref.recorded_reward } : extras,
  };
});

describeContract({
  env: math,
  extraKeys: EXTRAS,
  sampleRow: { question: 'What is 3+5?', expected_answer: '8', responses_create_params: { input: [{ role: 'user', content: 'What is 3+5?' }] } },
  verifyCases,
  packageDir: join(workspaceRoot(), 'environments', 'math'),
});

describe('math /verify JSON, byte for byte where NeMo Gym writes floats', () => {
  it('sends reward and library_reward as floats (1.0, 0.0), as pydantic float fields print', async () => {
    const server = await serveFetch(createResourcesServer(math, {}));
    try {
      const body = (text: string) => ({
        responses_create_params: { input: 'What is 3+5?' },
        question: 'What is 3+5?',
        expected_answer: '8',
        response: { id: 'r', output: [{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text }] }] },
      });
      const right = await call(server.url, 'POST', '/verify', body('\\boxed{8}'));
      expect(right.text).toContain('"reward":1.0');
      expect(right.text).toContain('"library_reward":1.0');
      expect(right.json).toMatchObject({ reward: 1, extracted_answer: '8' });
      const wrong = await call(server.url, 'POST', '/verify', body('\\boxed{9}'));
      expect(wrong.text).toContain('"reward":0.0');
      expect(wrong.text).toContain('"library_reward":0.0');
    } finally {
      await server.close();
    }
  });
});
