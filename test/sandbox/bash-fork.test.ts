import { readFileSync } from 'node:fs';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { BashSession, bwrapAvailable, createBwrapProvider, type Sandbox, type SandboxSpec } from '@rollserve/core/sandbox';

// The bash tool's shell forked into its sandbox by the provider's spawner of shells (a root service:
// BwrapSandbox.spawnPty, spawner.ts `enter`; before, by the bare kernel fork server), not started
// through node-pty, nsenter and setpriv: the same uid, limits, cgroup and terminal as an entering
// shell, no capability at all, its own session with the terminal as its controlling one, and
// nothing of another sandbox's shell (environment, working directory, functions, history, files,
// processes, the service's or the spawner's descriptors).

const skip = !bwrapAvailable() ? 'bwrap is not installed' : process.getuid?.() !== 0 ? 'shells are forked for a root service only' : undefined;
if (skip !== undefined) console.warn(`[bash fork] skipping: ${skip}`);

/** The shell's pid: known once its fork server has answered, which may come after the shell's first output. */
const pidOf = async (bash: BashSession): Promise<number> => {
  const pty = (bash as unknown as { pty: { pid: number } }).pty;
  while (pty.pid <= 0) await new Promise((resolve) => setTimeout(resolve, 5));
  return pty.pid;
};
/** The pid of the provider's spawner of shells (started at the first shell). */
const shellSpawnerOf = (sandbox: Sandbox): number => (sandbox as unknown as { shellSpawner: () => { pid: number } }).shellSpawner().pid;
/** Until `pid` has ended (the test's own timeout bounds the wait). */
const ended = async (pid: number): Promise<void> => {
  while (alive(pid)) await new Promise((resolve) => setTimeout(resolve, 20));
};
const parentOf = (pid: number): number => Number(readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]!.split(' ')[1]);
const alive = (pid: number): boolean => {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]![0] !== 'Z';
  } catch {
    return false;
  }
};

// what a shell knows of itself: ids, capabilities, limits, cgroup, terminal, session
const PROBE = [
  'grep -E "^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs)" /proc/$$/status',
  'echo "limits $(ulimit -n) $(ulimit -u) $(ulimit -v) $(ulimit -f) $(ulimit -t) $(ulimit -c)"',
  'cat /proc/self/cgroup',
  'echo "tty $(tty) pwd $(pwd) home $HOME term $TERM"',
].join('; ');

