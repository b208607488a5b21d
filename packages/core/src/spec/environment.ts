import type { z } from 'zod';
import type { NeMoGymResponse } from '../protocol/responses.ts';
import type { SandboxProvider, SandboxResources, SandboxSpec } from '../sandbox/types.ts';
import type { EnvironmentContext } from './context.ts';
import type { ToolDefinition } from './tool.ts';

// In context.ts because tool.ts needs them too; re-exported for the files that import them from here.
export type { EnvironmentContext, Session } from './context.ts';

/** NeMo Gym's closed set of resources-server domains (CONTRACT.md §4.1). */
export type NemoGymDomain =
  | 'math'
  | 'coding'
  | 'agent'
  | 'knowledge'
  | 'instruction_following'
  | 'long_context'
  | 'safety'
  | 'games'
  | 'translation'
  | 'e2e'
  | 'rlhf'
  | 'other';

export type ReverifyMode = 'stateless' | 'unsupported' | 'unknown';

/** What `verify` returns: a reward and the environment's extras, with NeMo Gym's key names. */
export type VerifyResult = { reward: number } & Record<string, unknown>;

/**
 * One verify response as `/aggregate_metrics` receives it: the row's fields, the extras and
 * `reward`, with `response` reduced to its `usage`.
 */
export type VerifyEntry = Record<string, unknown> & {
  reward?: number;
  _ng_task_index?: number;
  _ng_rollout_index?: number;
};

/** The environment's share of `/aggregate_metrics` (NeMo Gym's `compute_metrics`). */
export type EnvironmentMetrics = Record<string, unknown> & {
  /** One entry per task, merged into that task's group-level metrics. */
  per_task_metrics?: Array<Record<string, unknown>>;
};

/**
 * An environment: what a task looks like, the tools the agent may call, how a rollout starts and
 * how it is scored. One definition serves both faces: the NeMo Gym resources server and the
 * rollout service.
 *
 * @example
 * export default defineEnvironment({
 *   name: 'math',
 *   domain: 'math',
 *   row: z.object({ question: z.string(), expected_answer: z.string() }),
 *   async verify(row, response) {
 *     const answer = extract(outputText(response));
 *     return { reward: answer === row.expected_answer ? 1 : 0, extracted_answer: answer };
 *   },
 * });
 */
export interface EnvironmentDefinition<
  Row extends z.ZodType = z.ZodType,
  Config extends z.ZodType = z.ZodType,
  SeedRow extends z.ZodType = z.ZodType,
  Resources = undefined,
