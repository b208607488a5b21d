import { z } from 'zod';
import { TURN_REWARD_COMPONENTS, TURN_REWARD_NAMES, type TurnRewardName } from './rewards/components.ts';

/** Sampling parameters passed through to the policy's chat completions (vLLM names). */
export const SamplingParams = z.looseObject({
  temperature: z.number().min(0).optional(),
  top_p: z.number().gt(0).max(1).optional(),
  top_k: z.number().int().optional(),
  max_tokens: z.number().int().positive().optional(),
  stop: z.union([z.string(), z.array(z.string())]).optional(),
  seed: z.number().int().optional(),
  repetition_penalty: z.number().positive().optional(),
});

export const PolicySpec = z.strictObject({
  /** The served model name. */
  model: z.string().min(1),
  /**
   * An OpenAI-compatible base URL (`http://host:port/v1`). Omitted: the service's LLM backends
   * (`POST /v1/llm-backends`).
   */
  base_url: z.url().optional(),
  api_key: z.string().optional(),
  sampling: SamplingParams.default({}),
});

export const RolloutLimits = z.strictObject({
  /** Stage time a sample may take (INIT + RUN + EVAL; queue time excluded). */
  time_limit_s: z.number().positive().max(86_400).default(600),
  /** Model calls per sample. */
  max_turns: z.number().int().positive().max(1_000).default(16),
  /** Per tool call. */
  tool_timeout_s: z.number().positive().max(3_600).default(60),
  /**
   * Limits of the rollout's sandbox, over the environment's (`sandbox.resources`); see
   * SandboxResources. Going past one ends the rollout with `error.code: RESOURCE_LIMIT`.
   */
  sandbox: z
    .strictObject({
      /** Memory of the sandbox as a whole (cgroup), MiB. */
      total_memory_mib: z.number().int().positive().optional(),
      /** Address space per process, MiB. */
      memory_mib: z.number().int().positive().optional(),
      /** Processes and threads. */
      max_processes: z.number().int().positive().optional(),
      /** Workspace size, MiB. */
      workspace_mib: z.number().int().positive().optional(),
      /** `/tmp` size, MiB. */
      tmp_mib: z.number().int().positive().optional(),
      /** Files and directories in the workspace and /tmp. */
      max_inodes: z.number().int().positive().optional(),
      /** Largest file, MiB. */
      max_file_size_mib: z.number().int().positive().optional(),
      /** Room for command output, MiB. */
      output_mib: z.number().int().positive().optional(),
      /** CPU seconds per process. */
      cpu_seconds: z.number().int().positive().optional(),
    })
    .optional(),
});

/** Legacy per-turn weights (`turn_rewards`); see `credit` and `resolveCredit` for the mapping. */
export const TurnRewardWeights = z.strictObject({
  /** Reward for a well-formed turn (known tools, valid arguments). */
  format: z.number().default(0),
  /** Reward per turn for the share of its tool calls that succeeded. */
  tool: z.number().default(0),
  /** Weight of the verify reward, given on the last turn. */
  outcome: z.number().default(1),
});

/**
 * How a trajectory's code is compared to the successful ones of its group: 'lexical' (cosine of
 * token 1- and 2-gram counts, deterministic, no model) or an OpenAI-compatible `/v1/embeddings`
 * endpoint (vLLM serving an embedding model): cosine of the embeddings.
 */
export const SimilaritySpec = z.union([
  z.literal('lexical'),
  z.strictObject({
    /** The OpenAI base URL, e.g. `http://host:8000/v1`; the service POSTs to `<url>/embeddings`. */
    url: z.url(),
    /** The embedding model's served name. */
    model: z.string().min(1),
    api_key: z.string().optional(),
    /** Time limit of the embeddings call. */
    timeout_s: z.number().positive().max(600).default(30),
  }),
]);

/** GTPO's self-supervised reward shaping, computed once a task's group is complete. */
export const ShapingConfig = z.strictObject({
  /** Scale of the shaping reward; 0 turns shaping off. */
  alpha: z.number().min(0).default(0.5),
  similarity: SimilaritySpec.default('lexical'),
  /** A trajectory succeeded when its verify reward is at least this. */
  success_threshold: z.number().default(1),
});

const weightShape = Object.fromEntries(TURN_REWARD_NAMES.map((name) => [name, z.number().default(TURN_REWARD_COMPONENTS[name].defaultWeight)])) as Record<
  TurnRewardName,
  z.ZodDefault<z.ZodNumber>
>;

/** Weights of the per-turn reward components (one per component of TURN_REWARD_COMPONENTS). */
export const CreditWeights = z.strictObject(weightShape);

/**
 * Turn-level credit (GTPO): per-turn rewards, discounted returns, advantages and shaping. See the
 * README, "Turn-level credit", for the formulas.
 */
