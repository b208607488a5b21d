// math_with_code's `execute_python` and `end_session` tools on the session's persistent Python
// kernel, inside the session's sandbox (bwrap by default) rather than a host subprocess.

import { defineTool } from '@rollserve/core';
import type { EnvironmentContext, SessionTools, ToolExecution } from '@rollserve/core';
import { z } from 'zod';
import { pyStrip } from '@rollserve/core';

/** math_with_code's `ExecutePythonResponse`, with its key order. */
export interface ExecutePythonResponse {
  success: boolean;
  stdout: string;
  stderr: string;
  error_message: string | null;
  result: string | null;
}

export interface CodeToolsConfig {
  /** Seconds a call may run before it is interrupted (math_with_code's `max_execution_time`). */
  max_execution_time: number;
}

// Python math_with_code keeps numpy, scipy and pandas in the namespace; a module this sandbox's
// Python lacks is left out rather than failing the session. The kernel finds them imported
// (PRELOAD: a forked kernel's server imported them once), and the prelude binds the names.
const PRELOAD = ['numpy', 'scipy', 'pandas'];
const PRELUDE = [
  'for __rs_name, __rs_alias in (("numpy", "np"), ("scipy", None), ("pandas", "pd")):',
  '    try:',
  '        globals()[__rs_name] = __import__(__rs_name)',
  '        if __rs_alias: globals()[__rs_alias] = globals()[__rs_name]',
  '    except Exception:',
  '        pass',
  'del __rs_name, __rs_alias',
].join('\n');

const RESULT_MARK = '\u001eROLLSERVE_RESULT:';

// The same prefixes math_with_code's `_get_last_expr_value` refuses to evaluate.
const NOT_AN_EXPRESSION = ['print', 'import', 'from', 'def', 'class', 'if', 'for', 'while', 'try', 'with'];

/**
 * The line math_with_code evaluates a second time for `result` (the last line of the stripped
 * code), or undefined when it would not.
 */
export function resultLine(code: string): string | undefined {
  const lines = pyStrip(code).split('\n');
  const last = pyStrip(lines[lines.length - 1] ?? '');
  if (last === '' || NOT_AN_EXPRESSION.some((prefix) => last.startsWith(prefix))) return undefined;
  return last;
}

// Evaluates the line as Python does: `str(eval(line))`, any exception giving None. Its output
// is the caller's, as in Python, where the second evaluation runs under the same redirect.
function resultCell(line: string): string {
  return [
    'try:',
    `    __rs_value = str(eval(${JSON.stringify(line)}))`,
    'except Exception:',
    '    __rs_value = None',
    `print(${JSON.stringify(RESULT_MARK)} + __import__("json").dumps(__rs_value), end="")`,
    'del __rs_value',
  ].join('\n');
}

// exec() of a string names its file "<string>"; the kernel's cells have other names.
function pythonErrorMessage(ename: string, evalue: string): string {
  if (/^(SyntaxError|IndentationError|TabError)$/.test(ename)) return evalue.replace(/\((?:<[^>]*>|[^(),]*), line (\d+)\)$/, '(<string>, line $1)');
  return evalue;
}

/**
 * What math_with_code's response cannot carry for the rollout's record: a time-out is only the text
 * 'code timed-out' and an exception only its message. Kept beside each response (the tool's
 * `execution` reads it), so the policy and NeMo Gym still see math_with_code's response unchanged.
 */
const outcomes = new WeakMap<ExecutePythonResponse, ToolExecution>();

function answered(response: ExecutePythonResponse, execution: ToolExecution): ExecutePythonResponse {
  outcomes.set(response, execution);
  return response;
}

const failure = (message: string): ExecutePythonResponse => ({ success: false, stdout: '', stderr: '', error_message: message, result: null });
const timedOut = (): ExecutePythonResponse => answered(failure('code timed-out'), { exitCode: null, timedOut: true, exception: null });
const raised = (message: string, exception: string): ExecutePythonResponse => answered(failure(message), { exitCode: null, timedOut: false, exception });

