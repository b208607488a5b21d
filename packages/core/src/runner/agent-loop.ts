import { z } from 'zod';
import { RolloutError } from '../errors.ts';
import { jsonInvalidError, NOT_FOUND_BODY, reprError, zodIssuesToPydantic } from '../server/fastapi-errors.ts';
import type { Environment, EnvironmentContext } from '../spec/environment.ts';
import { invokeTool, toolCallCode, toolOutputText } from '../spec/invoke-tool.ts';
import { toolDeclaration, type ToolDefinition, type ToolExecution } from '../spec/tool.ts';
import type { CallModel, ChatMessage, ModelTurn } from '../protocol/chat.ts';
import { inputToMessages, responsesToolsToChat } from './messages.ts';
import { PromptLog } from './prompt-log.ts';
import { TURN_REWARD_NAMES } from '../protocol/reward-components.ts';
import type { ToolCallRecord, ToolCallStatus, TurnRecord } from '../protocol/rollout.ts';

export type { CallModel, ModelTurn } from '../protocol/chat.ts';

export interface AgentLoopOptions {
  env: Environment<any, any, any>;
  row: Record<string, unknown> & { responses_create_params: { input: unknown; instructions?: unknown; tools?: unknown[] } };
  ctx: Omit<EnvironmentContext, 'signal'>;
  callModel: CallModel;
  maxTurns: number;
  toolTimeoutMs: number;
  signal: AbortSignal;
  /**
   * Called after each turn (progress, metrics). While the loop runs, an earlier turn's
   * `promptTokenIds` may be null (held once, see PromptLog); every turn has it whole once the loop ends.
   */
  onTurn?: (turn: TurnRecord) => void;
  /** Called after each tool call. */
  onToolCall?: (call: ToolCallRecord) => void;
  /** Why the rollout's sandbox was ended by one of its limits, if it was (checked after each tool call). */
  checkLimits?: () => string | undefined;
  /**
   * The start of the sandbox or a backend that failed or missed its limit during a call before
   * the policy acted in the sandbox, if one did (`SessionTools.startFailure`; checked after each
   * tool call): an infrastructure failure, whatever the tool's handler made of it.
   */
  checkStartup?: () => RolloutError | undefined;
  /**
   * The loop sets `snapshot` to what it has produced so far (turns with their prompts whole,
   * messages), for a rollout cut short by its time limit: a time-out that is the policy's is
   * scored, so its trajectory is kept.
   */
  progress?: { snapshot?: () => Pick<AgentLoopResult, 'turns' | 'messages' | 'offeredTools' | 'usage'> };
}

export interface AgentLoopResult {
  turns: TurnRecord[];
  messages: ChatMessage[];
  /** Tools as offered to the model (Responses form, for the NeMo Gym response). */
  offeredTools: unknown[];
  usage: { input: number; output: number };
  /** Why the loop ended. */
  stop: 'final_answer' | 'length' | 'max_turns' | 'resource_limit' | 'start_failed';
  /** With `resource_limit`: which limit, and by how much. */
  limit?: string;
  /** With `start_failed`: what did not start. */
  startError?: RolloutError;
}

/**
 * The tools a rollout offers: the row's declared function tools (NeMo Gym declares tools per row)
 * when it has any, else every tool of the environment (none with `offerTools: 'declared'`).
 */
export function offeredTools(env: Environment<any, any, any>, rowTools: readonly unknown[] | undefined): unknown[] {
  if (rowTools && rowTools.length > 0) return [...rowTools];
  if (env.offerTools === 'declared') return [];
  return Object.entries(env.tools).map(([name, tool]) => toolDeclaration(name, tool));
}

/**
 * The environment's tools behind the tools a rollout offers (see `offeredTools`), each once: INIT
 * runs their `prepare`.
 */
export function offeredDefinitions(env: Environment<any, any, any>, rowTools: readonly unknown[] | undefined): Array<ToolDefinition<any, any>> {
  const found = new Set<ToolDefinition<any, any>>();
  for (const declared of offeredTools(env, rowTools)) {
    const given = (declared as { name?: unknown } | null)?.name;
    if (typeof given !== 'string') continue;
    const name = given.replace(/^mcp__[^_]+__/, '');
    if (Object.hasOwn(env.tools, name)) found.add(env.tools[name]!);
  }
  return [...found];
}