export const CreditConfig = z.strictObject({
  /** Discount of per-turn returns: G_t = Σ_k γ^k r_{t+k}. */
  gamma: z.number().min(0).max(1).default(0.9),
  /** The format component of a malformed turn is -format_penalty. */
  format_penalty: z.number().min(0).default(0.1),
  /** The format component of a well-formed turn (0 in GTPO; the legacy `turn_rewards.format`). */
  format_bonus: z.number().default(0),
  /** Advantages: returns normalised over every turn of the group ('group') or per turn index ('turn'). */
  normalize: z.enum(['group', 'turn']).default('group'),
  weights: CreditWeights.default(CreditWeights.parse({})),
  shaping: ShapingConfig.default(ShapingConfig.parse({})),
});
export type CreditSettings = z.output<typeof CreditConfig>;

/** One task: a dataset row, its environment, the policy, and how many samples (a GRPO group). */
export const RolloutTask = z.strictObject({
  /** Caller-chosen id; resubmitting a known id returns what it has (idempotent). */
  id: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/, 'ids are 1-128 of [A-Za-z0-9._:-], starting alphanumeric').optional(),
  /** Environment name (`rollserve list`). */
  env: z.string().min(1),
  /** The dataset row in NeMo Gym form: `responses_create_params` plus the task's fields. */
  row: z.looseObject({ responses_create_params: z.looseObject({ input: z.union([z.string(), z.array(z.unknown())]) }) }),
  policy: PolicySpec,
  /** Samples of this task. */
  n: z.number().int().positive().max(256).default(1),
  limits: RolloutLimits.default(RolloutLimits.parse({})),
  /** Turn-level credit (GTPO); omitted: the defaults, or the legacy `gamma`/`turn_rewards` when given. */
  credit: CreditConfig.optional(),
  /** Legacy: discount of per-turn returns (`credit.gamma`); used only without `credit`. */
  gamma: z.number().min(0).max(1).optional(),
  /** Legacy per-turn weights; used only without `credit` (see resolveCredit). */
  turn_rewards: TurnRewardWeights.optional(),
  /** Opaque; returned with every result. */
  metadata: z.record(z.string(), z.unknown()).optional(),
});

/** A batch of tasks. Unknown fields here and in a task are errors that name them (a typo is not a default). */
export const SubmitBatch = z.strictObject({ tasks: z.array(RolloutTask).min(1).max(10_000) });
export const SubmitRequest = z.union([SubmitBatch, RolloutTask]);

export type RolloutTaskInput = z.input<typeof RolloutTask>;
export type RolloutTask = z.output<typeof RolloutTask>;

export const RolloutState = z.enum(['queued', 'init', 'run', 'eval', 'done', 'failed', 'cancelled']);
export type RolloutState = z.infer<typeof RolloutState>;

export const CriticalError = z.enum(['init', 'run', 'eval', 'timeout', 'cancelled']).nullable();
export type CriticalError = z.infer<typeof CriticalError>;

export const ToolCallStatus = z.enum(['ok', 'error', 'invalid_arguments', 'unknown_tool', 'timeout']);
export type ToolCallStatus = z.infer<typeof ToolCallStatus>;

export const ToolCallRecord = z.object({
  id: z.string(),
  name: z.string(),
  /** The arguments exactly as the model wrote them. */
  arguments: z.string(),
  /** What the model read back. */
  output: z.string(),
  /** Derived from `execution` for calls that ran: timeout, error (exception or non-zero exit code) or ok. */
  status: ToolCallStatus,
  /** How the call went, as the tool reports it; null when it did not run (unknown tool, bad arguments). */
  execution: z.object({ exitCode: z.number().int().nullable(), timedOut: z.boolean(), exception: z.string().nullable() }).nullable(),
  /** The code the call executed (a bash command, Python code), null when none. */
  code: z.string().nullable(),
  durationMs: z.number(),
});
export type ToolCallRecord = z.infer<typeof ToolCallRecord>;

export const TurnStatus = z.enum(['ok', 'error', 'timeout', 'malformed', 'none']);
export type TurnStatus = z.infer<typeof TurnStatus>;

export const TurnRewards = z.object(
  Object.fromEntries(TURN_REWARD_NAMES.map((name) => [name, z.number().nullable()])) as Record<TurnRewardName, z.ZodNullable<z.ZodNumber>>,
);
export type TurnRewards = z.infer<typeof TurnRewards>;

