import { posix } from 'node:path';
import { shQuote } from '../sandbox/process.ts';
import type { Sandbox } from '../sandbox/types.ts';

/*
 * str_replace_editor with the semantics and message texts of the tool SWE agents are trained on
 * (Anthropic's text editor tool as SWE-agent's `edit_anthropic` and OpenHands ship it): tabs
 * expanded, 4 lines of snippet context, `cat -n` numbering, one undo level per edit, output
 * clipped at 16,000 characters. It works through the sandbox (exec, upload, download), so the
 * sandbox's own permissions decide what may be read or written and no host path is ever touched.
 */

export const EDITOR_COMMANDS = ['view', 'create', 'str_replace', 'insert', 'undo_edit'] as const;
export type EditorCommand = (typeof EDITOR_COMMANDS)[number];

export interface EditorArgs {
  command: string;
  path: string;
  file_text?: string | undefined;
  old_str?: string | undefined;
  new_str?: string | undefined;
  insert_line?: number | undefined;
  view_range?: number[] | undefined;
}

export interface EditorResult {
  output: string;
  /** True when the command failed (the output is then the error message). */
  error: boolean;
}

const SNIPPET_LINES = 4;
const MAX_RESPONSE_LEN = 16000;
const TRUNCATED_MESSAGE =
  '<response clipped><NOTE>To save on context only part of this file has been shown to you. You should retry this tool after you have searched inside the file with `grep -n` in order to find the line numbers of what you are looking for.</NOTE>';

class ToolError extends Error {}

/** Python's str.expandtabs(8). */
export function expandTabs(text: string, size = 8): string {
  if (!text.includes('\t')) return text;
  let out = '';
  let column = 0;
  for (const char of text) {
    if (char === '\t') {
      const spaces = size - (column % size);
      out += ' '.repeat(spaces);
      column += spaces;
    } else {
      out += char;
      column = char === '\n' || char === '\r' ? 0 : column + 1;
    }
  }
  return out;
}

function maybeTruncate(content: string): string {
  return content.length <= MAX_RESPONSE_LEN ? content : content.slice(0, MAX_RESPONSE_LEN) + TRUNCATED_MESSAGE;
}

function makeOutput(fileContent: string, descriptor: string, initLine = 1): string {
  const numbered = maybeTruncate(expandTabs(fileContent))
    .split('\n')
    .map((line, i) => `${String(i + initLine).padStart(6)}\t${line}`)
    .join('\n');
  return `Here's the result of running \`cat -n\` on ${descriptor}:\n${numbered}\n`;
}

function countOccurrences(haystack: string, needle: string): number {
  if (needle === '') return haystack.length + 1;
  let count = 0;
  for (let at = haystack.indexOf(needle); at >= 0; at = haystack.indexOf(needle, at + needle.length)) count++;
  return count;
}

const pyList = (values: number[]): string => `[${values.join(', ')}]`;

export interface EditorOptions {
  /**
   * The largest file the editor reads, bytes: a larger one is an error that says to use bash
   * (grep -n, sed -n) instead, and never more than this is read into the service. @default 16 MiB
   */
  maxFileBytes?: number;
  /** What the undo history of all files may hold, characters; the oldest entries go first. @default 64 Mi */
  maxHistoryChars?: number;
}

const DEFAULT_MAX_FILE_BYTES = 16 * 1024 * 1024;
/** A directory listing is read up to this many bytes; the model sees MAX_RESPONSE_LEN of it. */
const MAX_LISTING_BYTES = 1024 * 1024;

export class Editor {
  private readonly history = new Map<string, string[]>();
  private historyChars = 0;
  private readonly maxFileBytes: number;

  constructor(
    private readonly sandbox: Sandbox,
    private readonly options: EditorOptions = {},
  ) {
    this.maxFileBytes = options.maxFileBytes ?? DEFAULT_MAX_FILE_BYTES;
  }

  /** Runs one editor command; errors come back as `{ error: true, output: <message> }`. */
  async run(args: EditorArgs): Promise<EditorResult> {
    try {
      return { output: await this.dispatch(args), error: false };
    } catch (error) {
      if (error instanceof ToolError) return { output: error.message, error: true };
      throw error;
    }
  }

