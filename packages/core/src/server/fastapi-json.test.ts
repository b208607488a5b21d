import { describe, expect, it } from 'vitest';
import { fastApiJson, pythonFloat } from './fastapi-json.ts';

describe('fastApiJson', () => {
  it("writes floats as Python's repr does", () => {
    // What python3 -c 'print(repr(x))' prints for each.
    const cases: Array<[number, string]> = [
      [1, '1.0'],
      [0, '0.0'],
      [-0, '-0.0'],
      [-3, '-3.0'],
      [0.1, '0.1'],
      [0.0001, '0.0001'],
      [0.00001, '1e-05'],
      [-0.000012345, '-1.2345e-05'],
      [1.5e-7, '1.5e-07'],
      [123456789012345.6, '123456789012345.6'],
      [1e16, '1e+16'],
      [1.5e16, '1.5e+16'],
      [9999999999999998, '9999999999999998.0'],
      [0.447213595499958, '0.447213595499958'],
      [1756093415, '1756093415.0'],
      [2.5e300, '2.5e+300'],
    ];
    for (const [value, python] of cases) expect(pythonFloat(value)).toBe(python);
  });

  it('marks the fields named as floats, in objects, lists and by key prefix', () => {
    const value = {
      reward: 1,
      count: 3,
      logprobs: [0, -0.5, -0.00001],
      nested: [{ score: 2, n: 2 }],
      metrics: { 'mean/reward': 1, 'num/rollouts': 4, per: { a: [80, 0] } },
      text: 'reward 1',
    };
    const spec = { reward: true, logprobs: true, nested: { score: true }, metrics: { 'mean/*': true, per: true } } as const;
    expect(fastApiJson(value, spec)).toBe(
      '{"reward":1.0,"count":3,"logprobs":[0.0,-0.5,-1e-05],"nested":[{"score":2.0,"n":2}],"metrics":{"mean/reward":1.0,"num/rollouts":4,"per":{"a":[80.0,0.0]}},"text":"reward 1"}',
    );
    // Without a spec: ints stay ints, fractions are Python's, the rest is JSON.stringify's.
    expect(fastApiJson({ a: 1, b: 0.00002, c: 'é', d: [null, true] })).toBe('{"a":1,"b":2e-05,"c":"é","d":[null,true]}');
    expect(fastApiJson({ a: Number.NaN, b: undefined })).toBe('{"a":null}');
  });
});
