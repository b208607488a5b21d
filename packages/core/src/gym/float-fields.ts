import type { FloatFields } from '../server/fastapi-json.ts';

// The fields NeMo Gym's pydantic models declare `float`, so that the faces standing in for its
// servers write them as Python does (1.0, not 1): see server/fastapi-json.ts. From NeMo Gym's
// nemo_gym/openai_utils.py (NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming, the
// token-id mixin), nemo_gym/base_resources_server.py (BaseVerifyResponse) and the
// RewardProfiler's pandas statistics (nemo_gym/reward_profile.py).

/** NeMoGymResponseCreateParamsNonStreaming: the sampling floats. */
const RESPONSE_CREATE_PARAMS: FloatFields = { temperature: true, top_p: true };

/** NeMoGymResponse: its timestamp, sampling, and the output items' log probabilities. */
const RESPONSE: FloatFields = {
  created_at: true,
  temperature: true,
  top_p: true,
  output: { generation_log_probs: true, content: { logprobs: { logprob: true, top_logprobs: { logprob: true } } } },
};

/**
 * A verify response (BaseVerifyResponse and an environment's subclass): `reward` and
 * `reward_components` are floats, the echoed request and response as their models type them, plus
 * the environment's own float fields (Environment.floatFields).
 */
export function verifyResponseFloats(environmentFloats: readonly string[] = []): FloatFields {
  return {
    responses_create_params: RESPONSE_CREATE_PARAMS,
    response: RESPONSE,
    reward: true,
    reward_components: true,
    ...Object.fromEntries(environmentFloats.map((key) => [key, true as const])),
  };
}

/** Statistics are pandas floats (`mean/reward`: 1.0), pass@k and majority@k percentages too. */
const METRICS: { readonly [key: string]: FloatFields } = { '*/*': true, per_sample_aggregate: true, reward_profile_completion_pct: true };

/**
 * `/aggregate_metrics`: every statistic is a float; counts and indices are ints; a group's
 * `rollout_infos` keep each verify response's own types (`reward` and the environment's floats).
 */
export function aggregateMetricsFloats(environmentFloats: readonly string[] = []): FloatFields {
  return {
    agent_metrics: METRICS,
    key_metrics: METRICS,
    group_level_metrics: {
      ...METRICS,
      rollout_infos: { reward: true, ...Object.fromEntries(environmentFloats.map((key) => [key, true as const])) },
    },
  };
}