async function runToolCall(
  options: AgentLoopOptions,
  call: { id: string; name: string; arguments: string },
): Promise<ToolCallRecord> {
  const started = performance.now();
  const done = (status: ToolCallStatus, output: string, execution: ToolExecution | null = null, code: string | null = null): ToolCallRecord => ({
    id: call.id,
    name: call.name,
    arguments: call.arguments,
    output,
    status,
    execution: execution && { exit_code: execution.exitCode, timed_out: execution.timedOut, exception: execution.exception },
    code,
    duration_ms: performance.now() - started,
  });
  // NeMo Gym names may arrive MCP-namespaced (mcp__<server>__<tool>).
  const name = call.name.replace(/^mcp__[^_]+__/, '');
  const tool: ToolDefinition<any, any> | undefined = Object.hasOwn(options.env.tools, name) ? options.env.tools[name] : undefined;
  if (!tool) return done('unknown_tool', JSON.stringify(NOT_FOUND_BODY));
  let args: unknown;
  try {
    args = call.arguments.trim() === '' ? {} : JSON.parse(call.arguments);
  } catch (error) {
    // simple_agent's text for arguments that are not JSON.
    return done('invalid_arguments', JSON.stringify({ error: `Invalid tool call arguments: ${String(error)}`, detail: [jsonInvalidError(error)] }));
  }
  const parsed = (tool.parameters as z.ZodType).safeParse(args ?? {});
  if (!parsed.success) {
    return done('invalid_arguments', JSON.stringify({ detail: zodIssuesToPydantic(parsed.error.issues, args, tool.parameters) }));
  }
  let code: string | null = null;
  try {
    code = toolCallCode(tool, parsed.data);
  } catch {
    code = null;
  }
  const outcome = await invokeTool(tool, parsed.data, options.ctx, { timeoutMs: options.toolTimeoutMs, signal: options.signal });
  if (outcome.ok) {
    let execution: ToolExecution = { exitCode: null, timedOut: false, exception: null };
    let text: string;
    try {
      if (tool.execution) execution = tool.execution(outcome.value);
      // the legacy hook: a false is an error without more to say (a time-out says enough)
      if (execution.exception === null && !execution.timedOut && tool.succeeded && tool.succeeded(outcome.value) === false) execution = { ...execution, exception: 'the tool reported failure' };
      text = toolOutputText(outcome.value, tool);
    } catch (error) {
      execution = { ...execution, exception: `the tool's result could not be read: ${String(error)}` };
      text = toolOutputText(outcome.value);
    }
    return done(executionStatus(execution), text, execution, code);
  }
  if (outcome.timedOut) return done('timeout', JSON.stringify({ detail: (outcome.error as Error).message }), { exitCode: null, timedOut: true, exception: null }, code);
  const error = outcome.error as { name?: unknown; message?: unknown } | undefined;
  const exception = `${typeof error?.name === 'string' ? error.name : 'Error'}: ${typeof error?.message === 'string' ? error.message : String(outcome.error)}`;
  return done('error', JSON.stringify(reprError(outcome.error)), { exitCode: null, timedOut: false, exception }, code);
}

/** A call's status from its structured outcome: a time-out, an exception or a non-zero exit code. */
export function executionStatus(execution: ToolExecution): ToolCallStatus {
  if (execution.timedOut) return 'timeout';
  if (execution.exception !== null || (execution.exitCode !== null && execution.exitCode !== 0)) return 'error';
  return 'ok';
}

/**
 * The RUN stage: call the policy, execute its tool calls in order, repeat until a final answer,
 * a length stop or the turn limit. The model's mistakes (unknown tools, bad arguments, failing
 * tools) become tool outputs it can read; only infrastructure failures throw.
 */
