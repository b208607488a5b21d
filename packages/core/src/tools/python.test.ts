import { spawnSync } from 'node:child_process';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import type { Sandbox } from '../sandbox/types.ts';
import { PythonKernel } from './python.ts';

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[python tests] skipped: ${skip}`);

const hasIPython = spawnSync('/usr/bin/python3', ['-c', 'import IPython']).status === 0;
if (!hasIPython) console.warn('[python tests] IPython is not importable in the sandbox (install python3-ipython): only the plain-exec kernel is tested');

// Both shells where IPython is there: 'auto' picks IPython, 'plain' forces exec.
const shells = (hasIPython ? ['auto', 'plain'] : ['plain']) as Array<'auto' | 'plain'>;

describe.skipIf(skip !== undefined).each(shells)('PythonKernel in a bwrap sandbox (shell: %s)', (shell) => {
  let sandbox: Sandbox;
  const kernels: PythonKernel[] = [];
  const start = async () => {
    const kernel = await PythonKernel.start(sandbox, { shell });
    kernels.push(kernel);
    return kernel;
  };
  beforeAll(async () => {
    sandbox = await createBwrapProvider().create();
  });
  afterEach(async () => {
    await Promise.all(kernels.splice(0).map((k) => k.close()));
  });
  afterAll(() => sandbox.close());

  it('returns the last expression, stdout and stderr, and keeps state', async () => {
    const kernel = await start();
    expect(kernel.mode).toBe(shell === 'auto' ? 'ipython' : 'plain');
    expect(await kernel.run('1+1')).toEqual({ status: 'ok', stdout: '', stderr: '', result: '2', error: null });
    const cell = await kernel.run('import sys\nx = 21\nprint("out")\nprint("err", file=sys.stderr)\nx * 2');
    expect(cell).toMatchObject({ status: 'ok', stdout: 'out\n', stderr: 'err\n', result: '42' });
    expect((await kernel.run('x')).result).toBe('21');
    expect((await kernel.run('y = 1')).result).toBeNull();
    expect((await kernel.run('None')).result).toBeNull();
  });

  it("answers a cell's value by its repr, without running the object's rich formatters", async () => {
    const kernel = await start();
    const cell = await kernel.run(
      "class A:\n    def _repr_html_(self):\n        print('html formatter ran')\n        return '<b>A</b>'\n    def __repr__(self):\n        return 'A()'\nA()",
    );
    expect(cell).toEqual({ status: 'ok', stdout: '', stderr: '', result: 'A()', error: null });
    // the value is still the shell's last result
    expect((await kernel.run(shell === 'auto' ? '_' : 'None')).result).toBe(shell === 'auto' ? 'A()' : null);
  });

  it('captures output of subprocesses too', async () => {
    const kernel = await start();
    const result = await kernel.run('import os\n_ = os.system("echo from-a-child")');
    expect(result.stdout).toBe('from-a-child\n');
  });

  it('reports errors with a traceback that shows the cell, not the kernel', async () => {
    const kernel = await start();
    const error = await kernel.run('def f():\n    return 1/0\nf()');
    expect(error.status).toBe('error');
    expect(error.error?.ename).toBe('ZeroDivisionError');
    expect(error.error?.traceback).toContain('return 1/0');
    expect(error.error?.traceback).not.toContain('rollserve_kernel');
    const syntax = await kernel.run('def f(:');
    expect(syntax.error?.ename).toBe('SyntaxError');
    // output printed before the error is kept
    expect((await kernel.run('print("partial")\nraise ValueError("boom")')).stdout).toBe('partial\n');
  });

  it('interrupts a cell at the time limit and keeps the variables', async () => {
    const kernel = await start();
    await kernel.run('kept = "yes"');
    const result = await kernel.run('import time\nprint("started", flush=True)\ntime.sleep(30)', { timeoutMs: 300 });
    expect(result.status).toBe('timeout');
    expect(result.error?.ename).toBe('KeyboardInterrupt');
    expect(result.stdout).toBe('started\n');
    expect(result.notice).toContain('variables are kept');
    expect((await kernel.run('kept')).result).toBe("'yes'");
  });

  it('restarts a kernel that swallows KeyboardInterrupt, and says the state is gone', async () => {
    const kernel = await start();
    await kernel.run('lost = 1');
    const result = await kernel.run('import time\nwhile True:\n    try:\n        time.sleep(1)\n    except KeyboardInterrupt:\n        pass', { timeoutMs: 200 });
    expect(result.status).toBe('timeout');
    expect(result.notice).toContain('restarted');
    expect((await kernel.run('lost')).error?.ename).toBe('NameError');
    expect((await kernel.run('2+2')).result).toBe('4');
  });

  it('survives the interpreter exiting', async () => {
    const kernel = await start();
    const exited = await kernel.run('import os\nos._exit(3)');
    expect(exited.status).toBe('error');
    expect(exited.notice).toContain('restarted');
    expect((await kernel.run('1+2')).result).toBe('3');
  });

  it('serves over a Unix socket in the sandbox socket directory', async () => {
    await start();
    const listing = await sandbox.exec(`ls ${sandbox.socketDir.sandbox}`);
    expect(listing.stdout).toMatch(/py-[0-9a-f]+\.sock/);
  });
});
