import { join } from 'node:path';
import { deflateSync } from 'node:zlib';
import { outputText, type NeMoGymResponse } from '@rollserve/core';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import code, { CodeConfig, extractCode, type CodeResources } from '@rollserve/env-code';
import {
  call,
  describeContract,
  makeResponse,
  referenceCases,
  unhashReference,
  workspaceRoot,
  type VerifyCase,
} from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePythonTyped, pythonReferenceTyped, type PyNumber } from './python-json.ts';

const EXTRAS = [
  'extracted_model_output',
  'extracted_model_code',
  'result',
  'metadata',
  'unit_tests_time_taken',
  'reasoning_format_violation_rate',
  'difficulty',
];

const cases = referenceCases('code_gen');

// python_reference.json hashes long strings, also inside `metadata`; time-taken values vary by run.
const verifyCases: VerifyCase[] = cases.map(({ row, recorded, reference: ref }) => {
  const text = outputText(recorded.response as NeMoGymResponse);
  const { metadata, unit_tests_time_taken: _time, ...rest } = ref.extras as Record<string, unknown>;
  const tests = (row.verifier_metadata as { unit_tests: { inputs: string[] } }).unit_tests;
  const expectedMetadata = metadata as Record<string, unknown>;
  return {
    name: `code_gen rollout ${ref.recorded_rollout_index}`,
    request: { ...row, response: recorded.response },
    expectedReward: ref.reward,
    expectedExtras: {
      ...unhashReference(rest, [text, extractCode(text)]),
      ...('execution time' in expectedMetadata ? {} : { metadata: unhashReference(expectedMetadata, tests.inputs) }),
    },
  };
});

// the environment's own setup and close, as a server runs them
let resources: CodeResources;
beforeAll(async () => {
  resources = await code.setup!(CodeConfig.parse({}));
});
afterAll(() => code.close!(resources));

describe('code_gen reference: time-taken fields', () => {
  it('are numbers in a sane range where Python gives numbers', async () => {
    for (const { row, recorded, reference } of cases) {
      const answer = await code.verify(row as never, recorded.response as NeMoGymResponse, {
        config: CodeConfig.parse({}),
        signal: new AbortController().signal,
        resources,
      } as never);
      const time = answer.unit_tests_time_taken as number;
      expect(time).toBeGreaterThan(0);
      expect(time).toBeLessThan(30);
      const metadata = answer.metadata as Record<string, unknown>;
      expect(Object.keys(metadata).sort()).toEqual(Object.keys(reference.extras.metadata as object).sort());
      if ('execution time' in metadata) expect(typeof metadata['execution time']).toBe('number');
    }
  }, 60_000);
});

describe('code: corrupt unit tests', () => {
  it('answers FastAPI 422s at the tests, never a 500; a blank answer still gets reward 0 first', async () => {
    const app = createResourcesServer(code);
    const running = await serveFetch(app);
    try {
      const answer = (text: string) =>
        makeResponse([{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] }]);
      const verify = (unitTests: unknown, text = '```python\nprint(3)\n```') =>
        call(running.url, 'POST', '/verify', { responses_create_params: { input: 'sum' }, response: answer(text), verifier_metadata: { unit_tests: unitTests } });
      const notZlib = await verify({ packed: 'bm90IHpsaWI=' });
      expect(notZlib.status).toBe(422);
      expect(notZlib.json).toEqual({
        detail: [{
          type: 'value_error',
          loc: ['body', 'verifier_metadata', 'unit_tests', 'packed'],
          msg: 'Value error, not base64(zlib(JSON)): incorrect header check',
          input: 'bm90IHpsaWI=',
          ctx: { error: {} },
        }],
      });
      const notTests = await verify({ packed: deflateSync(JSON.stringify({ inputs: 'x' })).toString('base64') });
      expect(notTests.status).toBe(422);
      expect((notTests.json as { detail: Array<{ msg: string }> }).detail[0]!.msg).toMatch(/^Value error, the unpacked tests are not/);
      const notJson = await verify({ packed: deflateSync('{oops').toString('base64') });
      expect(notJson.status).toBe(422);
      const wrongShape = await verify({ inputs: 'x', outputs: [1] });
      expect(wrongShape.status).toBe(422);
      expect((wrongShape.json as { detail: Array<{ loc: unknown[] }> }).detail[0]!.loc).toEqual(['body', 'verifier_metadata', 'unit_tests']);
      // code_gen checks for a blank answer before it reads the tests.
      const blank = await verify({ packed: 'bm90IHpsaWI=' }, '  ');
      expect(blank.status).toBe(200);
      expect((blank.json as { reward: number }).reward).toBe(0);
    } finally {
      await running.close();
      await app.close();
    }
  });
});

describe("code: code_gen's JSON types on /verify", () => {
  it('writes reward, reasoning_format_violation_rate and unit_tests_time_taken as floats, result as ints', async () => {
    const app = createResourcesServer(code);
    const running = await serveFetch(app);
    try {
      const reference = pythonReferenceTyped('code_gen').rows;
      for (const { row, recorded, reference: ref } of cases) {
        const verified = await call(running.url, 'POST', '/verify', { ...row, response: recorded.response });
        expect(verified.status).toBe(200);
        const ours = parsePythonTyped(verified.text) as Record<string, any>;
        const theirs = reference.find((r) => r.recorded_rollout_index.value === ref.recorded_rollout_index)!;
        expect(ours.reward).toEqual(theirs.reward); // 0.0 or 1.0
        expect(ours.reasoning_format_violation_rate).toEqual(theirs.extras.reasoning_format_violation_rate); // 0.0
        expect(ours.unit_tests_time_taken.py).toBe('float');
        expect(ours.result).toEqual(theirs.extras.result); // ints (-2), as code_gen's List[int] prints
        expect(verified.text).toContain('"reasoning_format_violation_rate":0.0');
      }
      const metrics = await call(running.url, 'POST', '/aggregate_metrics', {
        verify_responses: cases.map(({ reference: ref }, i) => ({ _ng_task_index: i, _ng_rollout_index: 0, reward: ref.reward, ...ref.extras })),
      });
      const typed = parsePythonTyped(metrics.text) as { agent_metrics: Record<string, PyNumber> };
      expect(typed.agent_metrics['mean/reasoning_format_violation_rate']).toMatchObject({ py: 'float', raw: '0.0' });
      expect(typed.agent_metrics['max/reward']).toMatchObject({ py: 'float', raw: '1.0' });
    } finally {
      await running.close();
      await app.close();
    }
  }, 60_000);
});

describeContract({
  env: code,
  extraKeys: EXTRAS,
  sampleRow: {
    verifier_metadata: { unit_tests: { inputs: ['1 2\n'], outputs: ['3\n'], fn_name: null } },
    responses_create_params: { input: [{ role: 'user', content: 'Read two integers and print their sum.' }] },
  },
  verifyCases,
  packageDir: join(workspaceRoot(), 'environments', 'code'),
});