> {
  /**
   * The environment's name: the package is `@rollserve/env-<name>` and `rollserve serve <name>`
   * starts it.
   * @example 'math'
   */
  name: string;

  /**
   * NeMo Gym domain of the resources server.
   * @example 'math'
   */
  domain: NemoGymDomain;

  /**
   * One line for `rollserve list` and the NeMo Gym config's `description`.
   * @example 'Math answers checked symbolically (drop-in for math_with_judge)'
   */
  description?: string;

  /**
   * zod schema of the dataset-row fields this environment reads. Unknown keys are allowed and
   * ignored; a row that fails it gets a FastAPI-shaped 422 on `/seed_session` and `/verify`.
   * @example z.object({ question: z.string(), expected_answer: z.string() })
   */
  row: Row;

  /**
   * zod schema of the row fields `seedSession` reads, when they differ from `row` (NeMo Gym
   * validates seed and verify bodies separately). Omitted: `/seed_session` accepts any object.
   * @example z.object({ initial_count: z.number().int() })
   */
  seedRow?: SeedRow;

  /**
   * zod schema of the environment's config (the keys of its NeMo Gym YAML block beyond
   * entrypoint, domain, host and port). Defaults fill in what the YAML leaves out.
   * @example z.object({ should_use_judge: z.boolean().default(false) })
   */
  config?: Config;

  /**
   * The tools the agent may call, by name. On the NeMo Gym face each is `POST /<name>`; on the
   * rollout service each is offered to the policy as a function tool.
   * @example { execute_python: pythonTool }
   */
  tools?: Record<string, ToolDefinition<any, z.output<Config>>>;

  /**
   * Which tools the rollout service offers the policy: 'all' of `tools` when the row declares
   * none, or only those the row declares in `responses_create_params.tools` ('declared', as NeMo
   * Gym does: a row without tools gets none).
   * @default 'all'
   */
  offerTools?: 'all' | 'declared';

  /**
   * What the rollout service's INIT stage must create before `seedSession`.
   * @example { image: '/images/python.sif', network: false }
   */
  sandbox?: SandboxRequirement<z.output<Row>, z.output<Config>, Resources>;

  /**
   * Creates what the environment holds for the whole server (worker pools, sandbox providers),
   * from its parsed config. Each face calls it once, on first use, and hands the result to every
   * hook as `ctx.resources`; `close` frees it when the face stops.
   * @example setup: (config) => ({ grader: createGrader({ timeoutSeconds: config.timeout }) })
   */
  setup?(config: z.output<Config>): Promise<Resources> | Resources;

  /**
   * Starts a rollout: builds the per-rollout state from the row. Its return value is the
   * `/seed_session` response body (default `{}`).
   * @example async seedSession(row, ctx) { ctx.session.state.count = row.initial_count }
   */
  seedSession?(
    row: z.output<SeedRow> & Record<string, unknown>,
    ctx: EnvironmentContext<z.output<Config>, Resources>,
  ): Promise<Record<string, unknown> | void> | Record<string, unknown> | void;

  /**
   * Scores a finished rollout. Anything the model did wrong is reward 0, never a throw. Extras
   * keep the key names of the NeMo Gym environment this one replaces, and are returned beside
   * `reward` in the `/verify` response.
   * @example async verify(row, response) { return { reward: 1, extracted_answer: '8' } }
   */
  verify(
    row: z.output<Row> & Record<string, unknown>,
    response: NeMoGymResponse,
    ctx: EnvironmentContext<z.output<Config>, Resources>,
  ): Promise<VerifyResult> | VerifyResult;

  /**
   * NeMo Gym's `compute_metrics`: `tasks` holds the verify entries grouped by task, in task
   * order. Its result is merged into `agent_metrics`; a `per_task_metrics` list is merged into the
   * matching group entries.
   * @example metrics: (tasks) => computePassMajorityMetrics(tasks, { score: (r) => ({ accuracy: r.reward }) })
   */
  metrics?(tasks: VerifyEntry[][]): EnvironmentMetrics;

  /**
   * NeMo Gym's `get_key_metrics`: picks the headline numbers out of `agent_metrics`. The default
   * keeps every `mean/*` key.
   * @example keyMetrics: (m) => ({ 'mean/reward': m['mean/reward'] })
   */
  keyMetrics?(agentMetrics: Record<string, unknown>): Record<string, unknown>;

  /**
   * Frees what `setup` returned; called once when the resources server or the rollout service
   * stops (only if `setup` ran; always when there is no `setup`, with undefined).
   * @example close: (resources) => resources.grader.close()
   */
  close?(resources: Resources): Promise<void> | void;

  /**
   * Whether `/verify` may be replayed without the session (`gym eval reverify`).
   * @default 'unknown'
   */
  reverifyMode?: ReverifyMode;

  /**
   * Top-level verify-response fields that NeMo Gym declares as floats: integral values are sent
   * as `1.0`, not `1`, so rollouts written from this server are byte-identical to Python's.
   * @example ['reward', 'library_reward']
   */
  floatFields?: readonly string[];
}

/**
 * The session's sandbox (`ctx.tools.sandbox()`): the rollout service's INIT creates it, the NeMo
 * Gym face on first use, both from this.
 */
