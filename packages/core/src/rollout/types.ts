import { z } from 'zod';

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

export const PolicySpec = z.object({
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

export const RolloutLimits = z.object({
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

export const TurnRewardWeights = z.object({
  /** Reward for a well-formed turn (known tools, valid arguments). */
  format: z.number().default(0),
  /** Reward per turn for the share of its tool calls that succeeded. */
  tool: z.number().default(0),
  /** Weight of the verify reward, given on the last turn. */
  outcome: z.number().default(1),
});

/** One task: a dataset row, its environment, the policy, and how many samples (a GRPO group). */
export const RolloutTask = z.object({
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
  /** Discount of per-turn returns. */
  gamma: z.number().min(0).max(1).default(1),
  turn_rewards: TurnRewardWeights.default(TurnRewardWeights.parse({})),
  /** Opaque; returned with every result. */
  metadata: z.record(z.string(), z.unknown()).optional(),
});

export const SubmitRequest = z.union([z.object({ tasks: z.array(RolloutTask).min(1).max(10_000) }), RolloutTask]);

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
  status: ToolCallStatus,
  durationMs: z.number(),
});
export type ToolCallRecord = z.infer<typeof ToolCallRecord>;

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
  /** Per-turn reward components: format, tool success, and the outcome on the last turn. */
  rewards: z.object({ format: z.number(), tool: z.number(), outcome: z.number() }),
  /** The weighted sum of the components (weights: the task's `turn_rewards`). */
  reward: z.number(),
  /** Discounted return from this turn on: reward + gamma * next return. */
  return: z.number(),
  /** The return normalised over the task's group (n > 1), else null. */
  normalizedReturn: z.number().nullable(),
});
export type TurnRecord = z.infer<typeof TurnRecord>;

export const StageTiming = z.object({ queuedMs: z.number(), activeMs: z.number() });
export type StageTiming = z.infer<typeof StageTiming>;

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
