// Rewards against what NeMo Gym's math_with_judge (Math-Verify 0.8.0) answered for the same
// /verify bodies (../shared/fixtures/math-oracle/dev.jsonl, both configs).

import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { nemoGymFixturesDir, readJsonl } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MathConfig, mathEnvironment, type MathResources } from './environment.ts';

interface OracleCase {
  config: Record<string, unknown>;
  style: string;
  expected_answer: string;
  oracle: { reward: number; extracted_answer: string | null; library_reward: number };
  body: Record<string, unknown> & { response: never };
}

// Floors at what is met today (the issue asks for 99 % rewards and 97 % extracted_answer): rewards
// 99.6 % and 99.0 %, extracted_answer 99.6 % and 99.2 %.
const REWARD_FLOOR: Record<string, number> = { '{}': 0.996, '{"format_tolerant_answer_extraction":true}': 0.99 };
const EXTRACTED_FLOOR: Record<string, number> = { '{}': 0.996, '{"format_tolerant_answer_extraction":true}': 0.992 };

const file = resolve(nemoGymFixturesDir(), '..', 'math-oracle', 'dev.jsonl');

describe.skipIf(!existsSync(file))('math_with_judge oracle (dev.jsonl)', () => {
  let resources: MathResources;
  beforeAll(async () => {
    resources = await mathEnvironment.setup!(MathConfig.parse({}));
  });
  afterAll(() => mathEnvironment.close!(resources));

  it('agrees with math_with_judge, and never gives a wrong 1', async () => {
    const cases = readJsonl<OracleCase>(file);
    const stats = new Map<string, { n: number; reward: number; extracted: number; library: number; deliberate: number; oracleFailed: number }>();
    const wrongOnes: string[] = [];
    for (const c of cases) {
      const key = JSON.stringify(c.config);
      const s = stats.get(key) ?? { n: 0, reward: 0, extracted: 0, library: 0, deliberate: 0, oracleFailed: 0 };
      stats.set(key, s);
      const verify = async (mode: 'strict' | 'corrected') =>
        (await mathEnvironment.verify(c.body as never, c.body.response, { config: MathConfig.parse({ ...c.config, math_verify_mode: mode }), resources } as never)) as {
          reward: number;
          extracted_answer: string | null;
          library_reward: number;
        };
      const strict = await verify('strict');
      const corrected = await verify('corrected');
      s.n++;
      if (strict.reward === c.oracle.reward) s.reward++;
      if (strict.extracted_answer === c.oracle.extracted_answer) s.extracted++;
      if (strict.library_reward === c.oracle.library_reward) s.library++;
      if (corrected.reward !== strict.reward) s.deliberate++;
      // math_with_judge answers 0 with no extracted answer when Math-Verify failed (a time-out or
      // an exception in its child process): not a verdict on the answer.
      const oracleFailed = c.oracle.reward === 0 && c.oracle.extracted_answer === null;
      if (oracleFailed && corrected.reward === 1) s.oracleFailed++;
      if (corrected.reward === 1 && c.oracle.reward === 0 && !oracleFailed) wrongOnes.push(`${key} ${c.expected_answer} → ${corrected.extracted_answer}`);
    }
    for (const [key, s] of stats) {
      console.log(
        `math oracle ${key}: n=${s.n} reward ${((100 * s.reward) / s.n).toFixed(1)} % extracted_answer ${((100 * s.extracted) / s.n).toFixed(1)} % ` +
          `library_reward ${((100 * s.library) / s.n).toFixed(1)} % ` +
          `deliberate differences ${s.deliberate}, 1 where math_with_judge failed ${s.oracleFailed}`,
      );
      expect(s.reward / s.n).toBeGreaterThanOrEqual(REWARD_FLOOR[key] ?? 0.99);
      expect(s.extracted / s.n).toBeGreaterThanOrEqual(EXTRACTED_FLOOR[key] ?? 0.97);
      expect(s.library / s.n).toBeGreaterThanOrEqual(REWARD_FLOOR[key] ?? 0.99);
    }
    expect(wrongOnes).toEqual([]);
  });
});
