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

  it('interrupts a cell that never makes a system call, and one that waits for a child', async () => {
    const kernel = await start();
    await kernel.run('kept = 7');
    const busy = await kernel.run('n = 0\nwhile True:\n    n += 1', { timeoutMs: 300 });
    expect(busy).toMatchObject({ status: 'timeout', error: { ename: 'KeyboardInterrupt' } });
    expect(busy.notice).toContain('variables are kept');
    expect(Number((await kernel.run('n')).result)).toBeGreaterThan(0);
    const waiting = await kernel.run('import subprocess\nsubprocess.run(["sleep", "30"])', { timeoutMs: 300 });
    expect(waiting).toMatchObject({ status: 'timeout', error: { ename: 'KeyboardInterrupt' } });
    expect((await kernel.run('kept * 6')).result).toBe('42');
  });

  it("serves the service's connection alone: a process in the sandbox cannot reach the kernel", async () => {
    const kernel = await start();
    await kernel.run('secret = 42');
    // every kernel socket of the sandbox, this one's included
    const probe = await sandbox.exec(
      [
        'python3 - <<"EOF"',
        'import glob, json, socket',
        `paths = glob.glob("${sandbox.socketDir.sandbox}/py-*.sock")`,
        'print(len(paths), "sockets")',
        'for path in paths:',
        '    s = socket.socket(socket.AF_UNIX)',
        '    s.settimeout(2)',
        '    try:',
        '        s.connect(path)',
        '        s.sendall(json.dumps({"id": 1, "code": "secret"}).encode() + b"\\n")',
        '        print("answered", s.recv(65536))',
        '    except OSError as e:',
        '        print("refused", type(e).__name__)',
        'EOF',
      ].join('\n'),
    );
    expect(probe).toMatchObject({ returnCode: 0, stderr: '' });
    expect(probe.stdout).toMatch(/^[1-9]\d* sockets\n/);
    expect(probe.stdout).not.toContain('answered');
    expect(probe.stdout).toContain('refused');
    // and the service's connection still works
    expect((await kernel.run('secret + 1')).result).toBe('43');
  });

  it("answers once for a cell that forks: the fork, back from the cell, neither answers nor serves", async () => {
    const kernel = await start();
    const forked = await kernel.run('import os\npid = os.fork()\nif pid == 0:\n    print("from the fork")\nelse:\n    os.waitpid(pid, 0)\n    print("from the kernel")\n"child" if pid == 0 else "parent"');
    // the fork's output is the cell's, printed before the kernel's (which waited for it)
    expect(forked).toMatchObject({ status: 'ok', stdout: 'from the fork\nfrom the kernel\n', result: "'parent'" });
    // every later cell is the kernel's, answered once, in order
    for (let i = 0; i < 5; i++) expect((await kernel.run(`${i} * 10`)).result).toBe(String(i * 10));
    // the fork was reaped by the cell
    expect((await kernel.run('pid > 0')).result).toBe('True');
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
