import { spawnSync } from 'node:child_process';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { writeFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { bashTool, defineEnvironment, editorTool, pythonTool } from '@rollserve/core';
import { bwrapAvailable, cgroupSupport, createBwrapProvider, inodeShares } from '@rollserve/core/sandbox';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { startFakePolicy, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';

// A hostile policy, driven through the real rollout service over HTTP, attacks from the tools
// agents use (bash, execute_python, str_replace_editor, background processes), while canaries on
// the host record whatever reaches them. Each probe has a positive control where one is possible,
// so a probe that could never succeed does not pass for containment.

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.log(`hostile suite skipped: ${skip}`);

/** The plan of a rollout: the tool calls it makes, in order, as the first user message. */
interface Plan {
  calls: Array<{ name: string; arguments: Record<string, unknown> }>;
}

const hostile = defineEnvironment({
  name: 'hostile',
  domain: 'agent',
  row: z.object({}).passthrough(),
  tools: { bash: bashTool, execute_python: pythonTool, str_replace_editor: editorTool },
  sandbox: { network: false },
  verify: () => ({ reward: 0 }),
});

// the same, on a bwrap provider without cgroups: it cannot keep a sandbox's total memory
const noCgroups = createBwrapProvider({ cgroups: false });
const hostileNoCgroup = defineEnvironment({
  name: 'hostile-no-cgroup',
  domain: 'agent',
  row: z.object({}).passthrough(),
  tools: { bash: bashTool },
  sandbox: { network: false, provider: () => noCgroups },
  verify: () => ({ reward: 0 }),
});

/** Replays the plan in the first user message, then answers "done". */
function planPolicy(request: { messages: unknown[] }): FakeReply {
  const messages = request.messages as Array<{ role: string; content: string }>;
  const plan = JSON.parse(messages.find((m) => m.role === 'user')!.content) as Plan;
  const done = messages.filter((m) => m.role === 'tool').length;
  const next = plan.calls[done];
  return next === undefined ? 'done' : { toolCalls: [{ name: next.name, arguments: next.arguments }] };
}

interface Result {
  state: string;
  critical_error: string | null;
  filter: boolean;
  error: { code: string; message: string } | null;
  turns: Array<{ tool_calls: Array<{ output: string; status: string }> }>;
}

let fake: FakePolicy;
let server: RolloutServer;
let tcpCanary: Server;
let unixCanary: Server;
let udpCanary: UdpSocket;
const hits: string[] = [];
const abstractName = `rollserve-canary-${randomBytes(4).toString('hex')}`;
const secretFile = join(tmpdir(), `rollserve-canary-${randomBytes(4).toString('hex')}`);

async function rollout(id: string, calls: Plan['calls'], extra: Record<string, unknown> = {}, env = 'hostile'): Promise<Result> {
  const body = {
    id,
    env,
    row: { responses_create_params: { input: JSON.stringify({ calls }) } },
    policy: { model: 'fake-policy' },
    limits: { max_turns: calls.length + 1, tool_timeout_s: 60, ...extra },
  };
  const submitted = await fetch(`${server.url}/v1/rollouts`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  expect(submitted.status, await submitted.clone().text()).toBe(202);
  for (;;) {
    const view = (await (await fetch(`${server.url}/v1/rollouts/${id}`)).json()) as { state: string; result?: Result | null };
    if (view.result !== undefined && view.result !== null) {
      if (process.env.RS_DEBUG) console.log(id, JSON.stringify(view.result.error), JSON.stringify(outputs(view.result)))
      return view.result;
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

const bash = (command: string) => ({ name: 'bash', arguments: { command } });
const python = (code: string) => ({ name: 'execute_python', arguments: { code } });
const outputs = (result: Result) => result.turns.flatMap((turn) => turn.tool_calls.map((call) => call.output));

describe.skipIf(skip !== undefined)('hostile policy through the rollout service', () => {
  beforeAll(async () => {
    tcpCanary = createServer((socket) => {
      hits.push('tcp');
      socket.destroy();
    });
    await new Promise<void>((resolve) => tcpCanary.listen(0, '127.0.0.1', resolve));
    unixCanary = createServer((socket) => {
      hits.push('abstract-unix');
      socket.destroy();
    });
    await new Promise<void>((resolve) => unixCanary.listen(`\0${abstractName}`, resolve));
    udpCanary = createSocket('udp4');
    udpCanary.on('message', () => hits.push('udp'));
    await new Promise<void>((resolve) => udpCanary.bind(0, '127.0.0.1', resolve));
    writeFileSync(secretFile, 'host secret', { mode: 0o644 });
    fake = await startFakePolicy({ script: planPolicy as never });
    server = await startRolloutServer({ environments: [hostile, hostileNoCgroup], llmBackends: [fake.url] });
  });

  afterAll(async () => {
    await server?.close();
    await fake?.close();
    await noCgroups.close?.();
    await new Promise<void>((resolve) => tcpCanary?.close(() => resolve()));
    await new Promise<void>((resolve) => unixCanary?.close(() => resolve()));
    udpCanary?.close();
    rmSync(secretFile, { force: true });
  });

  it('the probes work: the same bash reaches the canary from the host', async () => {
    // positive control for the TCP and UDP probes below (bash's /dev/tcp and /dev/udp)
    const tcp = (tcpCanary.address() as { port: number }).port;
    const udp = udpCanary.address().port;
    const probe = spawnSync('bash', ['-c', `echo x > /dev/tcp/127.0.0.1/${tcp} && echo x > /dev/udp/127.0.0.1/${udp} && echo reached`], { encoding: 'utf8' });
    expect(probe.stdout).toContain('reached');
    // and the canaries record what reaches them
    while (!(hits.includes('tcp') && hits.includes('udp'))) await new Promise((resolve) => setTimeout(resolve, 10));
  });

  it('reaches no host socket and not the service itself, from bash, background jobs and the Python kernel', async () => {
    hits.length = 0;
    const tcp = (tcpCanary.address() as { port: number }).port;
    const udp = udpCanary.address().port;
    const service = new URL(server.url).port;
    const result = await rollout('net-probes', [
      bash(`(echo x > /dev/tcp/127.0.0.1/${tcp}) 2>&1; echo tcp=$?`),
      bash(`(echo x > /dev/udp/127.0.0.1/${udp}) 2>&1; echo udp=$?`),
      bash(`exec 3<>/dev/tcp/127.0.0.1/${service} && printf 'GET /v1/rollouts HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3; echo api=$?`),
      // a background job, still running when the next call comes
      bash(`(sleep 0.2; echo x > /dev/tcp/127.0.0.1/${tcp}) >/dev/null 2>&1 & echo started`),
      python(
        [
          'import socket',
          'out = []',
          `for target in [('127.0.0.1', ${tcp}), ('127.0.0.1', ${service})]:`,
          '    s = socket.socket()',
          '    try:',
          '        s.connect(target); out.append("connected")',
          '    except OSError as e:',
          '        out.append(type(e).__name__)',
          'u = socket.socket(socket.AF_UNIX)',
          'try:',
          `    u.connect("\\0${abstractName}"); out.append("abstract-connected")`,
          'except OSError as e:',
          '    out.append(type(e).__name__)',
          'out.append(socket.gethostname())',
          'print(out)',
        ].join('\n'),
      ),
      bash('sleep 0.5; hostname; cat /proc/sys/kernel/hostname'),
    ]);
    const out = outputs(result);
    expect(out[0]).toMatch(/tcp=1/);
    expect(out[2]).toMatch(/api=1/);
    expect(out[2]).not.toContain('HTTP/1');
    expect(out[4]).not.toContain('connected');
    expect(out[4]).toContain("'sandbox'");
    expect(out[5]).toMatch(/Exit 1[\s\S]*\nsandbox\nsandbox\n$/); // the background probe failed too
    // UDP is fire-and-forget: the canary's silence is the evidence
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(hits).toEqual([]);
  });

  it('keeps rollouts apart: a server one starts is out of the other\'s reach; SysV IPC is private', async () => {
    // rollout A starts a server and proves it reachable from inside A; B then tries the same port
    const port = 20000 + Math.floor(Math.random() * 20000);
    const serve = `python3 -c "import socket,os; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', ${port})); s.listen(); os.write(1, b'up'); [c.close() for c in iter(lambda: s.accept()[0], None)]" > /tmp/server.log 2>&1 &`;
    const a = await rollout('ipc-a', [
      bash(`${serve} sleep 0.5; cat /tmp/server.log; echo`),
      bash(`(echo x > /dev/tcp/127.0.0.1/${port}) 2>&1 && echo own-server-reached`),
      bash('ipcmk -M 4096 >/dev/null && ipcs -m | grep -c 4096'),
    ]);
    expect(outputs(a)[1]).toContain('own-server-reached'); // positive control
    expect(outputs(a)[2]).toMatch(/^1\s/);
    const hostShm = spawnSync('ipcs', ['-m'], { encoding: 'utf8' }).stdout;
    const b = await rollout('ipc-b', [
      bash(`(echo x > /dev/tcp/127.0.0.1/${port}) 2>&1; echo rc=$?`),
      bash('ipcs -m | grep -c 4096; true'),
    ]);
    expect(outputs(b)[0]).toMatch(/rc=1/);
    expect(outputs(b)[1]).toMatch(/^0\s/);
    // the segment A made never showed on the host, and nothing is left of it
    expect(hostShm).toBe(spawnSync('ipcs', ['-m'], { encoding: 'utf8' }).stdout);
  });

  it('sees no host file, writes nothing outside its own tmpfs, and cannot change what the service stages', async () => {
    const result = await rollout('files', [
      bash(`cat ${secretFile} 2>&1; echo rc=$?`),
      { name: 'str_replace_editor', arguments: { command: 'view', path: secretFile } },
      { name: 'str_replace_editor', arguments: { command: 'create', path: '/etc/rollserve-pwned', file_text: 'x' } },
      bash('ls /run/rollserve-in >/dev/null && (echo x > /run/rollserve-in/x) 2>&1; echo rc=$?'),
      python('open("/usr/rollserve-pwned", "w")'),
    ]);
    const out = outputs(result);
    expect(out[0]).toMatch(/No such file[\s\S]*rc=1/);
    expect(out[1]).not.toContain('host secret');
    expect(out[2]).toMatch(/Read-only|read-only|Permission denied|No such file/i);
    expect(out[3]).toMatch(/Read-only file system[\s\S]*rc=1/);
    expect(out[4]).toMatch(/Read-only file system|PermissionError/);
  });

  it('never waits for a key: git log and git commit without -m return at once', async () => {
    const result = await rollout('pager', [
      bash('git init -q r && cd r && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m first && git log --format=%s && git diff HEAD; echo rc=$?'),
      bash('cd /workspace/r && git -c user.email=a@b -c user.name=a commit --allow-empty 2>&1; echo rc=$?'),
    ], { tool_timeout_s: 60 });
    const out = outputs(result);
    expect(result.turns.flatMap((t) => t.tool_calls.map((c) => c.status))).toEqual(['ok', 'ok']);
    expect(out[0]).toContain('first');
    expect(out[0]).toContain('rc=0');
    expect(out[0]).not.toContain('not fully functional');
    expect(out[1]).toMatch(/Aborting commit due to empty commit message[\s\S]*rc=1/);
  });

  it('a flood of the exec agent\'s control channel ends that rollout, not the service', async () => {
    // the agent: `/bin/sh -c <agent script>` (pid 1 is bwrap's own init)
    const find = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -qs '^/bin/sh -c D=' && echo ${p#/proc/}; done | head -1";
    const [flooded, neighbour] = await Promise.all([
      rollout('flood', [
        bash(`agent=$(${find}); echo agent=$agent`),
        // 64 MiB without a newline, into the agent's stdout (a socket: taken with pidfd_getfd)
        bash(
          `python3 -c "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(438, os.pidfd_open($(${find})), 1, 0)
print('got fd', fd, flush=True)
for _ in range(64): os.write(fd, b'a' * (1 << 20))
print('wrote')
"`,
        ),
        { name: 'str_replace_editor', arguments: { command: 'create', path: '/workspace/after.txt', file_text: 'x' } },
      ]),
      rollout('neighbour', [bash('echo fine')]),
    ]);
    expect(outputs(flooded)[0]).toMatch(/agent=\d+/); // the probe found its target
    expect(outputs(flooded)[1]).toMatch(/got fd [1-9]/); // and took the channel
    expect(flooded.error?.code).toBe('RESOURCE_LIMIT');
    expect(flooded.error?.message).toContain('control channel');
    expect(neighbour.critical_error).toBeNull();
    expect(outputs(neighbour)[0]).toBe('fine\n');
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
  });

  it('ends a rollout that fills /tmp or makes too many files, with the reason, as a real 0', async () => {
    const tmp = await rollout('tmp-full', [bash('head -c 64M /dev/zero > /tmp/big; echo rc=$?'), bash('echo never')], { sandbox: { tmp_mib: 16 } });
    expect(outputs(tmp)[0]).toMatch(/No space left on device/);
    expect(tmp.error).toEqual({ code: 'RESOURCE_LIMIT', message: expect.stringContaining('/tmp is full') });
    expect(tmp.filter).toBe(false);
    expect(tmp.turns).toHaveLength(1);
    const inodes = await rollout('inodes', [bash('mkdir d && cd d && for i in $(seq 3000); do : > f$i; done; echo made'), bash('echo never')], {
      sandbox: { max_inodes: 1000 },
    });
    expect(inodes.error?.code).toBe('RESOURCE_LIMIT');
    expect(inodes.error?.message).toMatch(/too many files: workspace holds the 750 files and directories it may \(the sandbox may create 1000/);
    const workspace = await rollout('ws-full', [bash('head -c 64M /dev/zero > big; echo rc=$?')], { sandbox: { workspace_mib: 8 } });
    expect(workspace.error?.message).toContain('workspace is full');
  });

  it('stops one Python call at the file cap, not after it: the kernel refuses the next file', async () => {
    // seen: one call made 60,000 files in a sandbox allowed 20,000 (the cap was sampled afterwards)
    const made = await rollout(
      'inodes-python',
      [
        python(
          [
            'import os',
            'os.makedirs("d", exist_ok=True)',
            'n = 0',
            'try:',
            '    while n < 60000:',
            '        open("d/f%d" % n, "w").close(); n += 1',
            'except OSError as e:',
            '    print("made", n, os.strerror(e.errno))',
            'print("total", sum(len(files) + len(dirs) for _, dirs, files in os.walk(".")))',
          ].join('\n'),
        ),
        bash('echo never'),
      ],
      { sandbox: { max_inodes: 20_000 } },
    );
    const share = inodeShares(20_000).workspace;
    // the directory d takes one of the workspace's 15,000
    expect(outputs(made)[0]).toContain(`made ${share - 1} No space left on device`);
    expect(outputs(made)[0]).toContain(`total ${share}`);
    expect(made.error?.code).toBe('RESOURCE_LIMIT');
    expect(made.error?.message).toContain('too many files');
    expect(made.filter).toBe(false);
    expect(made.turns).toHaveLength(1);
  });

  it('gives every tool an open-files limit: past it, EMFILE', async () => {
    const openAll = 'import os\nfds = []\ntry:\n    while True: fds.append(os.open("/dev/null", os.O_RDONLY))\nexcept OSError as e:\n    print("opened", len(fds), os.strerror(e.errno))';
    const result = await rollout('nofile', [python(openAll), bash(`python3 -c '${openAll}'; ulimit -n`)], { sandbox: { max_open_files: 100 } });
    const out = outputs(result);
    expect(out[0]).toMatch(/opened \d+ Too many open files/);
    expect(Number(/opened (\d+)/.exec(out[0]!)![1])).toBeLessThan(100);
    expect(out[1]).toMatch(/opened \d+ Too many open files\n100\n/);
    expect(result.critical_error).toBeNull();
    // and a default where the task gives none: far below the ~120,000 one sandbox was seen holding
    const plain = await rollout('nofile-default', [python(openAll)]);
    expect(Number(/opened (\d+)/.exec(outputs(plain)[0]!)![1])).toBeLessThan(1024);
  });

  it('refuses a task limit its provider cannot keep: an INIT failure naming it, filtered, never silently dropped', async () => {
    const refused = await rollout('refused', [bash('echo ran')], { sandbox: { total_memory_mib: 256 } }, 'hostile-no-cgroup');
    expect(refused.critical_error).toBe('init');
    expect(refused.filter).toBe(true);
    expect(refused.error?.code).toBe('SANDBOX');
    expect(refused.error?.message).toContain('cannot keep the limit totalMemoryMib (total_memory_mib)');
    expect(refused.turns).toEqual([]);
    // the same provider runs a task that gives no such limit (its default is not applied there)
    const ran = await rollout('not-refused', [bash('echo ran')], {}, 'hostile-no-cgroup');
    expect(outputs(ran)[0]).toBe('ran\n');
  });

  it.skipIf(cgroupSupport() === null)('caps the memory of the sandbox as a whole (several processes together)', async () => {
    // each process stays under its own address-space limit; together they pass the sandbox's
    const hog = `python3 -c "import time; x = bytearray(100 << 20); x[::4096] = b'a' * len(x[::4096]); time.sleep(30)" &`;
    const result = await rollout(
      'memory',
      [bash(`for i in 1 2 3 4; do ${hog} done; sleep 3; echo survived`), bash('echo never')],
      { sandbox: { total_memory_mib: 256, memory_mib: 1024 } },
    );
    expect(result.error?.code).toBe('RESOURCE_LIMIT');
    expect(result.error?.message).toContain('memory limit exceeded');
    expect(result.filter).toBe(false);
  });
});