export async function runAgentLoop(options: AgentLoopOptions): Promise<AgentLoopResult> {
  const params = options.row.responses_create_params;
  const tools = offeredTools(options.env, params.tools);
  const chatTools = responsesToolsToChat(tools);
  const messages = inputToMessages(params);
  const turns: TurnRecord[] = [];
  const prompts = new PromptLog();
  const usage = { input: 0, output: 0 };
  let stop: AgentLoopResult['stop'] = 'max_turns';
  if (options.progress) {
    options.progress.snapshot = () => {
      prompts.restore();
      // copies: a tool call in flight may still land in its turn after the rollout has ended
      return { turns: turns.map((turn) => ({ ...turn, tool_calls: [...turn.tool_calls] })), messages: messages.slice(), offeredTools: tools, usage: { ...usage } };
    };
  }

  for (let index = 0; index < options.maxTurns; index++) {
    if (options.signal.aborted) throw options.signal.reason ?? new RolloutError({ code: 'CANCELLED', message: 'rollout aborted' });
    // A copy of the list (the loop appends to its own); the messages themselves are never changed once sent.
    const model = await options.callModel({ messages: messages.slice(), tools: chatTools }, options.signal);
    usage.input += model.usage.promptTokens;
    usage.output += model.usage.completionTokens;
    messages.push(assistantMessage(model));
    const turn = turnRecord(index, model);
    turns.push(turn);
    prompts.add(turn);
    if (model.finishReason === 'length') {
      // A generation cut by the length limit ends the rollout cleanly; its tool calls are not run.
      stop = 'length';
      options.onTurn?.(turn);
      break;
    }
    const cut = await runTurnTools(options, turn, model.toolCalls, messages);
    options.onTurn?.(turn);
    if (cut) {
      prompts.restore();
      return { turns, messages, offeredTools: tools, usage, ...cut };
    }
    // A final answer; a reasoning-only turn goes on, as simple_agent's loop does.
    if (model.toolCalls.length === 0 && model.content !== null && model.content !== '') {
      stop = 'final_answer';
      break;
    }
  }
  prompts.restore();
  return { turns, messages, offeredTools: tools, usage, stop };
}

/** A model turn as the assistant message the conversation goes on with. */
function assistantMessage(model: ModelTurn): ChatMessage {
  return {
    role: 'assistant',
    content: model.content,
    ...(model.toolCalls.length > 0
      ? { tool_calls: model.toolCalls.map((c) => ({ id: c.id, type: 'function' as const, function: { name: c.name, arguments: c.arguments } })) }
      : {}),
    ...(model.reasoning ? { reasoning_content: model.reasoning } : {}),
  };
}

/** A model turn's record, before its tool calls are run and its credit is scored. */
function turnRecord(index: number, model: ModelTurn): TurnRecord {
  return {
    index,
    prompt_token_ids: model.promptTokenIds,
    generation_token_ids: model.generationTokenIds,
    generation_logprobs: model.generationLogprobs,
    finish_reason: model.finishReason,
    text: model.content,
    reasoning: model.reasoning,
    tool_calls: [],
    llm_latency_ms: model.latencyMs,
    backend: model.backend,
    weight_version: model.weightVersion,
    code: null,
    status: 'none',
    malformed: null,
    // filled in by the credit pass (rewards/) once the rollout is scored
    rewards: Object.fromEntries(TURN_REWARD_NAMES.map((name) => [name, null])) as TurnRecord['rewards'],
    reward: 0,
    return: 0,
    normalized_return: null,
  };
}

/**
 * Runs a turn's tool calls in order, each recorded in the turn and its output appended to the
 * conversation. Stops at a call after which the rollout's sandbox was ended by a limit, or a
 * start before the policy acted failed: the loop's stop, with why.
 */
async function runTurnTools(
  options: AgentLoopOptions,
  turn: TurnRecord,
  calls: ModelTurn['toolCalls'],
  messages: ChatMessage[],
): Promise<Pick<AgentLoopResult, 'stop' | 'limit' | 'startError'> | undefined> {
  for (const call of calls) {
    const record = await runToolCall(options, call);
    turn.tool_calls.push(record);
    if (record.code !== null) turn.code = turn.code === null ? record.code : `${turn.code}\n${record.code}`;
    options.onToolCall?.(record);
    messages.push({ role: 'tool', tool_call_id: call.id, content: record.output });
    const limit = options.checkLimits?.();
    if (limit !== undefined) return { stop: 'resource_limit', limit };
    const startError = options.checkStartup?.();
    if (startError !== undefined) return { stop: 'start_failed', startError };
  }
  return undefined;
}
