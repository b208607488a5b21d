import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createServer, type Server } from 'node:net';
import { runScriptAsNobody } from '@rollserve/testing';
import { afterAll, describe, expect, it } from 'vitest';
import { createCodeRunner, globalTimeoutSecs, type Submission } from './runner.ts';

// Real bwrap sandboxes (the platform default). Per-test limits are 1 s to keep the suite short.
const runner = createCodeRunner({ concurrency: 4, warm: 2 });
afterAll(() => runner.close());

const stdio = (code: string, inputs: string[], outputs: string[], timeoutSecs = 1): Submission => ({
  code,
  inputs,
  outputs,
  fnName: null,
  timeoutSecs,
});
const call = (code: string, fnName: string, inputs: string[], outputs: string[]): Submission => ({
  code,
  inputs,
  outputs,
  fnName,
  timeoutSecs: 1,
});

/** This process's fork servers, their graders and the graders' channel processes (alive or not yet reaped). */
function forkServers(): number[] {
  const parentOf = (pid: number): number => Number(readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]!.split(' ')[1]);
  const pids = readdirSync('/proc').filter((name) => /^\d+$/.test(name)).map(Number);
  const ours = (pid: number): boolean => {
    try {
      for (let at = pid; at > 1; at = parentOf(at)) if (at === process.pid) return true;
    } catch {
      return false;
    }
    return false;
  };
  return pids.filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes('rollserve_forkserver') && ours(pid);
    } catch {
      return false;
    }
  });
}

describe('grading as code_gen does it (stdin/stdout)', () => {
  it('passes on stripped-line equality and stops at the first failure with its metadata', async () => {
    const code = 'n = int(input())\nprint(n * 2, "  ")';
    const { result, metadata } = await runner.run(stdio(code, ['2\n', '3\n', '4\n'], ['4\n', '7\n', '8\n']));
    expect(result).toEqual([true, -2]);
    expect(metadata).toEqual({
      output: '6   \n',
      inputs: '3\n',
      expected: '7\n',
      error_code: -2,
      error_message: 'Wrong answer at output_line_idx=0: 6 != 7',
    });
  });

  it('compares numbers as Decimals, with 1e-6 tolerance only for fractional tokens', async () => {
    const code = 'print(input())';
    const ok = await runner.run(stdio(code, ['1.0000001 2e0', '0.5'], ['1.0 2', '0.50']));
    expect(ok.result).toEqual([true, true]);
    const ints = await runner.run(stdio(code, ['100000000000000001'], ['100000000000000000']));
    expect(ints.result).toEqual([-2]);
  });

  it('reports a different line count as mismatched output length', async () => {
    const { result, metadata } = await runner.run(stdio('print(1)\nprint()\nprint(2)', [''], ['1\n2\n']));
    expect(result).toEqual([-2]);
    expect(metadata!.error_message).toBe('Wrong answer: mismatched output length');
  });

  it('wraps the program in a function: a __main__ guard runs, exit() ends one test only', async () => {
    const code = 'import sys\ndef main():\n    print(sys.stdin.read().split()[0])\n    exit()\n    print("after")\nif __name__ == "__main__":\n    main()';
    const { result, metadata } = await runner.run(stdio(code, ['a b', 'c'], ['a', 'c']));
    expect(result).toEqual([true, true]);
    expect(Object.keys(metadata!)).toEqual(['execution time']);
  });

  it('mocks sys.stdin (readline, iteration, buffer) but not fd 0, as code_gen does', async () => {
    const lines = await runner.run(stdio('import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1])', ['ab\ncd\n'], ['ba\ndc']));
    expect(lines.result).toEqual([true]);
    const buffer = await runner.run(stdio('import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))', ['1 2 3'], ['6']));
    expect(buffer.result).toEqual([true]);
    // `from builtins import *` in the preamble binds the real open: open(0) reads the empty fd 0.
    const fd0 = await runner.run(stdio('print(open(0).read().strip() or "empty")', ['5'], ['5']));
    expect(fd0.result).toEqual([-2]);
    expect(fd0.metadata!.output).toBe('empty\n');
  });

  it('gives -4 with error and traceback for a runtime error, -3 for a per-test time-out', async () => {
    const crash = await runner.run(stdio('print(int(input()) // 0)', ['1', '2'], ['0', '0']));
    expect(crash.result).toEqual([-4]);
    expect(crash.metadata).toMatchObject({ error: "ZeroDivisionError('integer division or modulo by zero')", error_code: -4, error_message: 'Runtime Error' });
    expect(crash.metadata!.traceback).toContain('ZeroDivisionError');
    const eof = await runner.run(stdio('input()\ninput()', ['only one line'], ['']));
    expect(eof.result).toEqual([-4]);
    expect(eof.metadata!.error).toBe("EOFError('EOF when reading a line')");
    const slow = await runner.run(stdio('while True:\n    pass', ['1', '2'], ['1', '2']));
    expect(slow.result).toEqual([-3]);
    expect(slow.metadata).toEqual({ error: 'TimeoutException()', error_code: -3, error_message: 'Time Limit Exceeded', inputs: '1', expected: '1' });
  });

  it('gives [-4] with "Error during testing" when the program does not compile', async () => {
    const { result, metadata } = await runner.run(stdio('def broken(:\n    pass', ['1'], ['1']));
    expect(result).toEqual([-4]);
    expect(metadata).toEqual({ error_code: -4, error_message: 'Error during testing: invalid syntax (<string>, line 1)' });
  });

  it('gives every test -1 and null metadata on a global time-out ((t + 1) · n + 5 s)', async () => {
    expect(globalTimeoutSecs(10, 3)).toBe(38);
    const stubborn = 'while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass';
    const { result, metadata } = await runner.run(stdio(stubborn, ['1'], ['1']));
    expect(result).toEqual([-1]);
    expect(metadata).toBeNull();
  }, 15_000);

  it('passes with no tests at all, as all([]) does', async () => {
    expect((await runner.run(stdio('print(1)', [], []))).result).toEqual([]);
  });
});