export interface SandboxRequirement<Row = Record<string, unknown>, Config = Record<string, unknown>, Resources = unknown> {
  /**
   * A root directory, an Apptainer `.sif` or a `docker://` reference. Omitted: the host's root,
   * read-only.
   * @example 'docker://python:3.12-slim'
   */
  image?: string;
  /** Whether the sandbox may reach the network. @default false */
  network?: boolean;
  /**
   * Resource limits of the sandbox.
   * @example { memoryMib: 2048, maxProcesses: 256 }
   */
  resources?: SandboxResources;
  /**
   * The sandbox for one row, when it depends on the row (a per-instance SWE image, its
   * environment variables); it replaces image, network and resources above. Gets the row and the
   * config parsed by the environment's schemas. On the NeMo Gym face the row is the
   * `/seed_session` body; a session never seeded gets image, network and resources above.
   * @example spec: (row, config) => ({ image: `docker://swebench/sweb.eval.x86_64.${row.instance_id}`, workdir: '/testbed', env: config.env })
   */
  spec?(row: Row & Record<string, unknown>, config: Config): SandboxSpec;
  /**
   * Which provider creates the session's sandbox, when the environment names one (from its
   * config). Omitted or undefined: the face's (the rollout service's `sandboxProvider`, the
   * default provider on the NeMo Gym face).
   * @example provider: (config, resources) => resources.provider
   */
  provider?(config: Config, resources: Resources): SandboxProvider | undefined;
  /**
   * Whether `verify` still needs the agent's session resources (its sandbox, kernels). Omitted:
   * the rollout service frees them before EVAL. SWE keeps them to take the diff, then starts a
   * fresh sandbox of its own for the tests.
   * @default false
   */
  keepForVerify?: boolean;
}

/**
 * The sandbox a session gets from an environment's `sandbox`: `spec(row, config)` when there is a
 * row and a `spec`, else image, network and resources.
 */
export function sandboxSpecOf<Row, Config>(
  requirement: SandboxRequirement<Row, Config, any> | undefined,
  row: (Row & Record<string, unknown>) | undefined,
  config: Config,
): SandboxSpec {
  if (requirement === undefined) return {};
  if (requirement.spec && row !== undefined) return requirement.spec(row, config);
  const { image, network, resources } = requirement;
  return { ...(image ? { image } : {}), ...(network ? { network } : {}), ...(resources ? { resources } : {}) };
}

/** An environment as `defineEnvironment` returns it: the definition, with defaults filled in. */
export type Environment<
  Row extends z.ZodType = z.ZodType,
  Config extends z.ZodType = z.ZodType,
  SeedRow extends z.ZodType = z.ZodType,
  Resources = any,
> = EnvironmentDefinition<Row, Config, SeedRow, Resources> & {
    readonly reverifyMode: ReverifyMode;
    readonly tools: Record<string, ToolDefinition<any, z.output<Config>>>;
  };

/** Names NeMo Gym reserves, which a tool may not take (CONTRACT.md §1.1). */
export const RESERVED_TOOL_NAMES = new Set(['verify', 'seed_session', 'aggregate_metrics', 'mcp', 'reverify_mode']);

/**
 * Declares an environment. Returns plain data; `createResourcesServer(env)` and the rollout
 * service turn it into servers.
 */
export function defineEnvironment<
  Row extends z.ZodType,
  Config extends z.ZodType = z.ZodType,
  SeedRow extends z.ZodType = z.ZodType,
  Resources = undefined,
>(definition: EnvironmentDefinition<Row, Config, SeedRow, Resources>): Environment<Row, Config, SeedRow, Resources> {
  if (!/^[a-z][a-z0-9_-]*$/.test(definition.name)) {
    throw new TypeError(`environment name ${JSON.stringify(definition.name)} must match [a-z][a-z0-9_-]*`);
  }
  const tools = definition.tools ?? {};
  for (const name of Object.keys(tools)) {
    if (RESERVED_TOOL_NAMES.has(name)) throw new TypeError(`tool name "${name}" is reserved by NeMo Gym`);
    if (!/^[A-Za-z_][A-Za-z0-9_-]*$/.test(name)) throw new TypeError(`tool name "${name}" is not a valid route name`);
  }
  return { ...definition, tools, reverifyMode: definition.reverifyMode ?? 'unknown' };
}