describe.skipIf(skip !== undefined)('bash shells forked into their sandboxes', () => {
  const provider = createBwrapProvider();
  const entering = createBwrapProvider({ kernelForkServer: false });
  const open: Array<{ bash?: BashSession; sandbox: Sandbox }> = [];
  const start = async (spec: SandboxSpec = {}, from = provider) => {
    const sandbox = await from.create(spec);
    const entry: { bash?: BashSession; sandbox: Sandbox } = { sandbox };
    open.push(entry);
    entry.bash = await BashSession.start(sandbox);
    return { sandbox, bash: entry.bash };
  };
  afterEach(async () => {
    for (const { bash, sandbox } of open.splice(0)) {
      await bash?.close();
      await sandbox.close();
    }
  });
  afterAll(async () => {
    await Promise.all([provider.close?.(), entering.close?.()]);
  });

  it('is a fork of the spawner with the ids, limits, cgroup, namespaces and terminal of an entering shell, and no capability', async () => {
    const resources = { maxOpenFiles: 48, maxProcesses: 64, memoryMib: 1024 };
    const forked = await start({ resources });
    expect(parentOf(await pidOf(forked.bash))).toBe(shellSpawnerOf(forked.sandbox));
    // the sandbox's namespaces, every one (the exec agent's are the sandbox's)
    const namespaces = 'for n in cgroup ipc mnt net pid pid_for_children user uts; do echo "$n $(readlink /proc/$$/ns/$n)"; done';
    const [shellNs, agentNs] = [(await forked.bash.run(namespaces)).output, (await forked.sandbox.exec(namespaces.replaceAll('$$', 'self'))).stdout];
    expect(shellNs).toBe(agentNs);
    expect(shellNs).toMatch(/^user user:\[\d+\]$/m);
    // the terminal as the bash tool asks for it: no echo, no canonical input, no CR translation
    expect((await forked.bash.run('stty -a | tr " ;" "\\n\\n" | grep -xE -- "-?(echo|icanon|onlcr)" | sort | tr "\\n" " "')).output).toBe('-echo -icanon -onlcr ');
    const before = await start({ resources }, entering);
    const [ours, theirs] = [await forked.bash.run(PROBE), await before.bash.run(PROBE)];
    expect(ours.exitCode, ours.output).toBe(0);
    // the terminal's number differs; an entering shell (setpriv, then exec as uid 65534) keeps
    // the bounding set its user namespace gave it, the fork drops it too (below)
    const same = (text: string) => text.replace(/\/dev\/pts\/\d+/, '/dev/pts/N');
    expect(same(ours.output)).toBe(same(theirs.output));
    expect(ours.output).toMatch(/^Uid:\s+65534\s+65534\s+65534\s+65534$/m);
    expect(ours.output).toMatch(/^limits 48 64 1048576 /m);
    // its own session, which an entering shell's (led by nsenter, outside) is not
    expect((await forked.bash.run('echo "session $(($(ps -o sid= -p $$) == $$))"')).output).toBe('session 1\n');
    for (const set of ['CapInh', 'CapPrm', 'CapEff', 'CapAmb']) expect(ours.output).toMatch(new RegExp(`^${set}:\\s+0+$`, 'm'));
    expect(ours.output).toMatch(/^NoNewPrivs:\s+1$/m);
    expect((await forked.bash.run('grep CapBnd /proc/$$/status')).output).toMatch(/^CapBnd:\s+0+\s*$/m);
  });

  it('gives a shell nothing of another sandbox\'s shell: environment, directory, functions, history, files, processes, descriptors', async () => {
    const a = await start({ env: { ONLY_IN_A: 'a' } });
    const b = await start();
    const planted = await a.bash.run(
      [
        'export SET_IN_A=1',
        'f_in_a() { echo a; }',
        'alias al_in_a=true',
        'echo a > /tmp/a-file; echo a > a-workspace-file',
        '(sleep 1000 &)',
        'history -s planted-history-line',
        'cd /tmp',
      ].join('; '),
    );
    expect(planted.exitCode, planted.output).toBe(0);
    const seen = await b.bash.run(
      [
        'echo "env ${ONLY_IN_A:-none} ${SET_IN_A:-none}"',
        'echo "pwd $(pwd)"',
        'echo "fn $(type -t f_in_a || echo none) $(type -t al_in_a || echo none)"',
        'echo "history $(history | grep -c planted)"',
        'echo "files $(ls /tmp/a-file a-workspace-file 2>/dev/null | wc -l)"',
        'echo "sleep $(ps -e -o comm= | grep -c sleep)"',
      ].join('; '),
    );
    expect(seen.output).toBe('env none none\npwd /workspace\nfn none none\nhistory 0\nfiles 0\nsleep 0\n');
    // every descriptor of the shell is its own terminal: no pidfd of the service, no other master
    const fds = (await b.bash.run('ls -l /proc/$$/fd/ | tail -n +2')).output.trim().split('\n');
    expect(fds.map((line) => line.replace(/^.* (\d+) -> /, '$1 -> ').replace(/\d+$/, 'N'))).toEqual(['0 -> /dev/pts/N', '1 -> /dev/pts/N', '2 -> /dev/pts/N', '255 -> /dev/pts/N']);
    expect(new Set(fds.map((line) => line.split(' -> ')[1])).size).toBe(1);
    // and A still has all of it
    expect((await a.bash.run('echo "$ONLY_IN_A $SET_IN_A $(f_in_a) $(pwd) $(ps -e -o comm= | grep -c sleep)"')).output).toBe('a 1 a /tmp 1\n');
  });

  it('ends with its sandbox, and a closed session leaves no process', async () => {
    const { sandbox, bash } = await start();
    const pid = await pidOf(bash);
    expect((await bash.run('(sleep 1000 &); echo started')).output).toBe('started\n');
    await bash.close();
    await ended(pid);
    expect(alive(pid)).toBe(false);
    const again = await start();
    const inner = await pidOf(again.bash);
    await again.sandbox.close();
    await ended(inner);
    expect(alive(inner)).toBe(false);
    expect((await sandbox.exec('ps -e -o comm= | grep -c bash || true')).stdout).toBe('0\n');
  });

  it('ends a shell whose spawner was killed, keeps its sandbox, and starts the next shell from a new spawner', async () => {
    const { sandbox, bash } = await start();
    const pid = await pidOf(bash);
    const spawner = parentOf(pid);
    expect(spawner).toBe(shellSpawnerOf(sandbox));
    // not the sandboxes' spawner, whose loop waits in every sandbox's cgroup join
    expect(spawner).not.toBe((sandbox as unknown as { spawner: { pid: number } }).spawner.pid);
    process.kill(spawner, 'SIGKILL');
    await ended(spawner);
    await ended(pid);
    expect(alive(pid)).toBe(false);
    // its end reaches the session through the spawner's pipe and the terminal, after the process is gone
    await vi.waitFor(() => expect((bash as unknown as { exited?: unknown }).exited).toBeDefined(), { timeout: 30_000, interval: 20 });
    expect((await bash.run('echo again')).output).toMatch(/new shell\.\]\nagain\n$/);
    expect(parentOf(await pidOf(bash))).not.toBe(spawner);
    expect(parentOf(await pidOf(bash))).toBe(shellSpawnerOf(sandbox));
    expect((await sandbox.exec('echo alive')).stdout).toBe('alive\n');
    // a shell killed during a command: the model is told how it ended
    expect((await bash.run('kill -9 $$')).output).toMatch(/\[The shell was killed by SIGKILL; the next command starts a new shell\.\]$/);
    expect((await bash.run('echo back')).output).toMatch(/new shell\.\]\nback\n$/);
  });
});