describe('grading as code_gen does it (call-based)', () => {
  it('calls a Solution instance method with the JSON-decoded lines as arguments', async () => {
    const code = 'class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n                return (seen[target - x], i)\n            seen[x] = i';
    const { result, metadata } = await runner.run(call(code, 'twoSum', ['[2,7,11,15]\n9', '[3,2,4]\n6'], ['[0,1]', '[1,2]']));
    expect(result).toEqual([true, true]);
    expect(typeof metadata!['execution time']).toBe('number');
  });

  it('records a wrong answer as false, then stops', async () => {
    const { result, metadata } = await runner.run(call('def f(a):\n    return a + 1', 'f', ['1', '2', '3'], ['2', '4', '4']));
    expect(result).toEqual([true, false]);
    expect(metadata).toEqual({ output: '3', inputs: '[2]', expected: '4', error_code: -2, error_message: 'Wrong Answer' });
  });

  it('shows the arguments as the call left them in the metadata (in-place changes included)', async () => {
    const { result, metadata } = await runner.run(call('def f(nums):\n    nums.sort()\n    return nums[-1]', 'f', ['[3,1,2]'], ['2']));
    expect(result).toEqual([false]);
    expect(metadata).toEqual({ output: '3', inputs: '[[1, 2, 3]]', expected: '2', error_code: -2, error_message: 'Wrong Answer' });
  });

  it('accepts close floats (allclose) and equal JSON', async () => {
    const { result } = await runner.run(call('def f(x):\n    return x / 3 * 3 + 1e-9', 'f', ['1.0', '2'], ['1.0', '2']));
    expect(result).toEqual([true, true]);
  });

  it('fails the whole run with [-4] when the function is missing', async () => {
    const { result, metadata } = await runner.run(call('def g():\n    pass', 'f', ['1'], ['1']));
    expect(result).toEqual([-4]);
    expect(metadata!.error_message).toBe('Error during testing: cannot unpack non-iterable NoneType object');
  });
});