  private async dispatch(args: EditorArgs): Promise<string> {
    const { command, path } = args;
    await this.validatePath(command, path);
    switch (command) {
      case 'view':
        return this.view(path, args.view_range);
      case 'create': {
        if (args.file_text === undefined) throw new ToolError('Parameter `file_text` is required for command: create');
        await this.write(path, args.file_text);
        this.pushHistory(path, args.file_text);
        return `File created successfully at: ${path}`;
      }
      case 'str_replace': {
        if (args.old_str === undefined) throw new ToolError('Parameter `old_str` is required for command: str_replace');
        return this.strReplace(path, args.old_str, args.new_str);
      }
      case 'insert': {
        if (args.insert_line === undefined) throw new ToolError('Parameter `insert_line` is required for command: insert');
        if (args.new_str === undefined) throw new ToolError('Parameter `new_str` is required for command: insert');
        return this.insert(path, args.insert_line, args.new_str);
      }
      case 'undo_edit':
        return this.undo(path);
      default:
        throw new ToolError(
          `Unrecognized command ${command}. The allowed commands for the str_replace_editor tool are: ${EDITOR_COMMANDS.join(', ')}`,
        );
    }
  }

  private async kind(path: string): Promise<'dir' | 'file' | 'none'> {
    const q = shQuote(path);
    const result = await this.sandbox.exec(`if [ -d ${q} ]; then echo dir; elif [ -e ${q} ]; then echo file; else echo none; fi`, {
      cwd: '/',
    });
    const kind = result.stdout.trim();
    if (kind === 'dir' || kind === 'file') return kind;
    return 'none';
  }

  private async validatePath(command: string, path: string): Promise<void> {
    if (!path.startsWith('/')) {
      const suggested = posix.join(this.sandbox.workdir, path);
      throw new ToolError(`The path ${path} is not an absolute path, it should start with \`/\`. Maybe you meant ${suggested}?`);
    }
    const kind = await this.kind(path);
    if (kind === 'none' && command !== 'create') {
      throw new ToolError(`The path ${path} does not exist. Please provide a valid path.`);
    }
    if (kind !== 'none' && command === 'create') {
      throw new ToolError(`File already exists at: ${path}. Cannot overwrite files using command \`create\`.`);
    }
    if (kind === 'dir' && command !== 'view') {
      throw new ToolError(`The path ${path} is a directory and only the \`view\` command can be used on directories`);
    }
  }

  /**
   * A file's text, at most maxFileBytes of it read into the service: `head -c` stops one byte past
   * the cap inside the sandbox, so a file that grows meanwhile is refused too, never read whole.
   */
  private async read(path: string): Promise<string> {
    const cap = this.maxFileBytes;
    const q = shQuote(path);
    // counted in the sandbox first (by bytes: the text comes back decoded), then read; `head`
    // bounds a device or /proc file that says it is empty and never ends
    const script = `n=$(head -c ${cap + 1} -- ${q} | wc -c) || exit 1; if [ "$n" -gt ${cap} ]; then echo large; else echo ok; head -c ${cap} -- ${q}; fi`;
    const result = await this.sandbox.exec(script, { cwd: '/', maxOutputBytes: cap + 64 });
    if (result.returnCode !== 0) {
      throw new ToolError(`Ran into ${result.stderr.trim() || `exit code ${result.returnCode}`} while trying to read ${path}`);
    }
    const newline = result.stdout.indexOf('\n');
    const text = result.stdout.slice(newline + 1);
    if (result.stdout.slice(0, newline) !== 'ok') {
      throw new ToolError(
        `The file ${path} is larger than ${cap} bytes, more than this tool reads. Use bash to work with it (\`grep -n\`, \`sed -n '<start>,<end>p'\`).`,
      );
    }
    return text;
  }

  private async write(path: string, content: string): Promise<void> {
    try {
      await this.sandbox.upload(path, content);
    } catch (error) {
      throw new ToolError(`Ran into ${(error as Error).message} while trying to write to ${path}`);
    }
  }

  /** One undo level more; the history of all files stays within maxHistoryChars (oldest dropped). */
  private pushHistory(path: string, content: string): void {
    const list = this.history.get(path) ?? [];
    list.push(content);
    this.history.set(path, list);
    this.historyChars += content.length;
    const max = this.options.maxHistoryChars ?? 64 * 1024 * 1024;
    for (const [file, entries] of this.history) {
      while (this.historyChars > max && entries.length > 0) this.historyChars -= entries.shift()!.length;
      if (entries.length === 0) this.history.delete(file);
      if (this.historyChars <= max) break;
    }
  }

