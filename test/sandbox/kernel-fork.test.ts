import { spawn } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { bwrapAvailable, cgroupSupport, createBwrapProvider, PythonKernel, removeStaleSandboxDirs, type Sandbox, type SandboxSpec } from '@rollserve/core/sandbox';
import { runScriptAsNobody } from '@rollserve/testing';
import type { KernelForkServer, KernelForkServers } from '../../packages/core/src/sandbox/bwrap/fork-server.ts';

// Python kernels forked from the provider's fork server (sandbox/bwrap/fork-server.ts): two
// kernels forked from one server share nothing (files, processes, network, environment, Python
// state), each is held to its sandbox's limits and cgroup with no capability left, a sandbox with
// explicit resources is served the same way, and a killed server is replaced and leaves nothing.

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip !== undefined) console.warn(`[kernel fork server] skipping: ${skip}`);

const serversOf = (sandbox: Sandbox): KernelForkServers => (sandbox as unknown as { forkServers: KernelForkServers }).forkServers;
const pidOf = (kernel: PythonKernel): number => (kernel as unknown as { process: { pid: number } }).process.pid;
const statOf = (pid: number): string[] | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
};
const parentOf = (pid: number): number | undefined => {
  const fields = statOf(pid);
  return fields === undefined ? undefined : Number(fields[1]);
};
/** Live (not zombie) children of `pid`. */
const childrenOf = (pid: number): number[] =>
  readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .map(Number)
    .filter((child) => {
      const fields = statOf(child);
      return fields !== undefined && Number(fields[1]) === pid && fields[0] !== 'Z';
    });
const alive = (pid: number): boolean => {
  const fields = statOf(pid);
  return fields !== undefined && fields[0] !== 'Z';
};

