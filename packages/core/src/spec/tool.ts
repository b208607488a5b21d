import { z } from 'zod';
import type { EnvironmentContext } from './context.ts';

/**
 * A tool the agent may call. The same definition is a `POST /<name>` route on the NeMo Gym face
 * and a function tool offered to the policy by the rollout service.
 *
 * @example
 * const getWeather = defineTool({
 *   description: 'Current weather for a city',
 *   parameters: z.object({ city: z.string() }),
 *   handler: ({ city }) => ({ city, weather_description: `The weather in ${city} is cold.` }),
 * });
 */
export interface ToolDefinition<Params extends z.ZodType = z.ZodType, Config = Record<string, unknown>> {
  /**
   * What the model reads about the tool.
   * @example 'Run Python code in a persistent interpreter and return stdout, stderr and the result'
   */
  description: string;

  /**
   * zod schema of the arguments object. Invalid arguments get a FastAPI-shaped 422 on the NeMo Gym
   * face and an error output on the rollout service; the JSON Schema offered to the policy is
   * derived from it (`z.toJSONSchema`).
   * @example z.object({ code: z.string() })
   */
  parameters: Params;

  /**
   * Runs the call. Whatever it returns is sent as JSON (a string is sent as it is); the model sees
   * that text. A throw becomes an error output for the model, never a crashed server.
   * @example async ({ code }, ctx) => (await ctx.tools.python()).run(code)
   */
  handler(args: z.output<Params>, ctx: EnvironmentContext<Config>): unknown;

  /**
   * Per-call time limit in milliseconds; the handler's `ctx.signal` is aborted when it passes.
   * Time the call spends starting the session's sandbox or backends (`ctx.tools`) is not counted.
   * @default 60_000
   */
  timeoutMs?: number;

  /**
   * Starts what the tool's calls run on (the session's sandbox, shell or Python kernel) ahead of
   * the first call. The rollout service calls it in INIT for each tool it offers, in parallel and
   * under the task's `limits.init_timeout_s`, so that start-up is infrastructure time: a slow
   * machine never costs the policy part of `tool_timeout_s`, and a start that fails or misses the
   * limit ends the rollout as a filtered infrastructure failure (`criticalError: 'init'`). A start
   * a call makes itself (no `prepare`, or a kernel reset) is left out of the call's time limit
   * the same way; its failure is infrastructure only before the policy acted in the sandbox
   * (`SessionTools.policyBegins`), after that it is the call's error. Omitted: nothing is started ahead.
   * @example prepare: (ctx) => ctx.tools.python()
   */
  prepare?(ctx: EnvironmentContext<Config>): unknown;

  /**
   * Whether a call that returned `output` did what it was asked (its code ran cleanly, its command
   * exited 0). The rollout service records a false as the call's status 'error', the per-turn
   * tool-success signal of turn-level credit assignment. Omitted: every return counts as success.
   * @example succeeded: (output) => output.success === true
   */
  succeeded?(output: any): boolean;

  /**
   * The text the model reads for a value `handler` returned, when it is not the value itself (a
   * string as it is, anything else as JSON). Both faces send this text.
   * @example text: (value) => value.output
   */
  text?(value: any): string;

  /**
   * How the call went, as structured data read from the value `handler` returned: the process's
   * exit code, whether it hit its own time limit, the exception it raised. The rollout service
   * records it on the call and derives the call's status from it (a time-out is 'timeout'; an
   * exception or a non-zero exit code is 'error'). Omitted: a return is a clean run.
   * @example execution: (value) => ({ exitCode: value.exitCode, timedOut: value.timedOut, exception: null })
   */
  execution?(value: any): ToolExecution;

  /**
   * The code a call executes, for code-based reward shaping (GTPO). Omitted: the `code` or else
   * the `command` argument when it is a string, else none.
   * @example code: (args) => args.script
   */
  code?(args: any): string | null;
}

/** A tool call's outcome as structured data (see `ToolDefinition.execution`). */
export interface ToolExecution {
  /** The exit code of the process the call ran; null when none exited (time-out, not a process). */
  exitCode: number | null;
  /** The call hit its own time limit (the command was interrupted). */
  timedOut: boolean;
  /** The exception the code raised (`ValueError: bad`), null when none. */
  exception: string | null;
}

/** Declares a tool (identity at run time; it keeps the parameter types). */
export function defineTool<Params extends z.ZodType, Config = Record<string, unknown>>(
  tool: ToolDefinition<Params, Config>,
): ToolDefinition<Params, Config> {
  return tool;
}

/** The function-tool declaration of a tool, as a Responses API row or the policy sees it. */
export function toolDeclaration(name: string, tool: ToolDefinition<any, any>): {
  type: 'function';
  name: string;
  description: string;
  parameters: Record<string, unknown>;
  strict: boolean;
} {
  const schema = z.toJSONSchema(tool.parameters, { io: 'input', unrepresentable: 'any' }) as Record<string, unknown>;
  delete schema.$schema;
  return { type: 'function', name, description: tool.description, parameters: schema, strict: false };
}