describe('hostile submissions: reward 0, host and server unharmed', () => {
  it('an infinite loop at module level is cut by the compile alarm', async () => {
    const { result } = await runner.run(call('while True:\n    pass\ndef f(x):\n    return x', 'f', ['1'], ['1']));
    expect(result).toEqual([-4]);
  });

  it('a fork bomb is capped by the process limit and ended with its sandbox', async () => {
    const bomb = 'import posix\nwhile True:\n    try:\n        posix.fork()\n    except OSError:\n        pass';
    const { result } = await runner.run(stdio(bomb, ['1'], ['1']));
    expect(result).toEqual([-3]);
    expect((await runner.run(stdio('print(7)', [''], ['7']))).result).toEqual([true]);
  });

  it('sees neither host files nor the service environment', async () => {
    process.env.ROLLSERVE_CODE_TEST_SECRET = 'hunter2-secret';
    try {
      const probe = [
        'import os',
        'print(any(os.path.exists(p) for p in ["/root", "/home", "/work", "/proc/1/environ"] if not p.startswith("/proc")))',
        'print(any("hunter2" in v for v in os.environ.values()))',
        'print(os.getuid() if hasattr(os, "getuid") else 0, open("/proc/1/cmdline").read().split("\\0")[0])',
      ].join('\n');
      const { result, metadata } = await runner.run(stdio(probe, [''], ['host files and secrets visible']));
      expect(result).toEqual([-2]);
      expect(metadata!.output).toMatch(/^False\nFalse\n\d+ bwrap\n$/); // pid 1 is the sandbox's own init
    } finally {
      delete process.env.ROLLSERVE_CODE_TEST_SECRET;
    }
  });

  it('has no network, not even to the host loopback', async () => {
    let connections = 0;
    const server: Server = createServer((socket) => {
      connections++;
      socket.end('pwned\n');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as { port: number }).port;
    try {
      const code = `import socket\ns = socket.create_connection(("127.0.0.1", ${port}), timeout=0.5)\nprint(s.recv(10).decode().strip())`;
      const { result, metadata } = await runner.run(stdio(code, [''], ['pwned']));
      expect(result).toEqual([-4]);
      expect(String(metadata!.error)).toMatch(/ConnectionRefused|Network is unreachable|OSError/);
      expect(connections).toBe(0);
    } finally {
      server.close();
    }
  });

  it('100 MB of output is a wrong answer with truncated metadata; floods of fd 1 and files are dropped or capped', async () => {
    // ample time limits: these are about output size, and a loaded machine is slow, not wrong
    const flood = await runner.run(stdio('print("x" * 100_000_000)', [''], ['y'], 30));
    expect(flood.result).toEqual([-2]);
    expect(String(flood.metadata!.output).length).toBeLessThan(400);
    const raw = await runner.run(stdio('import posix\nfor _ in range(20):\n    posix.write(1, b"x" * 5_000_000)\nprint(1)', [''], ['1'], 30));
    expect(raw.result).toEqual([true]);
    const file = await runner.run(stdio('f = open("big.bin", "wb")\nf.write(b"x" * 100_000_000)\nf.close()\nprint(1)', [''], ['1'], 30));
    expect(file.result).toEqual([-4]);
    expect(String(file.metadata!.error)).toContain('File too large');
  });

  it('killing its parent gives -1s, quickly; killing every process it can reaches nothing of the grading', async () => {
    const guarded = await runner.run(stdio('import os\nos.kill(os.getppid(), 9)', [''], ['']));
    expect(guarded.result).toEqual([-4]); // os.kill is None, as in code_gen's reliability_guard
    const parent = await runner.run(stdio('import os, posix\nposix.kill(os.getppid(), 9)\nprint(1)', [''], ['1']));
    expect(parent.result).toEqual([-1]);
    // kill(-1): every process it may signal, which the pid namespace limits to its own sandbox,
    // where no part of the grading runs (the grader is on the host): its own answer is graded,
    // unless the sandbox's end (its agent killed, its init ends) cuts the run first: no reward
    const everyone = await runner.run(stdio('import posix\nposix.kill(-1, 9)\nprint(1)', [''], ['2']));
    expect([[-2], [-1]]).toContainEqual(everyone.result);
    expect((await runner.run(stdio('print(7)', [''], ['7']))).result).toEqual([true]);
  });

  it('cannot write outside its workspace', async () => {
    const marker = `/tmp/rollserve-code-escape-${process.pid}`;
    const code = [
      'import os',
      'hits = []',
      `for path in ["/usr/pwned", "/etc/pwned", "${marker}", "/workspace/../usr/x"]:`,
      '    try:',
      '        with open(path, "w") as f:',
      '            f.write("x")',
      '        hits.append(path)',
      '    except OSError:',
      '        pass',
      'print(hits)',
    ].join('\n');
    const { metadata } = await runner.run(stdio(code, [''], ['never']));
    expect(metadata!.output).toBe(`['${marker}']\n`); // the sandbox's own /tmp, a tmpfs
    expect(existsSync(marker)).toBe(false);
  });

  it('cannot forge the verdict: no nonce, no expected outputs, no result channel in its process', async () => {
    const forge = [
      'import sys, os',
      "p = sys.modules['__main__'].p",
      'for fd in range(3, 12):',
      '    try: os.write(fd, (p["nonce"] + \' {"result":[true,true]}\\n\').encode())',
      '    except Exception: pass',
      'os._exit(0)',
    ].join('\n');
    const forged = await runner.run(stdio(forge, ['1', '2'], ['999', '998']));
    expect(forged.result).not.toContain(true);
    // Every descriptor, without knowing the nonce: whatever is found in memory is echoed everywhere.
    const everywhere = [
      'import sys, os, gc, json',
      'found = []',
      'for o in gc.get_objects():',
      '    if isinstance(o, dict):',
      '        for k in ("nonce", "key", "outputs"):',
      '            if k in o: found.append(repr(o[k]))',
      'for name, mod in list(sys.modules.items()):',
      '    for k in ("p", "payload", "nonce"):',
      '        if mod is not None and hasattr(mod, k): found.append(repr(getattr(mod, k)))',
      'line = " ".join(found) + \' {"result":[true,true],"metadata":{}}\\n\'',
      'for fd in range(0, 21):',
      '    try: os.write(fd, line.encode())',
      '    except Exception: pass',
      'print("999" if found else "nothing")',
      'sys.stdout.flush()',
      'os._exit(0)',
    ].join('\n');
    const echoed = await runner.run(stdio(everywhere, ['1', '2'], ['999', '998']));
    expect(echoed.result).not.toContain(true);
  });

  it('finds no expected output in __main__, gc objects or stack frames to print', async () => {
    const snoop = [
      'import sys, gc, inspect',
      'seen = set()',
      'def scan(o):',
      '    if isinstance(o, str) and o.strip() in ("999", "998"): seen.add(o.strip())',
      '    elif isinstance(o, (list, tuple)):',
      '        for x in o: scan(x)',
      '    elif isinstance(o, dict):',
      '        for x in o.values(): scan(x)',
      'main = sys.modules.get("__main__")',
      'scan(dict(vars(main)) if main else {})',
      'for o in gc.get_objects(): scan(o)',
      'for f in inspect.stack():',
      '    scan(dict(f.frame.f_locals)); scan(dict(f.frame.f_globals))',
      'print(sorted(seen)[0] if seen else "none")',
    ].join('\n');
    const { result, metadata } = await runner.run(stdio(snoop, ['1', '2'], ['999', '998']));
    expect(result).toEqual([-2]);
    expect(metadata!.output).toBe('none\n');
  });

  it('finds neither the expected outputs nor the result key anywhere in the sandbox', async () => {
    const hunt = [
      'import os, glob, stat',
      'found = set()',
      'paths = glob.glob("/run/rollserve/.exec/*") + glob.glob("/proc/[0-9]*/fd/*") + glob.glob("/proc/[0-9]*/environ")',
      'paths += [f"/proc/{os.getppid()}/mem", "/dev/stdin", "/proc/self/fd/0"]',
      'for path in paths:',
      '    try:',
      '        if not stat.S_ISREG(os.stat(path).st_mode): continue',
      '        data = open(path, "rb").read(10 ** 7)',
      '    except Exception:',
      '        continue',
      '    if b"needle-7f3a" in data: found.add("needle-7f3a")',
      'print(" ".join(sorted(found)) or "none")',
    ].join('\n');
    const { result, metadata } = await runner.run(stdio(hunt, ['1'], ['needle-7f3a']));
    expect(result).toEqual([-2]);
    expect(metadata!.output).toBe('none\n');
  });

  it('a returned object that equals everything is a wrong answer (compared in the parent)', async () => {
    const code = 'class Any:\n    def __eq__(self, other):\n        return True\n    def __float__(self):\n        return 998.0\ndef f(x):\n    return Any()';
    const { result, metadata } = await runner.run(call(code, 'f', ['1'], ['999']));
    expect(result).toEqual([false]);
    expect(metadata!.error_code).toBe(-2);
  });

  it('killing the grading parent or closing stdout early gives no reward', async () => {
    const killer = await runner.run(stdio('import os, posix\nprint(999)\nposix.kill(os.getppid(), 9)', ['1'], ['999']));
    expect(killer.result).toEqual([-1]);
    const closed = await runner.run(stdio('import os, sys\nprint(999)\nsys.stdout.flush()\nos.close(1)\nos.close(2)\nos._exit(0)', ['1'], ['999']));
    expect(closed.result).toEqual([-1]);
    const closedCall = await runner.run(call('import os\ndef f(x):\n    for fd in (0, 1, 2):\n        try:\n            os.close(fd)\n        except OSError:\n            pass\n    return 999', 'f', ['1', '2'], ['999', '998']));
    expect(closedCall.result).toEqual([true, false]);
  });

  it('forges no pass on its channel: a verdict, a crafted frame or garbage is its own output or no result', async () => {
    // what a frame on descriptor 3 looks like is no secret (harness.py): a child that writes one
    // only says what its outputs are, and a verdict is no message the grader takes
    const frame = 'import json, os\ndef frame(m):\n    d = json.dumps(m).encode()\n    return b"%d\\n" % len(d) + d\n';
    const verdict = await runner.run(stdio(`${frame}os.write(3, frame({"t": "verdict", "result": [True, True]}))\nos._exit(0)`, ['1', '2'], ['3', '4']));
    expect(verdict.result).toEqual([-1, -1]);
    const claimed = [
      frame,
      // (the harness has sent "ready" by the time the program runs a test)
      'os.write(3, frame({"t": "output", "output": "999\\n", "time": 0}) + frame({"t": "output", "output": "998\\n", "time": 0}))',
      'os._exit(0)',
    ].join('\n');
    const lies = await runner.run(stdio(claimed, ['1', '2'], ['3', '4']));
    expect(lies.result).toEqual([-2]);
    expect(lies.metadata!.output).toBe('999\n');
    const garbage = await runner.run(stdio('import os\nos.write(3, b"12\\n{not json!!}")\nos.write(3, b"\\xff" * 4096)\nos._exit(0)', ['1'], ['1']));
    expect(garbage.result).not.toContain(true);
  });

  it('a flood, a message too long or a child dying mid-report gives -1s; the grader serves the next run', async () => {
    const flood = await runner.run(stdio('import os\nwhile True:\n    os.write(3, b"9" * 65536)', ['1'], ['1'], 30));
    expect(flood.result).toEqual([-1]);
    const huge = await runner.run(stdio('import os\nos.write(3, b"99999999999999\\n" + b"x" * 65536)\nwhile True:\n    pass', ['1'], ['1'], 30));
    expect(huge.result).toEqual([-1]);
    const half = await runner.run(stdio('import os\nos.write(3, b"40\\n{\\"t\\": \\"rea")\nos._exit(0)', ['1'], ['1']));
    expect(half.result).toEqual([-1]);
    const killed = await runner.run(stdio('import sys, os, posix\nprint(1)\nsys.stdout.flush()\nposix.kill(os.getpid(), 9)', ['1', '2'], ['1', '1']));
    expect(killed.result).toEqual([-1, -1]);
    expect((await runner.run(stdio('print(7)', [''], ['7']))).result).toEqual([true]);
  });

  it('reports outputs past its file-size limit: the channel is a pipe, not a file', async () => {
    const big = 'x'.repeat(20 * 1024 * 1024); // more than maxFileSizeMib (16)
    const { result } = await runner.run(stdio('print("x" * (20 * 1024 * 1024))', [''], [big], 30));
    expect(result).toEqual([true]);
  });

  it('finds no expected output in its own memory while a run of the same problem is being graded', async () => {
    // the same expected output for both: the holder's is with the grader while the scanner runs
    const needle = `needle-7f3a-${Math.random().toString(36).slice(2)}`;
    const scan = [
      'import re',
      'prefix = ("needle-" + "7f3a-").encode()',
      'found = set()',
      'with open("/proc/self/maps") as maps:',
      '    ranges = [line.split()[:2] for line in maps]',
      'with open("/proc/self/mem", "rb", 0) as mem:',
      '    for span, perms in ranges:',
      '        if not perms.startswith("r"): continue',
      '        lo, hi = (int(x, 16) for x in span.split("-"))',
      '        try:',
      '            mem.seek(lo)',
      '            data = mem.read(hi - lo)',
      '        except (OSError, ValueError, OverflowError):',
      '            continue',
      '        for m in re.finditer(re.escape(prefix) + rb"[a-z0-9]{6,}", data):',
      '            found.add(m.group().decode())',
      'print(sorted(found)[0] if found else "none")',
    ].join('\n');
    const holding = runner.run(stdio('import time\ntime.sleep(3)\nprint("none")', [''], [needle], 10));
    // (forked a second later: the holder's expected output has been sent by then)
    const [holder, scanner] = await Promise.all([holding, new Promise((resolve) => setTimeout(resolve, 1000)).then(() => runner.run(stdio(scan, [''], [needle], 10)))]);
    expect(holder.result).toEqual([-2]);
    expect(scanner.result).toEqual([-2]);
    expect(scanner.metadata!.output).toBe('none\n');
    // the scan finds what its process does hold: the test's input
    const control = await runner.run(stdio(scan, [needle], [needle], 10));
    expect(control.result).toEqual([true]);
  });

  it("a flood near the cap held in its grading delays no other run's verdict: innocent runs beside it are graded right, it gets -1s, nothing is left", async () => {
    const before = new Set(forkServers());
    const own = createCodeRunner({ concurrency: 8, warm: 0 });
    // (the harness has sent "ready" by the time the program runs) one message just under the
    // grader's cap (256 MiB + 16x the largest expected), read, copied and decoded on the host:
    // 125 million zeros, a list where an output was due
    const flood = [
      'import os',
      'def put(data):',
      '    while data:',
      '        data = data[os.write(3, data):]',
      'size = 250_000_000',
      "head = b'['",
      'put(b"%d\\n" % size + head)',
      'chunk = b"0," * 32768',
      'left = size - len(head) - 1',
      'while left > len(chunk):',
      '    put(chunk)',
      '    left -= len(chunk)',
      'put(b"0" + b" " * (left - 1) + b"]")',
      'import time',
      'time.sleep(60)',
    ].join('\n');
    const hostile = own.run(stdio(flood, ['1'], ['1'], 30));
    const innocent = (round: number): Promise<Array<Array<boolean | number>>> =>
      Promise.all([
        own.run(stdio('print(int(input()) * 2)', ['2', '3'], ['4', '6'])).then((r) => r.result),
        own.run(stdio('print(int(input()) * 2)', ['2', String(round)], ['4', '0'])).then((r) => r.result),
        own.run(call('def f(x):\n    return [x, (x,)]', 'f', [String(round)], [`[${round}, [${round}]]`])).then((r) => r.result),
      ]);
    // innocent runs beside the hostile one, round after round while its grading goes on
    const rounds: Array<Array<Array<boolean | number>>> = [];
    for (let round = 1; round <= 6; round++) rounds.push(await innocent(round));
    expect(rounds).toEqual(Array.from({ length: 6 }, () => [[true, true], [true, -2], [true]]));
    expect((await hostile).result).toEqual([-1]);
    // every channel's process has ended with its answer: the server and its grader are all that run
    expect(forkServers().filter((pid) => !before.has(pid))).toHaveLength(2);
    await own.close();
  });

  it('leaves no fork server or grader behind once closed', async () => {
    const before = new Set(forkServers());
    const own = createCodeRunner({ concurrency: 2, warm: 0 });
    expect((await own.run(stdio('print(7)', [''], ['7']))).result).toEqual([true]);
    const started = forkServers().filter((pid) => !before.has(pid));
    expect(started.length).toBeGreaterThanOrEqual(2); // the bare server and its grader
    await own.close();
    const alive = (): number[] => started.filter((pid) => existsSync(`/proc/${pid}`) && !readFileSync(`/proc/${pid}/stat`, 'latin1').includes(') Z '));
    for (let i = 0; i < 200 && alive().length > 0; i++) await new Promise((resolve) => setTimeout(resolve, 25));
    expect(alive()).toEqual([]);
  });

  it('grades the same with the service running as an unprivileged user (a fork server that forks twice)', () => {
    if (process.getuid?.() !== 0) return; // the suite runs unprivileged already: the cases above are this one
    const script = [
      `import { createCodeRunner } from ${JSON.stringify(join(import.meta.dirname, 'runner.ts'))};`,
      'const runner = createCodeRunner({ concurrency: 2, warm: 0 });',
      'const run = (code, inputs, outputs, fnName = null) => runner.run({ code, inputs, outputs, fnName, timeoutSecs: 2 }).then((r) => r.result);',
      'const results = [',
      "  await run('print(int(input()) * 2)', ['2', '3'], ['4', '7']),",
      "  await run('def f(x):\\n    return [x, (x,)]', ['1'], ['[1, [1]]'], 'f'),",
      "  await run('import os\\nos.write(3, b\"99999999999999\\\\n\")\\nos._exit(0)', ['1'], ['1']),",
      '];',
      // forked every time, never run the other way (whose grading parent would be its parent in the
      // sandbox): a short program may report before the fork that entered has written its pid
      'const ppids = [];',
      "for (let i = 0; i < 8; i++) ppids.push(...(await run('import os\\nprint(os.getppid())', [''], ['0'])));",
      'results.push(ppids);',
      'await runner.close();',
      'console.log(JSON.stringify({ uid: process.getuid(), results }));',
    ].join('\n');
    const child = runScriptAsNobody(script, 120_000);
    expect(child.stderr).toBe('');
    expect(JSON.parse(child.stdout.trim().split('\n').at(-1)!)).toEqual({ uid: 65534, results: [[true, -2], [true], [-1], Array(8).fill(true)] });
  });

  it('runs out of memory at the limit without harming the server', async () => {
    const { result, metadata } = await runner.run(stdio('x = bytearray(8 * 1024 ** 3)\nprint(1)', [''], ['1']));
    expect(result).toEqual([-4]);
    expect(metadata!.error).toBe('MemoryError()');
  });
});