describe.skipIf(skip !== undefined)('kernels forked from one fork server', () => {
  const provider = createBwrapProvider();
  const open: Array<{ kernel?: PythonKernel; sandbox: Sandbox }> = [];
  // (kernels with preloaded modules: a provider of their own, whose kernel servers are theirs)
  const preloading = createBwrapProvider();
  const start = async (spec: SandboxSpec = {}, options: { shell?: 'plain'; preload?: string[] } = {}, from = provider) => {
    const sandbox = await from.create(spec);
    const entry: { kernel?: PythonKernel; sandbox: Sandbox } = { sandbox };
    open.push(entry);
    entry.kernel = await PythonKernel.start(sandbox, options);
    return { sandbox, kernel: entry.kernel };
  };
  const server = (sandbox: Sandbox): KernelForkServer => {
    const running = serversOf(sandbox).running().filter((server) => !server.bare);
    expect(running).toHaveLength(1);
    return running[0]!;
  };
  afterEach(async () => {
    for (const { kernel, sandbox } of open.splice(0)) {
      await kernel?.close();
      await sandbox.close();
    }
  });
  afterAll(async () => {
    await provider.close?.();
    await preloading.close?.();
  });

  it('forks IPython kernels that keep magics and rich tracebacks, as a spawned kernel has them', async () => {
    const { sandbox, kernel } = await start();
    expect(kernel.mode).toBe('ipython');
    // a fork: its parent is the fork server (which reaps it), not an nsenter of the service
    expect(parentOf(pidOf(kernel))).toBe(server(sandbox).pid);
    const spawnedProvider = createBwrapProvider({ kernelForkServer: false });
    const spawnedSandbox = await spawnedProvider.create();
    const spawned = await PythonKernel.start(spawnedSandbox);
    try {
      expect(spawned.mode).toBe('ipython');
      for (const cell of ['x = 6 * 7\nx', 'def f():\n    return 1 / 0\nf()', '%time y = sum(range(10))', '!echo shell', 'import os\nos.getcwd(), os.environ["HOME"], os.environ["PWD"]', '_i1', 'x +']) {
        const [forked, baseline] = [await kernel.run(cell), await spawned.run(cell)];
        // %time's figures vary from run to run (IPython writes a tiny one as e.g. `1e+03 ns`)
        const timing = (text: string) => text.replace(/[\d.]+(?:e[+-]?\d+)? [µnm]?s/g, 'T');
        expect({ ...forked, stdout: timing(forked.stdout) }, cell).toEqual({ ...baseline, stdout: timing(baseline.stdout) });
      }
      const traceback = (await kernel.run('def g():\n    raise ValueError("v")\ng()')).error!.traceback;
      expect(traceback).toMatch(/ipython-input-\d+-\w+.*\n.*g\(\)/s);
      expect(traceback).toMatch(/ValueError: v/);
    } finally {
      await spawned.close();
      await spawnedSandbox.close();
      await spawnedProvider.close?.();
    }
  });

  it("keeps the server's anonymous memory in huge pages where the host has them: a fork copies one page-table entry per 2 MiB of it", async (context) => {
    let thp = '';
    try {
      thp = readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8');
    } catch {
      // no transparent huge pages in this kernel
    }
    if (thp === '' || thp.includes('[never]')) return context.skip();
    // (a provider of its own: a server that has served one kernel, whose writes since split some again)
    const fresh = createBwrapProvider();
    try {
      const { sandbox, kernel } = await start({}, {}, fresh);
      expect((await kernel.run('1 + 1')).result).toBe('2');
      const huge = (pid: number): number => Number(/^AnonHugePages:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))?.[1] ?? 0);
      expect(huge(server(sandbox).pid!)).toBeGreaterThan(0);
    } finally {
      for (const { kernel, sandbox } of open.splice(0)) {
        await kernel?.close();
        await sandbox.close();
      }
      await fresh.close?.();
    }
  });

  it('gives two kernels forked from one server nothing of each other: files, processes, network, environment, Python state', async () => {
    const a = await start({ env: { ONLY_IN_A: 'a' } });
    const b = await start();
    expect(server(a.sandbox)).toBe(server(b.sandbox));
    const planted = await a.kernel.run(
      [
        'import os, sys, socket, subprocess, json, types',
        'secret = "a-only"',
        'json.planted = True',
        'sys.modules["planted_module"] = types.ModuleType("planted_module")',
        'os.environ["SET_IN_A"] = "1"',
        'open("/tmp/a-file", "w").write("a")',
        'open("a-workspace-file", "w").write("a")',
        'listener = socket.socket(); listener.bind(("127.0.0.1", 5555)); listener.listen()',
        'sleeper = subprocess.Popen(["sleep", "1000"])',
        'os.getpid(), os.environ["ONLY_IN_A"]',
      ].join('\n'),
    );
    expect(planted.status, JSON.stringify(planted)).toBe('ok');
    const seen = await b.kernel.run(
      [
        'import os, sys, socket, json',
        'listener = socket.socket(); listener.bind(("127.0.0.1", 5555)); listener.listen()',
        'names = set()',
        'for pid in os.listdir("/proc"):',
        '    if pid.isdigit():',
        '        try: names.add(open("/proc/%s/comm" % pid).read().strip())',
        '        except OSError: pass',
        '({',
        '  "secret": "secret" in globals(),',
        '  "json": hasattr(json, "planted"),',
        '  "module": "planted_module" in sys.modules,',
        '  "env": sorted(k for k in os.environ if k in ("ONLY_IN_A", "SET_IN_A")),',
        '  "tmp": os.path.exists("/tmp/a-file"),',
        '  "workspace": os.path.exists("a-workspace-file"),',
        '  "sleep": "sleep" in names,',
        '  "interfaces": sorted(name for _, name in socket.if_nameindex()),',
        '})',
      ].join('\n'),
    );
    expect(seen.status, JSON.stringify(seen)).toBe('ok');
    expect(seen.result).toBe("{'secret': False, 'json': False, 'module': False, 'env': [], 'tmp': False, 'workspace': False, 'sleep': False, 'interfaces': ['lo']}");
    // and A still has all of it
    expect((await a.kernel.run('secret, json.planted, os.path.exists("/tmp/a-file"), sleeper.poll()')).result).toBe("('a-only', True, True, None)");
  });

  it('leaves a kernel no capability, no new privileges, the sandbox uid, its cgroup and the limits a sandbox given explicit resources sets', async () => {
    const resources = { memoryMib: 512, maxProcesses: 40, maxOpenFiles: 100, cpuSeconds: 77, maxFileSizeMib: 3 };
    const { sandbox, kernel } = await start({ resources });
    // the fast path for explicit resources too
    expect(parentOf(pidOf(kernel))).toBe(server(sandbox).pid);
    const status = await kernel.run('print(open("/proc/self/status").read())\nprint(open("/proc/self/limits").read())\nprint(open("/proc/self/cgroup").read())');
    const uid = (await sandbox.exec('id -u')).stdout.trim();
    expect(status.stdout).toMatch(/^CapInh:\s+0+$/m);
    expect(status.stdout).toMatch(/^CapPrm:\s+0+$/m);
    expect(status.stdout).toMatch(/^CapEff:\s+0+$/m);
    expect(status.stdout).toMatch(/^CapBnd:\s+0+$/m);
    expect(status.stdout).toMatch(/^CapAmb:\s+0+$/m);
    expect(status.stdout).toMatch(/^NoNewPrivs:\s+1$/m);
    expect(status.stdout).toMatch(new RegExp(`^Uid:\\s+${uid}\\s+${uid}\\s+${uid}\\s+${uid}$`, 'm'));
    const limit = (name: string) => new RegExp(`^${name}\\s+(\\S+)\\s+(\\S+)`, 'm').exec(status.stdout)?.slice(1);
    expect(limit('Max address space')).toEqual([String(512 * 1024 * 1024), String(512 * 1024 * 1024)]);
    expect(limit('Max processes')).toEqual(['40', '40']);
    expect(limit('Max open files')).toEqual(['100', '100']);
    expect(limit('Max cpu time')).toEqual(['77', '77']);
    expect(limit('Max file size')).toEqual([String(3 * 1024 * 1024), String(3 * 1024 * 1024)]);
    expect(limit('Max core file size')).toEqual(['0', '0']);
    // the limits hold
    expect((await kernel.run('x = bytearray(600 << 20)')).error?.ename).toBe('MemoryError');
    expect((await kernel.run('open("big", "wb").write(b"x" * (4 << 20))')).error?.ename).toMatch(/OSError|File/);
    expect((await kernel.run('fds = [open("/dev/null") for _ in range(200)]')).error?.evalue).toMatch(/Too many open files/);
    // in the sandbox's cgroup namespace, and so in its cgroup
    const cgroups = (sandbox as unknown as { cgroup?: { procsFiles: string[] } }).cgroup;
    if (cgroups !== undefined) {
      expect(status.stdout).toMatch(/^0::\/$/m);
      for (const file of cgroups.procsFiles) expect(readFileSync(file, 'utf8').split('\n')).toContain(String(pidOf(kernel)));
    }
  });

  it('replaces a killed fork server: its kernels live on in their sandboxes, and nothing is left once they close', async () => {
    const first = await start();
    const old = server(first.sandbox);
    const oldPid = old.pid!;
    const oldKernel = pidOf(first.kernel);
    process.kill(oldPid, 'SIGKILL');
    await old.ended;
    // the kernel it forked still answers
    expect((await first.kernel.run('21 * 2')).result).toBe('42');
    const second = await start();
    const replacement = server(second.sandbox);
    expect(replacement.pid).not.toBe(oldPid);
    expect((await second.kernel.run('21 * 2')).result).toBe('42');
    // a kernel forked by the dead server ends with its close (by pid, checked to be it still)
    await first.kernel.close();
    await first.sandbox.close();
    expect(alive(oldKernel)).toBe(false);
    const secondKernel = pidOf(second.kernel);
    await second.kernel.close();
    await second.sandbox.close();
    expect(alive(secondKernel)).toBe(false);
    // the server reaped its kernel and the fork that entered the sandbox: no child left
    for (let i = 0; i < 100 && childrenOf(replacement.pid!).length > 0; i++) await new Promise((resolve) => setTimeout(resolve, 20));
    expect(childrenOf(replacement.pid!)).toEqual([]);
    const closing = createBwrapProvider();
    const sandbox = await closing.create();
    const kernel = await PythonKernel.start(sandbox);
    const serverPid = server(sandbox).pid!;
    const kernelPid = pidOf(kernel);
    await closing.close?.();
    // the provider's close ends its server; the sandbox's close, its kernel
    expect(alive(serverPid)).toBe(false);
    await sandbox.close();
    expect(alive(kernelPid)).toBe(false);
  });

  it('leaves nothing when the service is SIGKILLed: the fork server and its kernels die with it', async () => {
    const script = [
      `import { createBwrapProvider } from ${JSON.stringify(join(import.meta.dirname, '../../packages/core/src/sandbox/index.ts'))};`,
      `import { PythonKernel } from ${JSON.stringify(join(import.meta.dirname, '../../packages/core/src/tools/python.ts'))};`,
      'const provider = createBwrapProvider();',
      'const sandbox = await provider.create();',
      'const kernel = await PythonKernel.start(sandbox);',
      'console.log(JSON.stringify({ server: sandbox.forkServers.running()[0].pid, kernel: kernel.process.pid, id: sandbox.id }));',
      'setInterval(() => {}, 1000);',
    ].join('\n');
    const maker = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: join(import.meta.dirname, '../..'),
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const line = await new Promise<string>((resolve, reject) => {
      let out = '';
      maker.stdout!.on('data', (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes('\n')) resolve(out.split('\n')[0]!);
      });
      maker.once('exit', (code) => reject(new Error(`maker exited with ${code}`)));
    });
    const { server, kernel, id } = JSON.parse(line) as { server: number; kernel: number; id: string };
    expect(alive(server) && alive(kernel)).toBe(true);
    maker.kill('SIGKILL');
    for (let i = 0; i < 100 && (alive(server) || alive(kernel)); i++) await new Promise((resolve) => setTimeout(resolve, 50));
    expect({ server: alive(server), kernel: alive(kernel) }).toEqual({ server: false, kernel: false });
    // its directory is left to the sweep a service or node runs (its maker is gone): swept, not
    // left here. The sweep skips a directory some process still runs in (bwrap's, which die with
    // the spawner a moment after it), and a service sweeps again later: so does this test. Its
    // cgroups go with it (cgroup v1: a memory and a pids one; v2: one).
    let swept: string[] = [];
    for (let i = 0; i < 100 && swept.length === 0; i++) {
      if (i > 0) await new Promise((resolve) => setTimeout(resolve, 50));
      swept = (await removeStaleSandboxDirs({ orphansOnly: true })).filter((path) => path.endsWith(`rollserve-${id}`));
    }
    const groups = swept.filter((path) => path.startsWith('/sys/fs/cgroup/'));
    expect(swept.length - groups.length).toBe(1);
    expect(groups).toHaveLength(cgroupSupport() === 1 ? 2 : cgroupSupport() === 2 ? 1 : 0);
  });

  it('does the same with the service running as an unprivileged user (a server that forks twice)', () => {
    if (process.getuid?.() !== 0) return; // the suite runs unprivileged already: the cases above are this one
    const script = [
      `import { readFileSync } from 'node:fs';`,
      `import { createBwrapProvider } from ${JSON.stringify(join(import.meta.dirname, '../../packages/core/src/sandbox/index.ts'))};`,
      `import { PythonKernel } from ${JSON.stringify(join(import.meta.dirname, '../../packages/core/src/tools/python.ts'))};`,
      'const provider = createBwrapProvider();',
      'const [a, b] = [await provider.create(), await provider.create()];',
      'const [ka, kb] = [await PythonKernel.start(a), await PythonKernel.start(b)];',
      'const ppid = (pid) => Number(readFileSync(`/proc/${pid}/stat`, "latin1").split(") ")[1].split(" ")[1]);',
      'const server = a.forkServers.running()[0].pid;',
      'const forked = [ka, kb].every((k) => ppid(k.process.pid) === server);',
      `await ka.run(${JSON.stringify('secret = 1\nopen("/tmp/a", "w").write("a")')});`,
      `const seen = await kb.run(${JSON.stringify('import os\n("secret" in globals(), os.path.exists("/tmp/a"), all(line.split()[1] == "0" * 16 for line in open("/proc/self/status") if line.startswith("Cap")), os.getuid())')});`,
      'await ka.close(); await kb.close(); await a.close(); await b.close(); await provider.close();',
      'console.log(JSON.stringify({ uid: process.getuid(), forked, mode: ka.mode, seen: seen.result }));',
    ].join('\n');
    const child = runScriptAsNobody(script);
    expect(child.stderr).toBe('');
    const out = JSON.parse(child.stdout.trim().split('\n').at(-1)!) as { uid: number; forked: boolean; mode: string; seen: string };
    // nothing of the other kernel; CapInh, CapPrm, CapEff, CapBnd and CapAmb all zero
    expect(out).toEqual({ uid: 65534, forked: true, mode: 'ipython', seen: '(False, False, True, 65534)' });
  });

  it('runs a program as exec would run `python3 -I -c`, forked from a server without IPython: stdin, output, exit code, limits, time limit', async () => {
    const sandbox = await provider.create({ resources: { memoryMib: 640 } });
    open.push({ sandbox });
    const program = [
      'import sys, os, resource',
      'data = sys.stdin.read()',
      'print(data.upper(), "IPython" in sys.modules, sys.argv, os.getcwd(), os.environ["WHO"])',
      'print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20, file=sys.stderr)',
      'sys.exit(3)',
    ].join('\n');
    const forking = sandbox.forkPython!({ python: 'python3', code: program, stdin: 'payload', env: { WHO: 'me' } });
    expect(forking).toBeDefined();
    const run = await forking!;
    expect(run).toEqual({ stdout: "PAYLOAD False ['-c'] /workspace me\n", stderr: '640\n', returnCode: 3 });
    const forked = serversOf(sandbox).running().filter((server) => server.bare);
    expect(forked).toHaveLength(1);
    // the payload file is gone once the program holds it: nothing else inside reads it
    expect((await sandbox.exec('ls /run/rollserve-in | grep -c "^f" || true')).stdout).toBe('0\n');
    const raised = await sandbox.forkPython!({ python: 'python3', code: 'raise ValueError("v")' })!;
    expect(raised.returnCode).toBe(1);
    expect(raised.stderr).toMatch(/ValueError: v/);
    const slow = await sandbox.forkPython!({ python: 'python3', code: 'import time\ntime.sleep(30)', timeoutMs: 300 })!;
    expect(slow).toMatchObject({ returnCode: 125, errorType: 'timeout' });
    expect((await sandbox.exec('ps -e -o comm= | grep -c python3 || true')).stdout).toBe('0\n');
  });

  it('gives a program a channel to the host function of its preload, outside the sandbox: data only once it runs, the answer ends it', async () => {
    const sandbox = await provider.create();
    open.push({ sandbox });
    const source = [
      'import os, sys',
      'def host(data):',
      '    got = b""',
      '    while not got.endswith(b"."):',
      '        chunk = yield',
      '        if not chunk:',
      '            raise EOFError("the channel ended")',
      '        got += chunk',
      // the grader is no process of the sandbox's: its own pid namespace and uid, no capability
      '    status = open("/proc/self/status").read()',
      '    caps = all(line.split()[1] == "0" * 16 for line in status.splitlines() if line.startswith(("CapPrm", "CapEff")))',
      '    return {"echo": got.decode(), "data": data, "uid": os.getuid(), "caps": caps, "pidns": os.readlink("/proc/self/ns/pid")}',
    ].join('\n');
    const preload = { module: { name: 'rs_channel_host', source, host: 'host' } };
    // the program writes in two parts, then waits: the answer cuts it short
    const program = 'import os, time\nos.write(3, b"hello, ")\nos.write(3, b"host.")\ntime.sleep(60)';
    const run = await sandbox.forkPython!({ python: 'python3', code: program, preload, channel: { data: { k: [1, 2] } } })!;
    const uid = process.getuid?.() === 0 ? 65534 : process.getuid?.();
    expect(run.channel).toEqual({ result: { echo: 'hello, host.', data: { k: [1, 2] }, uid, caps: true, pidns: readlinkSync('/proc/self/ns/pid') } });
    expect(run.returnCode).toBe(137); // ended at the answer, not after its 60 s
    // a channel that ends early: no result, the host function's error
    const closed = await sandbox.forkPython!({ python: 'python3', code: 'import os\nos.write(3, b"half")\nos.close(3)', preload, channel: { data: null } })!;
    // (its answer may come before the program's exit, which it then ends: 0 or 137)
    expect(closed.channel).toEqual({ error: expect.stringContaining('the channel ended') });
    // no host function to take it: no fork (the caller runs it otherwise)
    expect(sandbox.forkPython!({ python: 'python3', code: 'pass', channel: { data: 1 } })).toBeUndefined();
  });

  it("waits for a channel's answer past the program's time limit once the program has ended within it", async () => {
    const sandbox = await provider.create();
    open.push({ sandbox });
    // its grading takes 2.5 s of CPU after the channel's end (so at least that long), the
    // program's whole time limit 1 s: the grading of what it sent is not the program's time
    const source = [
      'import time',
      'def host(data):',
      '    got = b""',
      '    while True:',
      '        chunk = yield',
      '        if not chunk:',
      '            break',
      '        got += chunk',
      '    start = time.process_time()',
      '    while time.process_time() - start < 2.5:',
      '        pass',
      '    return {"got": got.decode(), "data": data}',
    ].join('\n');
    const preload = { module: { name: 'rs_slow_host', source, host: 'host' } };
    const run = await sandbox.forkPython!({ python: 'python3', code: 'import os\nos.write(3, b"done")', preload, channel: { data: 7 }, timeoutMs: 1000 })!;
    expect(run).toMatchObject({ returnCode: 0, channel: { result: { got: 'done', data: 7 } } });
    expect(run.errorType).toBeUndefined();
  });

  it('forks programs from a server per preload: its modules and module there in each, changes to them in one fork seen by no other, random drawn anew', async () => {
    const sandbox = await provider.create();
    open.push({ sandbox });
    const bareServers = () => serversOf(sandbox).running().filter((server) => server.bare).length;
    const before = bareServers();
    const preload = { modules: ['statistics', 'no_such_module_here'], module: { name: 'rs_preloaded', source: 'import random\nstate = []\ndef where():\n    raise ValueError("in the module")', file: 'pre.py' } };
    const program = [
      'import sys, random, traceback',
      'm = sys.modules["rs_preloaded"]',
      'seen = list(m.state); m.state.append(1)',
      'try:',
      '    m.where()',
      'except ValueError:',
      '    tb = traceback.format_exc()',
      'print("statistics" in sys.modules, seen, random.random(), "pre.py" in tb)',
    ].join('\n');
    const runs = [];
    for (let i = 0; i < 2; i++) runs.push(await sandbox.forkPython!({ python: 'python3', code: program, preload })!);
    const lines = runs.map((run) => {
      expect(run).toMatchObject({ stderr: '', returnCode: 0 });
      return run.stdout.trim().split(' ');
    });
    for (const words of lines) expect([words[0], words[1], words[3]]).toEqual(['True', '[]', 'True']);
    expect(lines[0]![2]).not.toBe(lines[1]![2]);
    // one server for the two: a program without the preload is another's, which has none of it
    expect(bareServers()).toBe(before + 1);
    const plain = await sandbox.forkPython!({ python: 'python3', code: 'import sys\nprint("rs_preloaded" in sys.modules, "statistics" in sys.modules)' })!;
    expect(plain.stdout).toBe('False False\n');
    expect(() => sandbox.forkPython!({ python: 'python3', code: 'pass', preload: { modules: ['os; import evil'] } })).toThrow(/bad module name/);
  });

  it("runs a preloaded module's prepare once in its server before any fork; a failing one is ignored, a bad name refused", async () => {
    const sandbox = await provider.create();
    open.push({ sandbox });
    const source = 'import os\nstate = []\ndef warm():\n    state.append(os.getpid())\ndef broken():\n    raise RuntimeError("no warm-up")';
    const program = 'import os, sys\nm = sys.modules["rs_prepared"]\nprint(len(m.state), bool(m.state) and m.state[0] != os.getpid())';
    const warm = { module: { name: 'rs_prepared', source, prepare: 'warm' } };
    const runs = [];
    for (let i = 0; i < 2; i++) runs.push(await sandbox.forkPython!({ python: 'python3', code: program, preload: warm })!);
    // made once, in the server (another process), and found made by each fork
    for (const run of runs) expect(run).toMatchObject({ stdout: '1 True\n', stderr: '', returnCode: 0 });
    const broken = await sandbox.forkPython!({ python: 'python3', code: program, preload: { module: { name: 'rs_prepared', source, prepare: 'broken' } } })!;
    expect(broken).toMatchObject({ stdout: '0 False\n', returnCode: 0 });
    expect(() => sandbox.forkPython!({ python: 'python3', code: 'pass', preload: { module: { name: 'rs_x', source: '', prepare: 'a; b' } } })).toThrow(/bad function name/);
  });

  it('starts a plain kernel from the same server when asked, and spawns one where the environment changes the interpreter', async () => {
    const plain = await start({}, { shell: 'plain' });
    expect(plain.kernel.mode).toBe('plain');
    expect(parentOf(pidOf(plain.kernel))).toBe(server(plain.sandbox).pid);
    const changed = await start({ env: { PYTHONPATH: '/tmp/lib' } });
    expect(parentOf(pidOf(changed.kernel))).not.toBe(server(changed.sandbox).pid);
    expect((await changed.kernel.run('import sys\n"/tmp/lib" in sys.path')).result).toBe('True');
    // another locale (the encodings an interpreter fixes at start): spawned too
    const latin = await start({ env: { LANG: 'C', LC_ALL: 'C' } });
    expect(parentOf(pidOf(latin.kernel))).not.toBe(server(latin.sandbox).pid);
    // a time zone is the fork's own
    const tokyo = await start({ env: { TZ: 'Asia/Tokyo' } });
    expect(parentOf(pidOf(tokyo.kernel))).toBe(server(tokyo.sandbox).pid);
    expect((await tokyo.kernel.run('import time\ntime.strftime("%Z", time.localtime(0))')).result).toBe("'JST'");
  });

  it('forks kernels that ask for preloaded modules from a server per list: imported in each, numpy drawing anew in each fork, in no other kernel', async () => {
    const preload = ['numpy', 'statistics', 'no_such_module_here'];
    const a = await start({}, { preload }, preloading);
    const b = await start({}, { preload }, preloading);
    const other = await start({}, {}, preloading);
    // (neither IPython nor the kernel imports statistics or numpy)
    const probe = 'import sys\n[name in sys.modules for name in ("numpy", "statistics", "no_such_module_here")]';
    expect((await a.kernel.run(probe)).result).toBe('[True, True, False]');
    expect((await other.kernel.run(probe)).result).toBe('[False, False, False]');
    // one server for the two, forked from it; the kernel without the list from another
    const kernelServers = serversOf(a.sandbox).running().filter((server) => !server.bare);
    expect(kernelServers).toHaveLength(2);
    expect(parentOf(pidOf(a.kernel))).toBe(parentOf(pidOf(b.kernel)));
    expect(parentOf(pidOf(other.kernel))).not.toBe(parentOf(pidOf(a.kernel)));
    expect(kernelServers.map((server) => server.pid)).toContain(parentOf(pidOf(a.kernel)));
    // numpy's global generator was seeded once, in the server: each fork draws its own numbers,
    // as a new interpreter would (and so does `random`)
    const draw = 'import numpy, random\n(numpy.random.rand(), numpy.random.randint(1 << 30), random.random())';
    const [drawnA, drawnB] = [(await a.kernel.run(draw)).result, (await b.kernel.run(draw)).result];
    expect(drawnA).toMatch(/^\(0\.\d+, \d+, 0\.\d+\)$/);
    expect(drawnA).not.toBe(drawnB);
    const [na, nb] = [drawnA, drawnB].map((text) => text!.slice(1, -1).split(', '));
    expect(na![0]).not.toBe(nb![0]);
    expect(na![1]).not.toBe(nb![1]);
    // the list is checked before anything starts
    await expect(PythonKernel.start(a.sandbox, { preload: ['os; import evil'] })).rejects.toThrow(/not a module name to preload/);
  });

  it("leaves a kernel whose environment sets a numerical library's thread count to import its preload itself, as it loads them", async () => {
    const preloaded = await start({}, { preload: ['numpy'] }, preloading);
    const own = await start({ env: { OPENBLAS_NUM_THREADS: '1', OMP_NUM_THREADS: '1' } }, { preload: ['numpy'] }, preloading);
    // forked from the server without the list, which imports nothing for it
    expect(parentOf(pidOf(own.kernel))).not.toBe(parentOf(pidOf(preloaded.kernel)));
    const probe = 'import os, sys\n("numpy" in sys.modules, "ROLLSERVE_PYTHON_PRELOAD" in os.environ, os.environ["OPENBLAS_NUM_THREADS"])';
    expect((await own.kernel.run(probe)).result).toBe("(True, False, '1')");
    // OpenBLAS sized its threads by the kernel's environment: one thread in all after a product
    // (the server's numpy, loaded without the variable, would start one per core)
    const threads = 'import numpy, os\na = numpy.ones((300, 300))\n_ = a @ a\nlen(os.listdir("/proc/self/task"))';
    expect((await own.kernel.run(threads)).result).toBe('1');
  });

  it('imports the preloaded modules in a spawned kernel as it starts, out of its environment before the first cell', async () => {
    const spawnedProvider = createBwrapProvider({ kernelForkServer: false });
    try {
      const sandbox = await spawnedProvider.create();
      try {
        const kernel = await PythonKernel.start(sandbox, { preload: ['statistics', 'no_such_module_here'] });
        try {
          const seen = await kernel.run('import os, sys\n("statistics" in sys.modules, "no_such_module_here" in sys.modules, "ROLLSERVE_PYTHON_PRELOAD" in os.environ)');
          expect(seen.result).toBe('(True, False, False)');
        } finally {
          await kernel.close();
        }
      } finally {
        await sandbox.close();
      }
    } finally {
      await spawnedProvider.close?.();
    }
  });
});
