import { z } from 'zod';
import { EDITOR_COMMANDS } from '../tools/editor.ts';
import { defineTool, type ToolDefinition } from './tool.ts';

/** The tools run on the session's `ctx.tools` (its sandbox, as the environment's `sandbox` describes it). */
export interface ToolFactoryOptions {
  /** Time limit of one call when the model gives none. @default 120_000 (python 60_000) */
  defaultTimeoutMs?: number;
  /** Ceiling on the time limit the model may ask for. @default 600_000 */
  maxTimeoutMs?: number;
}

/** Room for the interrupt on top of the command's own limit (start-up is not counted: `prepare`). */
const SLACK_MS = 30_000;

const bashParameters = z.object({
  command: z.string().describe('The bash command to run. Runs in a persistent shell: cwd and exported variables persist between calls.'),
  timeout: z.number().positive().optional().describe('Time limit in seconds; the command is interrupted (Ctrl-C) when it passes.'),
});

/** The `bash` tool: a persistent shell in the session's sandbox. */
export function createBashTool<Config = any>(
  options: ToolFactoryOptions = {},
): ToolDefinition<typeof bashParameters, Config> {
  const defaultTimeoutMs = options.defaultTimeoutMs ?? 120_000;
  const maxTimeoutMs = options.maxTimeoutMs ?? 600_000;
  return defineTool({
    description:
      'Run a command in a bash shell. The shell is persistent (cwd and environment variables are kept between calls). ' +
      'Long-running commands are interrupted at the time limit; long output is truncated in the middle. ' +
      'Do not run interactive commands that wait for input.',
    parameters: bashParameters,
    timeoutMs: maxTimeoutMs + SLACK_MS,
    // The model reads the output, with the exit code appended when it is not 0 (the time-out
    // notice is part of the output already).
    text: (value: BashToolResult) => (value.exitCode !== null && value.exitCode !== 0 ? `${value.output}\n[exit code: ${value.exitCode}]` : value.output),
    execution: (value: BashToolResult) => ({ exitCode: value.exitCode, timedOut: value.timedOut, exception: null }),
    code: (args: { command: string }) => args.command,
    prepare: (ctx) => ctx.tools.bash(),
    async handler({ command, timeout }, ctx): Promise<BashToolResult> {
      const timeoutMs = Math.min(timeout === undefined ? defaultTimeoutMs : timeout * 1000, maxTimeoutMs);
      const bash = await ctx.tools.bash();
      const result = await bash.run(command, { timeoutMs });
      return { output: result.output, exitCode: result.exitCode, timedOut: result.timedOut };
    },
  });
}

/** What the `bash` tool returns; the model reads `output` (plus `[exit code: N]` when not 0). */
export interface BashToolResult {
  output: string;
  /** null when the command timed out or the shell exited. */
  exitCode: number | null;
  timedOut: boolean;
}

const pythonParameters = z.object({
  code: z.string().describe('Python code to run in a persistent interpreter; the value of a final expression is returned.'),
});

/** The `execute_python` tool: a persistent Python kernel in the session's sandbox. */
export function createPythonTool<Config = any>(
  options: ToolFactoryOptions = {},
): ToolDefinition<typeof pythonParameters, Config> {
  const timeoutMs = options.defaultTimeoutMs ?? 60_000;
  return defineTool({
    description:
      'Execute Python code in a persistent interpreter (variables and imports are kept between calls). ' +
      'Returns stdout, stderr, the value of the last expression and, on failure, the traceback.',
    parameters: pythonParameters,
    timeoutMs: timeoutMs + SLACK_MS,
    execution: (output: { status: string; error: string | null }) => ({
      exitCode: null,
      timedOut: output.status === 'timeout',
      // the traceback's last line names the exception (`ValueError: bad`)
      exception: output.status === 'ok' ? null : (output.error?.trim().split('\n').at(-1) ?? output.status),
    }),
    code: (args: { code: string }) => args.code,
    prepare: (ctx) => ctx.tools.python(),
    async handler({ code }, ctx) {
      const kernel = await ctx.tools.python();
      const result = await kernel.run(code, { timeoutMs });
      return {
        status: result.status,
        stdout: result.stdout,
        stderr: result.stderr,
        result: result.result,
        error: result.error === null ? null : result.error.traceback || `${result.error.ename}: ${result.error.evalue}`,
        ...(result.notice === undefined ? {} : { notice: result.notice }),
      };
    },
  });
}

const editorParameters = z.object({
  command: z.enum(EDITOR_COMMANDS).describe('The command to run: view, create, str_replace, insert or undo_edit.'),
  path: z.string().describe('Absolute path to a file or directory, e.g. `/workspace/file.py` or `/workspace`.'),
  file_text: z.string().optional().describe('Required for `create`: the content of the file to be created.'),
  old_str: z.string().optional().describe('Required for `str_replace`: the string in `path` to replace; it must match exactly once.'),
  new_str: z
    .string()
    .optional()
    .describe('For `str_replace`: the new string (empty when omitted). Required for `insert`: the string to insert.'),
  insert_line: z.number().int().optional().describe('Required for `insert`: `new_str` is inserted AFTER this line of `path`.'),
  view_range: z
    .array(z.number().int())
    .optional()
    .describe('For `view` of a file: the line range to show, e.g. [11, 12]; [start, -1] shows everything from start.'),
});

/** The `str_replace_editor` tool (SWE-agent / OpenHands semantics) on the session's sandbox. */
export function createEditorTool<Config = any>(
  options: ToolFactoryOptions = {},
): ToolDefinition<typeof editorParameters, Config> {
  return defineTool({
    description:
      'Custom editing tool for viewing, creating and editing files.\n' +
      '* State is persistent across command calls and discussions with the user\n' +
      '* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists non-hidden files and directories up to 2 levels deep\n' +
      '* The `create` command cannot be used if the specified `path` already exists as a file\n' +
      '* If a `command` generates a long output, it will be truncated and marked with `<response clipped>`\n' +
      '* The `undo_edit` command will revert the last edit made to the file at `path`\n\n' +
      'Notes for using the `str_replace` command:\n' +
      '* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful of whitespaces!\n' +
      '* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to include enough context in `old_str` to make it unique\n' +
      '* The `new_str` parameter should contain the edited lines that should replace the `old_str`',
    parameters: editorParameters,
    timeoutMs: options.defaultTimeoutMs ?? 60_000,
    prepare: (ctx) => ctx.tools.sandbox(),
    async handler(args, ctx) {
      const editor = await ctx.tools.editor();
      return (await editor.run(args)).output;
    },
  });
}

/** Ready-made tools with the defaults (the session's sandbox from the default provider). */
export const bashTool = createBashTool();
export const pythonTool = createPythonTool();
export const editorTool = createEditorTool();