  private async view(path: string, viewRange: number[] | undefined): Promise<string> {
    if ((await this.kind(path)) === 'dir') {
      if (viewRange !== undefined) throw new ToolError('The `view_range` parameter is not allowed when `path` points to a directory.');
      // a listing is clipped as the reference tool's run() clips command output
      const result = await this.sandbox.exec(`find ${shQuote(path)} -maxdepth 2 -not -path '*/\\.*'`, { cwd: '/', maxOutputBytes: MAX_LISTING_BYTES });
      if (result.stderr !== '' && result.stdout === '') throw new ToolError(maybeTruncate(result.stderr));
      return `Here's the files and directories up to 2 levels deep in ${path}, excluding hidden items:\n${maybeTruncate(result.stdout)}\n`;
    }
    let content = await this.read(path);
    let initLine = 1;
    if (viewRange !== undefined) {
      if (viewRange.length !== 2 || !viewRange.every((n) => Number.isInteger(n))) {
        throw new ToolError('Invalid `view_range`. It should be a list of two integers.');
      }
      const lines = content.split('\n');
      const numLines = lines.length;
      const [init, final] = viewRange as [number, number];
      if (init < 1 || init > numLines) {
        throw new ToolError(
          `Invalid \`view_range\`: ${pyList(viewRange)}. Its first element \`${init}\` should be within the range of lines of the file: ${pyList([1, numLines])}`,
        );
      }
      if (final > numLines) {
        throw new ToolError(
          `Invalid \`view_range\`: ${pyList(viewRange)}. Its second element \`${final}\` should be smaller than the number of lines in the file: \`${numLines}\``,
        );
      }
      if (final !== -1 && final < init) {
        throw new ToolError(
          `Invalid \`view_range\`: ${pyList(viewRange)}. Its second element \`${final}\` should be larger or equal than its first \`${init}\``,
        );
      }
      content = final === -1 ? lines.slice(init - 1).join('\n') : lines.slice(init - 1, final).join('\n');
      initLine = init;
    }
    return makeOutput(content, path, initLine);
  }

  private async strReplace(path: string, oldStrRaw: string, newStrRaw: string | undefined): Promise<string> {
    const fileContent = expandTabs(await this.read(path));
    const oldStr = expandTabs(oldStrRaw);
    const newStr = expandTabs(newStrRaw ?? '');
    const occurrences = countOccurrences(fileContent, oldStr);
    if (occurrences === 0) {
      throw new ToolError(`No replacement was performed, old_str \`${oldStr}\` did not appear verbatim in ${path}.`);
    }
    if (occurrences > 1) {
      const lines = fileContent
        .split('\n')
        .flatMap((line, index) => (line.includes(oldStr) ? [index + 1] : []));
      throw new ToolError(
        `No replacement was performed. Multiple occurrences of old_str \`${oldStr}\` in lines ${pyList(lines)}. Please ensure it is unique`,
      );
    }
    const at = fileContent.indexOf(oldStr);
    const newContent = fileContent.slice(0, at) + newStr + fileContent.slice(at + oldStr.length);
    await this.write(path, newContent);
    this.pushHistory(path, fileContent);
    const replacementLine = fileContent.slice(0, at).split('\n').length - 1;
    const startLine = Math.max(0, replacementLine - SNIPPET_LINES);
    const endLine = replacementLine + SNIPPET_LINES + (newStr.split('\n').length - 1);
    const snippet = newContent.split('\n').slice(startLine, endLine + 1).join('\n');
    return (
      `The file ${path} has been edited. ` +
      makeOutput(snippet, `a snippet of ${path}`, startLine + 1) +
      'Review the changes and make sure they are as expected. Edit the file again if necessary.'
    );
  }

  private async insert(path: string, insertLine: number, newStrRaw: string): Promise<string> {
    const fileText = expandTabs(await this.read(path));
    const newStr = expandTabs(newStrRaw);
    const fileLines = fileText.split('\n');
    const nLines = fileLines.length;
    if (insertLine < 0 || insertLine > nLines) {
      throw new ToolError(
        `Invalid \`insert_line\` parameter: ${insertLine}. It should be within the range of lines of the file: ${pyList([0, nLines])}`,
      );
    }
    const newLines = newStr.split('\n');
    const newFileLines = [...fileLines.slice(0, insertLine), ...newLines, ...fileLines.slice(insertLine)];
    const snippetLines = [
      ...fileLines.slice(Math.max(0, insertLine - SNIPPET_LINES), insertLine),
      ...newLines,
      ...fileLines.slice(insertLine, insertLine + SNIPPET_LINES),
    ];
    await this.write(path, newFileLines.join('\n'));
    this.pushHistory(path, fileText);
    return (
      `The file ${path} has been edited. ` +
      makeOutput(snippetLines.join('\n'), 'a snippet of the edited file', Math.max(1, insertLine - SNIPPET_LINES + 1)) +
      'Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary.'
    );
  }

  private async undo(path: string): Promise<string> {
    const list = this.history.get(path);
    const previous = list?.pop();
    if (previous === undefined) throw new ToolError(`No edit history found for ${path}.`);
    this.historyChars -= previous.length;
    await this.write(path, previous);
    return `Last edit to ${path} undone successfully. ${makeOutput(previous, path)}`;
  }
}