/** One model call and what followed it: what a turn-level (GTPO-style) trainer needs. */
export const TurnRecord = z.object({
  index: z.number().int(),
  promptTokenIds: z.array(z.number().int()).nullable(),
  generationTokenIds: z.array(z.number().int()).nullable(),
  generationLogprobs: z.array(z.number()).nullable(),
  finishReason: z.string().nullable(),
  text: z.string().nullable(),
  reasoning: z.string().nullable(),
  toolCalls: z.array(ToolCallRecord),
  llmLatencyMs: z.number(),
  backend: z.string().nullable(),
  /** The code the turn executed: its tool calls' code joined by newlines, null with none. */
  code: z.string().nullable(),
  /**
   * How the turn went: 'malformed' (see `malformed`), 'timeout' or 'error' when a call timed out or
   * failed, 'ok' when every call ran cleanly, 'none' for a turn without tool calls (an answer).
   */
  status: TurnStatus,
  /** Why the turn is malformed (the format component's reason), null when it is not. */
  malformed: z.string().nullable(),
  /**
   * Per-turn reward components (TURN_REWARD_COMPONENTS; their parameters in the result's
   * `credit.components`). null: not known (shaping before the group is complete or when it failed).
   */
  rewards: TurnRewards,
  /** Σ weight · component over the known components (weights: `credit.weights`). */
  reward: z.number(),
  /** Discounted return from this turn on: G_t = reward_t + γ · G_{t+1}. */
  return: z.number(),
  /** The turn's advantage: its return normalised over the group ('group' or per turn index); null for n = 1, filtered samples, or when shaping failed. */
  normalizedReturn: z.number().nullable(),
});
export type TurnRecord = z.infer<typeof TurnRecord>;

export const StageTiming = z.object({ queuedMs: z.number(), activeMs: z.number() });
export type StageTiming = z.infer<typeof StageTiming>;

/** A result's turn-level credit: the settings, each component's weight and parameters, shaping, group statistics. */
export const CreditRecord = z.object({
  gamma: z.number(),
  normalize: z.enum(['group', 'turn']),
  components: z.record(z.string(), z.object({ weight: z.number(), params: z.record(z.string(), z.unknown()) })),
  /** This trajectory's shaping once its group is complete; null before, or when it failed (see `error`). */
  shaping: z
    .object({
      /** α × similarity for a failed trajectory in a group with a success, else 0. */
      value: z.number(),
      /** Mean cosine similarity of its code to each successful trajectory's; null when not computed (success, no success in the group, filtered). */
      similarity: z.number().nullable(),
      /** Successful trajectories in the group. */
      successes: z.number().int(),
    })
    .nullable(),
  /** The statistics advantages used (group: one entry; turn: one per turn index); null until the group is complete. */
  stats: z.array(z.object({ turn: z.number().int().nullable(), count: z.number().int(), mean: z.number(), std: z.number() })).nullable(),
  /** Why group credit is missing (e.g. the embeddings endpoint was down): advantages are then null. */
  error: z.string().nullable(),
});
export type CreditRecord = z.infer<typeof CreditRecord>;

/** One sample's result. */
export const RolloutResult = z.object({
  id: z.string(),
  taskId: z.string(),
  sampleIndex: z.number().int(),
  env: z.string(),
  state: RolloutState,
  reward: z.number(),
  /** Named reward components when the environment reports them (`reward_components`). */
  rewardComponents: z.record(z.string(), z.number()).nullable(),
  /** The environment's verify extras, with NeMo Gym's key names. */
  verifyExtras: z.record(z.string(), z.unknown()),
  criticalError: CriticalError,
  /** True for infrastructure failures: do not train on this sample as reward 0. */
  filter: z.boolean(),
  error: z.object({ code: z.string(), message: z.string() }).nullable(),
  /** Group-normalised outcome advantage (n > 1), else null. */
  advantage: z.number().nullable(),
  /** How the turns' rewards, returns and advantages were computed; null in results from before it. */
  credit: CreditRecord.nullable(),
  timing: z.object({ init: StageTiming, run: StageTiming, eval: StageTiming, totalMs: z.number() }),
  /** The NeMo Gym-shaped Responses API response (token ids on each model call's last item). */
  response: z.record(z.string(), z.unknown()).nullable(),
  /** The chat messages as the policy saw them, final assistant turn included. */
  messages: z.array(z.record(z.string(), z.unknown())),
  turns: z.array(TurnRecord),
  metadata: z.record(z.string(), z.unknown()).optional(),
  finishedAt: z.string(),
});
export type RolloutResult = z.infer<typeof RolloutResult>;

/** A rollout as GET /v1/rollouts/:id shows it. */
export const RolloutView = z.object({
  id: z.string(),
  taskId: z.string(),
  sampleIndex: z.number().int(),
  env: z.string(),
  /** The stage the rollout is in (waiting for a slot counts), or how it ended. */
  state: RolloutState,
  /** Whether it holds a slot of its stage now. */
  active: z.boolean(),
  result: RolloutResult.nullable(),
});
export type RolloutView = z.infer<typeof RolloutView>;
