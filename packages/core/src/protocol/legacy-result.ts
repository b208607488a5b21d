import { CreditRecord, RolloutResult, ToolCallRecord, TurnRecord, TurnRewards } from './rollout.ts';

// Until issue 24 a result was camelCase inside (`taskId`, `toolCalls`, `execution.exitCode`, …)
// and renamed to the API's snake_case on the way out. Databases written then hold results in that
// form (bodies without the `$tokens` key, or `$tokens: 1`), an older node commits them so, and an
// older service reads only that form. These functions turn a result from that form into today's
// and back. Only rollserve's own keys change: user data (verify extras, response, messages,
// metadata, the credit components' params) keeps its keys. Keys rollserve does not know are
// dropped, as the old API's renaming and a zod object's parse both dropped them.

type Direction = 'snake' | 'camel';

const snakeToCamel = (key: string) => key.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

const isObject = (value: unknown): value is Record<string, unknown> => typeof value === 'object' && value !== null && !Array.isArray(value);

type Convert = (value: unknown, direction: Direction) => unknown;

/**
 * An object with today's keys `keys` (in that order), from either form; `inner` converts the
 * values under some of them. Anything not an object is left as it is (the schema judges it).
 */
function known(keys: readonly string[], inner: Record<string, Convert> = {}): Convert {
  return (value, direction) => {
    if (!isObject(value)) return value;
    const out: Record<string, unknown> = {};
    for (const key of keys) {
      const camel = snakeToCamel(key);
      const from = key in value ? key : camel in value ? camel : undefined;
      if (from === undefined) continue;
      const convert = inner[key];
      out[direction === 'snake' ? key : camel] = convert ? convert(value[from], direction) : value[from];
    }
    return out;
  };
}

const each = (convert: Convert): Convert => (value, direction) => (Array.isArray(value) ? value.map((item) => convert(item, direction)) : value);
const eachValue = (convert: Convert): Convert => (value, direction) =>
  isObject(value) ? Object.fromEntries(Object.entries(value).map(([key, item]) => [key, convert(item, direction)])) : value;

const keysOf = (schema: { shape: object }) => Object.keys(schema.shape);
const R = RolloutResult.shape;
const C = CreditRecord.shape;

const stage = known(keysOf(R.timing.shape.init));
const toolCall = known(keysOf(ToolCallRecord), { execution: known(keysOf(ToolCallRecord.shape.execution.unwrap())) });
const turn = known(keysOf(TurnRecord), { tool_calls: each(toolCall), rewards: known(keysOf(TurnRewards)) });
const credit = known(keysOf(CreditRecord), {
  components: eachValue(known(keysOf(C.components.valueType))),
  shaping: known(keysOf(C.shaping.unwrap())),
  stats: each(known(keysOf(C.stats.unwrap().element))),
});
const result = known(keysOf(RolloutResult), {
  error: known(keysOf(R.error.unwrap())),
  credit,
  timing: known(keysOf(R.timing), { init: stage, run: stage, eval: stage }),
  turns: each(turn),
});

/** Whether a result (whole, not encoded) is in the camelCase form of rollserve before issue 24. */
export const isLegacyResult = (value: unknown): boolean => isObject(value) && !('task_id' in value) && 'taskId' in value;

/**
 * A result in today's form from either form (freshly parsed, its arrays are shared): camelCase keys
 * renamed, keys rollserve does not know dropped, the rest in the order the API sends them.
 */
export const toCurrentResult = (value: unknown): RolloutResult => withWeightFields(result(value, 'snake') as RolloutResult);

/**
 * A result from before weight versions (issue 25) with their fields: null versions on each turn
 * and the result, not stale. A result that has them is given back as it is; one without has its
 * keys rebuilt in the schema's order (the order the API sends them in).
 */
export function withWeightFields(value: RolloutResult): RolloutResult {
  if (!isObject(value)) return value;
  const turns = Array.isArray(value.turns) ? value.turns : undefined;
  const turnsWhole = turns === undefined || turns.every((turn) => !isObject(turn) || 'weight_version' in turn);
  if ('stale' in value && 'weight_version_min' in value && 'weight_version_max' in value && turnsWhole) return value;
  const out: Record<string, unknown> = {};
  const given = value as unknown as Record<string, unknown>;
  for (const key of RESULT_KEYS) {
    if (key in given) out[key] = key === 'turns' && !turnsWhole ? turns!.map(withTurnVersion) : given[key];
    else if (key === 'weight_version_min' || key === 'weight_version_max') out[key] = null;
    else if (key === 'stale') out[key] = false;
  }
  return out as unknown as RolloutResult;
}

const RESULT_KEYS = keysOf(RolloutResult);
const TURN_KEYS = keysOf(TurnRecord);

function withTurnVersion(turn: unknown): unknown {
  if (!isObject(turn) || 'weight_version' in turn) return turn;
  const out: Record<string, unknown> = {};
  for (const key of TURN_KEYS) {
    if (key in turn) out[key] = turn[key];
    else if (key === 'weight_version') out[key] = null;
  }
  return out;
}

/** A result in the camelCase form, for a service from before issue 24. */
export function toLegacyResult(current: RolloutResult): Record<string, unknown> {
  // weight versions came after that form: a service that reads it knows none of them
  const { weightVersionMin: _min, weightVersionMax: _max, stale: _stale, ...legacy } = result(current, 'camel') as Record<string, unknown>;
  if (Array.isArray(legacy.turns)) legacy.turns = legacy.turns.map((turn: unknown) => {
    if (!isObject(turn)) return turn;
    const { weightVersion: _version, ...rest } = turn;
    return rest;
  });
  return legacy;
}
