import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import type { Sandbox } from '../sandbox/types.ts';
import { Editor } from './editor.ts';

// What the editor reads from the sandbox into the service is bounded: a file the size of the
// workspace, a device that never ends and a huge directory are refused or clipped, not read whole.

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[editor channel tests] skipped: ${skip}`);

describe.skipIf(skip !== undefined)('the editor reads a bounded amount', () => {
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await createBwrapProvider().create();
  });
  afterAll(() => sandbox.close());

  it('refuses files larger than it reads, and files that never end, pointing at bash', async () => {
    const editor = new Editor(sandbox, { maxFileBytes: 1024 * 1024 });
    await sandbox.exec('head -c 3000000 /dev/zero | tr "\\0" "a" > /workspace/big.txt; head -c 1048576 /dev/zero | tr "\\0" "b" > /workspace/edge.txt');
    for (const path of ['/workspace/big.txt', '/dev/zero', '/dev/urandom']) {
      for (const args of [{ command: 'view', path }, { command: 'str_replace', path, old_str: 'a', new_str: 'b' }, { command: 'insert', path, insert_line: 0, new_str: 'x' }]) {
        const result = await editor.run(args);
        expect(result, `${args.command} ${path}`).toMatchObject({ error: true });
        expect(result.output).toMatch(/is larger than 1048576 bytes.*bash/);
      }
    }
    // a file of exactly the cap is read
    expect((await editor.run({ command: 'view', path: '/workspace/edge.txt' })).output).toContain('<response clipped>');
  });

  it('reads the default cap of 16 MiB and refuses a file past it', async () => {
    const editor = new Editor(sandbox);
    await sandbox.exec('truncate -s 200M /workspace/sparse.bin');
    expect((await editor.run({ command: 'view', path: '/workspace/sparse.bin' })).output).toMatch(/larger than 16777216 bytes/);
  });

  it('clips a directory listing as it clips a file', async () => {
    await sandbox.exec('mkdir -p /workspace/many && cd /workspace/many && for i in $(seq 1 3000); do mkdir -p "d$i"; : > "d$i/file-with-a-long-name-$i.txt"; done');
    const result = await new Editor(sandbox).run({ command: 'view', path: '/workspace/many' });
    expect(result.error).toBe(false);
    expect(result.output).toContain('<response clipped>');
    expect(result.output.length).toBeLessThan(17_000);
  });

  it('keeps its undo history within its bound, oldest first', async () => {
    const editor = new Editor(sandbox, { maxHistoryChars: 250_000 });
    const path = '/workspace/hist.txt';
    await editor.run({ command: 'create', path, file_text: `${'x'.repeat(100_000)}\n0\n` });
    for (let i = 0; i < 5; i++) expect((await editor.run({ command: 'str_replace', path, old_str: `\n${i}\n`, new_str: `\n${i + 1}\n` })).error).toBe(false);
    let undone = 0;
    while (!(await editor.run({ command: 'undo_edit', path })).error) undone++;
    expect(undone).toBe(2);
    expect((await sandbox.exec(`tail -n 1 ${path}`)).stdout).toBe('3\n');
  });
});
