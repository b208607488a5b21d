import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import type { Sandbox } from '../sandbox/types.ts';
import { Editor, expandTabs } from './editor.ts';

describe('expandTabs', () => {
  it('matches Python str.expandtabs()', () => {
    expect(expandTabs('a\tb')).toBe('a       b');
    expect(expandTabs('abcdefgh\tx\n\ty')).toBe('abcdefgh        x\n        y');
  });
});

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[editor tests] skipped: ${skip}`);

describe.skipIf(skip !== undefined)('str_replace_editor on a bwrap sandbox', () => {
  let sandbox: Sandbox;
  let editor: Editor;
  const file = '/workspace/pkg/mod.py';
  const text = Array.from({ length: 12 }, (_, i) => `line ${i + 1}`).join('\n') + '\n';
  beforeAll(async () => {
    sandbox = await createBwrapProvider().create();
  });
  beforeEach(async () => {
    await sandbox.exec('rm -rf /workspace/* /workspace/.hidden');
    editor = new Editor(sandbox);
  });
  afterAll(() => sandbox.close());

  it('creates a file (parents included) and refuses to overwrite it', async () => {
    expect(await editor.run({ command: 'create', path: file, file_text: text })).toEqual({
      output: `File created successfully at: ${file}`,
      error: false,
    });
    expect((await sandbox.download(file)).toString()).toBe(text);
    expect(await editor.run({ command: 'create', path: file, file_text: 'x' })).toEqual({
      output: `File already exists at: ${file}. Cannot overwrite files using command \`create\`.`,
      error: true,
    });
    expect((await editor.run({ command: 'create', path: file.replace('mod', 'other') })).output).toBe(
      'Parameter `file_text` is required for command: create',
    );
  });

  it('views a file with cat -n numbering and line ranges', async () => {
    await editor.run({ command: 'create', path: file, file_text: 'a\n\tb\nc' });
    expect((await editor.run({ command: 'view', path: file })).output).toBe(
      `Here's the result of running \`cat -n\` on ${file}:\n     1\ta\n     2\t        b\n     3\tc\n`,
    );
    await sandbox.upload(file, text);
    expect((await editor.run({ command: 'view', path: file, view_range: [11, -1] })).output).toBe(
      `Here's the result of running \`cat -n\` on ${file}:\n    11\tline 11\n    12\tline 12\n    13\t\n`,
    );
    expect((await editor.run({ command: 'view', path: file, view_range: [2, 3] })).output).toContain('     2\tline 2\n     3\tline 3\n');
    expect((await editor.run({ command: 'view', path: file, view_range: [0, 3] })).output).toBe(
      'Invalid `view_range`: [0, 3]. Its first element `0` should be within the range of lines of the file: [1, 13]',
    );
    expect((await editor.run({ command: 'view', path: file, view_range: [5, 2] })).output).toBe(
      'Invalid `view_range`: [5, 2]. Its second element `2` should be larger or equal than its first `5`',
    );
    expect((await editor.run({ command: 'view', path: file, view_range: [1, 99] })).output).toBe(
      'Invalid `view_range`: [1, 99]. Its second element `99` should be smaller than the number of lines in the file: `13`',
    );
    expect((await editor.run({ command: 'view', path: file, view_range: [1] })).output).toBe(
      'Invalid `view_range`. It should be a list of two integers.',
    );
  });

  it('views a directory two levels deep without hidden items', async () => {
    await sandbox.exec('mkdir -p a/b/c .hidden && touch a/f a/b/g a/b/c/deep .hidden/h');
    const result = await editor.run({ command: 'view', path: '/workspace' });
    expect(result.output.startsWith("Here's the files and directories up to 2 levels deep in /workspace, excluding hidden items:\n")).toBe(true);
    expect(result.output).toContain('/workspace/a/b\n');
    expect(result.output).toContain('/workspace/a/f\n');
    expect(result.output).not.toContain('/workspace/a/b/c/deep');
    expect(result.output).not.toContain('/workspace/.hidden');
    expect((await editor.run({ command: 'view', path: '/workspace', view_range: [1, 2] })).output).toBe(
      'The `view_range` parameter is not allowed when `path` points to a directory.',
    );
    expect((await editor.run({ command: 'str_replace', path: '/workspace', old_str: 'x' })).output).toBe(
      'The path /workspace is a directory and only the `view` command can be used on directories',
    );
  });

  it('replaces a unique match and shows a snippet', async () => {
    await editor.run({ command: 'create', path: file, file_text: text });
    const result = await editor.run({ command: 'str_replace', path: file, old_str: 'line 6\n', new_str: 'LINE SIX\nextra\n' });
    expect(result.error).toBe(false);
    expect(result.output).toBe(
      `The file ${file} has been edited. Here's the result of running \`cat -n\` on a snippet of ${file}:\n` +
        '     2\tline 2\n     3\tline 3\n     4\tline 4\n     5\tline 5\n     6\tLINE SIX\n     7\textra\n     8\tline 7\n     9\tline 8\n    10\tline 9\n    11\tline 10\n    12\tline 11\n' +
        'Review the changes and make sure they are as expected. Edit the file again if necessary.',
    );
    expect((await sandbox.download(file)).toString()).toContain('line 5\nLINE SIX\nextra\nline 7');
  });

  it('requires a unique, verbatim match', async () => {
    await editor.run({ command: 'create', path: file, file_text: 'x = 1\ny = 2\nx = 1\n' });
    expect((await editor.run({ command: 'str_replace', path: file, old_str: 'x = 1', new_str: 'x = 3' })).output).toBe(
      'No replacement was performed. Multiple occurrences of old_str `x = 1` in lines [1, 3]. Please ensure it is unique',
    );
    expect((await editor.run({ command: 'str_replace', path: file, old_str: 'z = 9', new_str: '' })).output).toBe(
      `No replacement was performed, old_str \`z = 9\` did not appear verbatim in ${file}.`,
    );
    expect((await sandbox.download(file)).toString()).toBe('x = 1\ny = 2\nx = 1\n');
  });

  it('inserts after a line and undoes edits one at a time', async () => {
    await editor.run({ command: 'create', path: file, file_text: 'a\nb\nc' });
    const inserted = await editor.run({ command: 'insert', path: file, insert_line: 1, new_str: 'NEW' });
    expect(inserted.output).toBe(
      `The file ${file} has been edited. Here's the result of running \`cat -n\` on a snippet of the edited file:\n` +
        '     1\ta\n     2\tNEW\n     3\tb\n     4\tc\n' +
        'Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary.',
    );
    expect((await editor.run({ command: 'insert', path: file, insert_line: 9, new_str: 'x' })).output).toBe(
      'Invalid `insert_line` parameter: 9. It should be within the range of lines of the file: [0, 4]',
    );
    await editor.run({ command: 'str_replace', path: file, old_str: 'c', new_str: 'C' });
    expect((await sandbox.download(file)).toString()).toBe('a\nNEW\nb\nC');
    expect((await editor.run({ command: 'undo_edit', path: file })).output).toBe(
      `Last edit to ${file} undone successfully. Here's the result of running \`cat -n\` on ${file}:\n     1\ta\n     2\tNEW\n     3\tb\n     4\tc\n`,
    );
    await editor.run({ command: 'undo_edit', path: file });
    expect((await sandbox.download(file)).toString()).toBe('a\nb\nc');
    expect((await editor.run({ command: 'undo_edit', path: '/workspace/pkg/none.py' })).output).toBe(
      'The path /workspace/pkg/none.py does not exist. Please provide a valid path.',
    );
  });

  it('rejects relative and missing paths, and cannot write outside the sandbox', async () => {
    expect((await editor.run({ command: 'view', path: 'pkg/mod.py' })).output).toBe(
      'The path pkg/mod.py is not an absolute path, it should start with `/`. Maybe you meant /workspace/pkg/mod.py?',
    );
    expect((await editor.run({ command: 'view', path: '/workspace/missing' })).output).toBe(
      'The path /workspace/missing does not exist. Please provide a valid path.',
    );
    const outside = await editor.run({ command: 'create', path: '/usr/evil.txt', file_text: 'x' });
    expect(outside.error).toBe(true);
    expect(outside.output).toContain('while trying to write to /usr/evil.txt');
    // a symlink to a host path resolves inside the sandbox, where that path is read-only or absent
    await sandbox.exec('ln -s /root/.bashrc /workspace/link');
    expect((await editor.run({ command: 'view', path: '/workspace/link' })).error).toBe(true);
  });

  it('clips very long views like SWE-agent', async () => {
    await editor.run({ command: 'create', path: file, file_text: 'y'.repeat(20_000) });
    const result = await editor.run({ command: 'view', path: file });
    expect(result.output).toContain('<response clipped><NOTE>To save on context only part of this file has been shown to you.');
  });
});
