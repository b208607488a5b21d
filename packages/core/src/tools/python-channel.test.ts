import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import type { Sandbox } from '../sandbox/types.ts';
import { channelLimitOf } from './channel-limit.ts';
import { PythonKernel } from './python.ts';

// The kernel's socket and pipes are channels from the sandbox into the service: cell code can
// write to them itself (the kernel's own socket object is in its namespace). Whatever it writes,
// the service reads a bounded amount, ends that sandbox, and reports RESOURCE_LIMIT.

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[python channel tests] skipped: ${skip}`);

/** Cell code that finds the kernel's connection to the service and writes `chunk` to it `times` times. */
const toSocket = (chunk: string, times: number) =>
  [
    'import gc, socket',
    `chunk = ${chunk}`,
    'for s in [o for o in gc.get_objects() if isinstance(o, socket.socket)]:',
    '    try:',
    `        for _ in range(${times}):`,
    '            s.sendall(chunk)',
    '    except OSError:',
    '        pass',
  ].join('\n');

const peakRssMb = () => process.resourceUsage().maxRSS / 1024;

describe.skipIf(skip !== undefined)('the Python kernel\'s channels are bounded', () => {
  const open: Array<{ kernel?: PythonKernel; sandbox: Sandbox }> = [];
  const start = async (options: { kernelForkServer?: boolean } = {}) => {
    const sandbox = await createBwrapProvider(options).create();
    const entry: { kernel?: PythonKernel; sandbox: Sandbox } = { sandbox };
    open.push(entry);
    entry.kernel = await PythonKernel.start(sandbox, { shell: 'plain' });
    return { sandbox, kernel: entry.kernel };
  };
  afterEach(async () => {
    for (const { kernel, sandbox } of open.splice(0)) {
      await kernel?.close();
      await sandbox.close();
    }
  });

  it('ends the sandbox with RESOURCE_LIMIT when a cell writes 1.3 GB without a newline to the socket, reading a bounded part of it', async () => {
    const { sandbox, kernel } = await start();
    const before = peakRssMb();
    const result = await kernel.run(toSocket('b"x" * (1 << 20)', 1300));
    expect(result.status).toBe('error');
    expect(result.error?.ename).toBe('ResourceLimit');
    expect(kernel.limitExceeded()).toMatch(/flooded .*longer than/);
    expect(channelLimitOf(sandbox)).toBe(kernel.limitExceeded());
    // the sandbox is ended: its processes are gone, and every later call says why
    expect(await sandbox.status()).toBe('stopped');
    await expect(kernel.run('1+1')).rejects.toMatchObject({ code: 'RESOURCE_LIMIT' });
    // the service never held the flood: its peak RSS grew by far less than 1.3 GB
    expect(peakRssMb() - before).toBeLessThan(200);
  });

  it('ends the sandbox when a cell floods the socket with short lines, replies forged or not', async () => {
    for (const chunk of ['b"\\n" * 65536', 'b\'{"id": 0}\\n\' * 8192', 'b\'{"id": 1, "status": "ok"}\\n\' * 8192']) {
      const { kernel } = await start();
      const result = await kernel.run(toSocket(chunk, 20_000));
      expect(result.error?.ename, chunk).toBe('ResourceLimit');
      expect(kernel.limitExceeded(), chunk).toMatch(/flooded/);
    }
  });

  it('ends the sandbox when a cell floods the kernel\'s own stdout pipe', async () => {
    // a spawned kernel's stdout is a pipe to the service (a forked one's is /dev/null: below)
    const { kernel } = await start({ kernelForkServer: false });
    const code = [
      'import gc, os',
      // the kernel keeps its real stdout as a saved descriptor while a cell's output is captured
      'fds = [fd for o in gc.get_objects() if type(o).__name__ == "Capture" for fd in getattr(o, "saved", [])]',
      'chunk = b"y" * (1 << 20)',
      'for _ in range(64):',
      '    for fd in fds:',
      '        os.write(fd, chunk)',
    ].join('\n');
    const result = await kernel.run(code);
    expect(result.error?.ename).toBe('ResourceLimit');
    expect(kernel.limitExceeded()).toMatch(/stdout and stderr/);
  });

  it('gives a forked kernel no stdout pipe to flood: its own stdout and stderr are /dev/null', async () => {
    const { sandbox, kernel } = await start();
    const result = await kernel.run(
      [
        'import gc, os',
        'fds = [fd for o in gc.get_objects() if type(o).__name__ == "Capture" for fd in getattr(o, "saved", [])]',
        'chunk = b"y" * (1 << 20)',
        'for _ in range(64):',
        '    for fd in fds:',
        '        os.write(fd, chunk)',
        '[os.readlink("/proc/self/fd/%d" % fd) for fd in fds]',
      ].join('\n'),
    );
    expect(result.status).toBe('ok');
    expect(result.result).toBe("['/dev/null', '/dev/null']");
    expect(kernel.limitExceeded()).toBeUndefined();
    expect(await sandbox.status()).toBe('running');
  });

  it('answers huge output, results and exceptions capped, without a limit', async () => {
    const { sandbox, kernel } = await start();
    const printed = await kernel.run('import sys\nsys.stdout.write("a" * 200_000_000)\n"r" * 50_000_000');
    expect(printed.status).toBe('ok');
    expect(printed.stdout.length).toBeLessThan(31_000);
    expect(printed.stdout).toMatch(/^a+\n\[\.\.\. \d+ bytes of output truncated \.\.\.\]\na+$/);
    expect(printed.result!.length).toBeLessThan(31_000);
    const raised = await kernel.run('raise ValueError("e" * 50_000_000)');
    expect(raised.error?.ename).toBe('ValueError');
    expect(raised.error!.evalue.length).toBeLessThan(31_000);
    expect(raised.error!.traceback.length).toBeLessThan(31_000);
    // astral characters escape to 12 bytes each in JSON: the kernel still fits its reply in the bound
    const wide = await kernel.run('print("\\U0001F600" * 29_000)');
    expect(wide.status).toBe('ok');
    expect(kernel.limitExceeded()).toBeUndefined();
    expect((await kernel.run('1+1')).result).toBe('2');
    expect(channelLimitOf(sandbox)).toBeUndefined();
  });

  it('does the same with the service running as an unprivileged user', () => {
    if (process.getuid?.() !== 0) return; // the suite runs unprivileged already: the cases above are this one
    const script = [
      `import { createBwrapProvider } from ${JSON.stringify(join(import.meta.dirname, '../sandbox/index.ts'))};`,
      `import { PythonKernel } from ${JSON.stringify(join(import.meta.dirname, 'python.ts'))};`,
      'const sandbox = await createBwrapProvider().create();',
      "const kernel = await PythonKernel.start(sandbox, { shell: 'plain' });",
      'const before = process.resourceUsage().maxRSS;',
      `const result = await kernel.run(${JSON.stringify(toSocket('b"x" * (1 << 20)', 1300))});`,
      'const grewMb = (process.resourceUsage().maxRSS - before) / 1024;',
      'const status = await sandbox.status();',
      'await kernel.close();',
      'await sandbox.close();',
      'console.log(JSON.stringify({ uid: process.getuid(), ename: result.error?.ename, limit: kernel.limitExceeded(), status, grewMb }));',
    ].join('\n');
    const child = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: join(import.meta.dirname, '../../../..'),
      encoding: 'utf8',
      timeout: 60_000,
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp' },
    });
    expect(child.stderr).toBe('');
    const out = JSON.parse(child.stdout.trim().split('\n').at(-1)!) as { uid: number; ename: string; limit: string; status: string; grewMb: number };
    expect(out).toMatchObject({ uid: 65534, ename: 'ResourceLimit', status: 'stopped' });
    expect(out.limit).toMatch(/flooded/);
    expect(out.grewMb).toBeLessThan(200);
  });
});