/** A call's structured outcome (`ToolDefinition.execution`), from what executePython recorded. */
export function executePythonOutcome(response: ExecutePythonResponse): ToolExecution {
  return outcomes.get(response) ?? { exitCode: null, timedOut: false, exception: response.success ? null : response.error_message ?? 'error' };
}

/** What math_with_code's kernel starts with: the modules it finds imported, and the prelude run in it first. */
export const codeKernelStart: { readonly preload: readonly string[]; readonly prelude: string } = { preload: PRELOAD, prelude: PRELUDE };

/** The session's kernel as math_with_code's calls use it (the rollout service starts it in INIT). */
function codeKernel(tools: SessionTools, config: CodeToolsConfig) {
  return tools.python({ defaultTimeoutMs: config.max_execution_time * 1000, maxOutputChars: 1_000_000, ...codeKernelStart });
}

/**
 * Runs one `execute_python` call in the session's kernel (`tools.python()`; end_session resets it
 * and the next call starts a fresh one, as math_with_code does) and answers in math_with_code's shape.
 */
export async function executePython(code: string, tools: SessionTools, config: CodeToolsConfig): Promise<ExecutePythonResponse> {
  const limitMs = config.max_execution_time * 1000;
  try {
    const kernel = await codeKernel(tools, config);
    const started = performance.now();
    const ran = await kernel.run(code, { timeoutMs: limitMs });
    if (ran.status === 'timeout') return timedOut();
    if (ran.status === 'error' || ran.error !== null) {
      if (ran.error === null) return raised('error', 'error');
      return raised(pythonErrorMessage(ran.error.ename, ran.error.evalue), `${ran.error.ename}: ${ran.error.evalue}`);
    }
    let { stdout, stderr } = ran;
    let result: string | null = null;
    const line = resultLine(code);
    const left = limitMs - (performance.now() - started);
    if (line !== undefined) {
      if (left <= 0) return timedOut();
      const evaluated = await kernel.run(resultCell(line), { timeoutMs: left });
      if (evaluated.status === 'timeout') return timedOut();
      const mark = evaluated.stdout.lastIndexOf(RESULT_MARK);
      stdout += mark < 0 ? evaluated.stdout : evaluated.stdout.slice(0, mark);
      stderr += evaluated.stderr;
      if (mark >= 0) result = JSON.parse(evaluated.stdout.slice(mark + RESULT_MARK.length)) as string | null;
    }
    return { success: true, stdout, stderr, error_message: null, result };
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    return raised(message, `${error instanceof Error ? error.name : 'Error'}: ${message}`);
  }
}

const executeParameters = z.object({ code: z.string().describe('The Python code to execute for the calculation.') });

/** The `execute_python` tool: math_with_code's request and response, state kept per session. */
export function createExecutePythonTool<Config>(configOf: (ctx: EnvironmentContext<Config>) => CodeToolsConfig) {
  return defineTool<typeof executeParameters, Config>({
    description: 'Execute Python code to perform calculations. You have access to numpy, scipy, pandas and basic math operations.',
    parameters: executeParameters,
    // The per-call limit is the config's; this is only a backstop (start-up is not counted).
    timeoutMs: 300_000,
    succeeded: (output: ExecutePythonResponse) => output.success === true,
    // the record's status: 'timeout' for a time-out, 'error' with the exception's name for a raise
    execution: executePythonOutcome,
    prepare: (ctx) => codeKernel(ctx.tools, configOf(ctx)),
    handler: ({ code }, ctx) => executePython(code, ctx.tools, configOf(ctx)),
  });
}

/** The `end_session` tool: stops the session's kernel; a later call starts a fresh one. */
export function createEndSessionTool<Config>() {
  return defineTool<z.ZodObject<{}>, Config>({
    description: 'Clean up the Python execution session.',
    parameters: z.object({}),
    async handler(_args, ctx): Promise<ExecutePythonResponse> {
      await ctx.tools.resetPython();
      return { success: true, stdout: '', stderr: '', error_message: null, result: null };
    },
  });
}
