import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { availableParallelism, loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import { BashSession, bwrapAvailable, createBwrapProvider, createSandboxProvider, PythonKernel, type Sandbox, type SandboxProvider, type SandboxSpec } from '@rollserve/core/sandbox';
import type { KernelForkServers } from '../../packages/core/src/sandbox/bwrap/fork-server.ts';
import { createCodeRunner } from '@rollserve/env-code';
import { codeKernelStart } from '@rollserve/env-math';
import { problem } from './code-verify.ts';
import { heading, latencyLine, percentile } from './stats.ts';
import { childrenOf } from '../../packages/core/src/sandbox/process.ts';

// Sandbox + Python kernel ready, and sandboxed ten-turn rollouts (issue 28), each beside its floor
// measured in the same run: a bare `bwrap` start, a fork() of a Python that imported IPython, and
// a bare bwrap + sh + python3 doing a rollout's work. CPU is the tree's: the service (this
// process), what it reaped (nsenter, spawned kernels), the spawner with what it reaped (the tmpfs
// prefix, bwrap, the bash tool's shells) and the kernel fork servers with the kernels they reaped; not what
// runs under a bwrap's own pid namespace (the exec agent, a floor's commands), which never
// reaches its maker's cutime (perf's sched_stat_runtime sees it: README). Closing each sandbox
// is in the CPU, not in the wall time.

const TICKS_PER_S = 100;
const PREVIOUS = {
  ready:
    'before the fork servers\' huge pages (2026-11-28 11:50, nearly idle): default spec p50 11.2 ms, 20.8 ms CPU; explicit resources 9.7 ms, 18.5 ms CPU; ' +
    'before warm sandboxes by default (issue 28, quiet host): a fresh sandbox each p50 37.4 ms, 38.5 ms CPU; explicit resources (no pool) ' +
    "p50 38.5 ms; createBwrapProvider({ warm: 'auto' }) p50 22.5 ms. Warm by default, three runs at load 7-15: default spec p50 25.7-31.6 ms, " +
    '34-40 ms CPU; explicit resources p50 26.4-32.2 ms, 30-39 ms CPU; warm 0 p50 34.9-57.7 ms; floor 12.1-21.0 ms',
  rollouts:
    'before the fork servers\' huge pages (2026-11-28 11:50, nearly idle): 42.6-46.5/s against the floor\'s 54.8-58.6 (0.74-0.85×); ' +
    'before the kernel lost its threads (2026-11-28 08:03, load 1-4, one run): 24.6-25.6/s against the floor\'s 35.5-37.5 beside them (0.68-0.70×); ' +
    'before IPython\'s formatters were skipped and the rounds alternated with the floor (2026-11-28, nearly idle, warm: 0, ours then the floor): ' +
    '23.0-31.1/s against the floor\'s 38.1-47.5, 0.54-0.76×; ' +
    'before shells from the spawner (nine runs alternating with it, load 5-10): 13.0-37.8 rollouts/s at 0.58-0.97× the floor beside them ' +
    '(nearly idle before: 22.6/s, 0.67×; before fewer processes per sandbox 10.4-13.2/s; issue 28 first measured 3.4-4.2); by CPU (perf, README ' +
    '"Sandboxes", load 5) 57-63 ms a rollout then, 56-63 now, the floor 45-46',
  verify:
    'before the grading parent left the sandbox (three runs alternating with this one): 36.8-37.8 verifications/s against 53.3-54.5 at load 7-9, 33.6 against 29.2 as the load rose from 7 to 11; ' +
    'perf, six pairs at load 6-11: 28.6-34.4 ms of CPU each against 22.7-30.4 (before the harness warm-up 33-43, before fewer processes per sandbox ' +
    '18.3-25.4/s, before the spawner 11.8-12.4/s; NeMo Gym code_gen 11-12/s, issue 28)',
};
/** NeMo Gym code_gen's verifications/s here (issue 28; it cannot be installed on this machine to run beside). */
const CODE_GEN_PER_S = 11.5;

function treeCpuMs(pids: number[]): number {
  let ticks = 0;
  for (const pid of pids) {
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]!.split(' ');
      ticks += Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
    } catch {
      // ended
    }
  }
  return (ticks / TICKS_PER_S) * 1000;
}

/** The provider's helper processes (kernel fork servers, the spawners of bwrap and of shells), whose CPU and their children's is the service's. */
const serverPids = (provider: SandboxProvider, sandbox: Sandbox | undefined): number[] => {
  const held = sandbox as unknown as
    | { forkServers?: KernelForkServers; spawner?: { pid: number | undefined }; shellSpawner?: () => { pid: number | undefined } | undefined }
    | undefined;
  void provider;
  const spawners = [held?.spawner?.pid, held?.shellSpawner?.()?.pid].filter((pid): pid is number => pid !== undefined);
  return [...(held?.forkServers?.running().map((server) => server.pid!) ?? []), ...spawners];
};

/**
 * A cgroup v1 cpuacct group (root; where the hierarchy is mounted) that this process moves into,
 * so that what it starts from then on is in it too: the sandboxes' processes (their own cgroups
 * are memory and pids ones), the kernels, the spawners, a floor's bwrap and what runs under it.
 * Its usage is then the CPU of the whole tree, which a process's `cutime` misses (what runs under a
 * bwrap's pid namespace is reaped there); kernel threads' work (a namespace's teardown) is not in it,
 * for either side. `close` moves every process in it back to where this process was and removes it.
 */
function cpuacctGroup(): { usageMs(): number; close(): void } | undefined {
  const own = /^\d+:(?:[^:]*,)?cpuacct(?:,[^:]*)?:(.*)$/m.exec(readFileSync('/proc/self/cgroup', 'utf8'))?.[1];
  const mount = ['/sys/fs/cgroup/cpuacct', '/sys/fs/cgroup/cpu,cpuacct'].find((dir) => existsSync(join(dir, 'cpuacct.usage')));
  if (own === undefined || mount === undefined || process.getuid?.() !== 0) return undefined;
  const home = join(mount, own);
  const dir = join(home, `rollserve-bench-${process.pid}`);
  try {
    mkdirSync(dir);
    writeFileSync(join(dir, 'cgroup.procs'), String(process.pid));
  } catch {
    return undefined;
  }
  return {
    usageMs: () => Number(readFileSync(join(dir, 'cpuacct.usage'), 'utf8')) / 1e6,
    close: () => {
      // (a process forked into it as the last were moved: moved in the next pass)
      for (let pass = 0; pass < 10; pass++) {
        for (const pid of readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean)) {
          try {
            writeFileSync(join(home, 'cgroup.procs'), pid);
          } catch {
            // ended meanwhile
          }
        }
        try {
          rmdirSync(dir);
          return;
        } catch {
          // not empty yet
        }
      }
      console.log(`  (the cpuacct group ${dir} could not be removed)`);
    },
  };
}

/** A bare bwrap start: namespaces, the host's /usr read-only, `true`. */
function bareBwrapArgs(command: string[]): string[] {
  return [
    '--unshare-all', '--die-with-parent', '--new-session',
    '--ro-bind', '/usr', '/usr', '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
    '--ro-bind', '/etc', '/etc', '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--',
    ...command,
  ];
}

function run(argv: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'inherit'] });
    child.once('error', reject);
    child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${argv.join(' ')} exited with ${code}`))));
  });
}

async function bwrapFloor(n: number): Promise<{ latencies: number[]; cpuMs: number }> {
  const latencies: number[] = [];
  const cpu0 = treeCpuMs([process.pid]);
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await run(['bwrap', ...bareBwrapArgs(['/bin/true'])]);
    latencies.push(performance.now() - t0);
  }
  return { latencies, cpuMs: (treeCpuMs([process.pid]) - cpu0) / n };
}

/** fork() of a Python that imported IPython's InteractiveShell: the child exits at once. */
function forkFloor(n: number): { p50: number; cpuMs: number } {
  const script = [
    'import os, time, resource, json',
    'import IPython.core.interactiveshell',
    'lat = []',
    'r0 = resource.getrusage(resource.RUSAGE_CHILDREN); s0 = resource.getrusage(resource.RUSAGE_SELF)',
    `for _ in range(${n}):`,
    '    t = time.perf_counter()',
    '    pid = os.fork()',
    '    if pid == 0: os._exit(0)',
    '    os.waitpid(pid, 0)',
    '    lat.append((time.perf_counter() - t) * 1000)',
    'r1 = resource.getrusage(resource.RUSAGE_CHILDREN); s1 = resource.getrusage(resource.RUSAGE_SELF)',
    'cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime + s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime) * 1000',
    'lat.sort()',
    'print(json.dumps({"p50": lat[len(lat) // 2], "cpu": cpu / len(lat)}))',
  ].join('\n');
  const out = spawnSync('python3', ['-c', script], { encoding: 'utf8', env: { PATH: '/usr/bin:/bin' } });
  const parsed = JSON.parse(out.stdout.trim()) as { p50: number; cpu: number };
  return { p50: parsed.p50, cpuMs: parsed.cpu };
}

/** How a kernel is started: by default as the bash-and-Python rollouts start theirs. */
type KernelStart = (sandbox: Sandbox) => Promise<PythonKernel>;

/**
 * math_with_code's kernel (environments/math, its `execute_python`): its modules preloaded and
 * its prelude run, as the environment starts it; or, as before, the prelude importing them.
 */
const mathKernel =
  (preloaded: boolean): KernelStart =>
  async (sandbox) => {
    const kernel = await PythonKernel.start(sandbox, preloaded ? { preload: codeKernelStart.preload } : {});
    const prelude = await kernel.run(codeKernelStart.prelude);
    if (prelude.status !== 'ok') throw new Error(`the prelude answered ${JSON.stringify(prelude)}`);
    return kernel;
  };

/** From nothing to a kernel's first result: sandbox, kernel, `1 + 1`. */
async function sandboxAndKernel(
  provider: SandboxProvider,
  n: number,
  spec: SandboxSpec = {},
  start: KernelStart = (sandbox) => PythonKernel.start(sandbox),
): Promise<{ latencies: number[]; cpuMs: number; mode: string }> {
  const latencies: number[] = [];
  let mode = '';
  let servers: number[] = [];
  // one start first so the fork server exists (and is counted from here on)
  {
    const sandbox = await provider.create(spec);
    const kernel = await start(sandbox);
    await kernel.run('1 + 1');
    servers = serverPids(provider, sandbox);
    await kernel.close();
    await sandbox.close();
  }
  const cpu0 = treeCpuMs([process.pid, ...servers]);
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const sandbox = await provider.create(spec);
    const kernel = await start(sandbox);
    const result = await kernel.run('1 + 1');
    latencies.push(performance.now() - t0);
    if (result.result !== '2') throw new Error(`kernel answered ${JSON.stringify(result)}`);
    mode = kernel.mode;
    await kernel.close();
    await sandbox.close();
  }
  // let the fork server reap the last kernel
  await new Promise((resolve) => setTimeout(resolve, 100));
  return { latencies, cpuMs: (treeCpuMs([process.pid, ...servers]) - cpu0) / n, mode };
}

/** One sandboxed ten-turn rollout: a fresh sandbox, 5 bash calls and 4 Python calls, alternating. */
export async function rollout(provider: SandboxProvider, kernel: { shell?: 'plain' } = {}): Promise<void> {
  const sandbox = await provider.create();
  try {
    const [bash, python] = await Promise.all([BashSession.start(sandbox), PythonKernel.start(sandbox, kernel)]);
    try {
      for (let turn = 0; turn < 9; turn++) {
        if (turn % 2 === 0) {
          const r = await bash.run(`echo turn ${turn} && ls /tmp | wc -l`);
          if (!r.output.includes(`turn ${turn}`)) throw new Error(`bash answered ${JSON.stringify(r)}`);
        } else {
          const r = await python.run(`x = ${turn} * 2\nprint(x)\nx + 1`);
          if (r.result !== String(turn * 2 + 1)) throw new Error(`python answered ${JSON.stringify(r)}`);
        }
      }
    } finally {
      await Promise.all([bash.close(), python.close()]);
    }
  } finally {
    await sandbox.close();
  }
}

/** The floor of a rollout's work: one bare bwrap running sh, five commands and one python3 with four statements. */
export const floorRollout = (): Promise<void> =>
  run([
    'bwrap',
    ...bareBwrapArgs(['/bin/sh', '-c', 'for t in 0 2 4 6 8; do echo turn $t && ls /tmp | wc -l; done; python3 -c "x = 1 * 2\nprint(x)\nx = 3 * 2\nprint(x)"']),
  ]);

export async function closedLoop(concurrency: number, total: number, one: () => Promise<void>): Promise<{ perS: number; wallMs: number }> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < total) {
        next++;
        await one();
      }
    }),
  );
  const wallMs = performance.now() - t0;
  return { perS: (total / wallMs) * 1000, wallMs };
}

export default async function bench(): Promise<void> {
  heading('sandbox + Python kernel ready (issue 28): from nothing to the first execute_python result');
  if (!bwrapAvailable()) {
    console.log('  skipped: bwrap is not installed');
    return;
  }
  const cores = availableParallelism();
  const bwrap = await bwrapFloor(40);
  const fork = forkFloor(200);
  console.log(`  floor: bare bwrap start (true)           ${latencyLine(bwrap.latencies)}  ${bwrap.cpuMs.toFixed(1)} ms CPU each`);
  console.log(`  floor: fork() of a Python with IPython   p50 ${fork.p50.toFixed(2)} ms  ${fork.cpuMs.toFixed(1)} ms CPU each`);

  const forked = createBwrapProvider();
  const spawned = createBwrapProvider({ kernelForkServer: false });
  try {
    // as users get it: the provider the service, a node and NeMo Gym make (bwrap, warm: 'auto')
    const usersGet = createSandboxProvider();
    const explicit: SandboxSpec = { resources: { memoryMib: 1024, maxProcesses: 64 } };
    const floorMs = percentile(bwrap.latencies, 50) + fork.p50;
    const target = (run: { latencies: number[] }) =>
      `(target ≤ 30 ms p50, ≤ 50 ms CPU; ${(percentile(run.latencies, 50) / floorMs).toFixed(2)}× the floor's p50)`;
    let spawnerPid: number | undefined;
    try {
      const ours = await sandboxAndKernel(usersGet, 40);
      const oursExplicit = await sandboxAndKernel(usersGet, 40, explicit);
      const unpooled = await sandboxAndKernel(forked, 40);
      const unpooledExplicit = await sandboxAndKernel(forked, 10, explicit);
      const before = await sandboxAndKernel(spawned, 6);
      console.log(`  floor: the two together                 p50 ${floorMs.toFixed(2)} ms  ${(bwrap.cpuMs + fork.cpuMs).toFixed(1)} ms CPU`);
      console.log(`  default provider (createSandboxProvider(): bwrap, warm 'auto'), forked kernel (${ours.mode}), sandboxes started ahead beside the loop:`);
      console.log(`    default spec                         ${latencyLine(ours.latencies)}  ${ours.cpuMs.toFixed(1)} ms CPU each ${target(ours)}`);
      console.log(`    explicit resources                   ${latencyLine(oursExplicit.latencies)}  ${oursExplicit.cpuMs.toFixed(1)} ms CPU each ${target(oursExplicit)}`);
      console.log(`  no warm sandboxes (warm: 0, the default before), forked kernel:`);
      console.log(`    default spec                         ${latencyLine(unpooled.latencies)}  ${unpooled.cpuMs.toFixed(1)} ms CPU each`);
      console.log(`    explicit resources                   ${latencyLine(unpooledExplicit.latencies)}  ${unpooledExplicit.cpuMs.toFixed(1)} ms CPU each`);
      console.log(`  spawned kernel (${before.mode}), as before     ${latencyLine(before.latencies)}  ${before.cpuMs.toFixed(1)} ms CPU each`);
      console.log(`  previous figure: ${PREVIOUS.ready}`);
      // an environment's kernel as it starts it: math_with_code's prelude puts numpy, scipy and
      // pandas (where installed) in the namespace, and the agent's first result comes after it
      const mathPreloaded = await sandboxAndKernel(usersGet, 40, {}, mathKernel(true));
      const mathImporting = await sandboxAndKernel(usersGet, 20, {}, mathKernel(false));
      console.log(`  math_with_code's kernel (environments/math: ${codeKernelStart.preload.join(', ')} in its namespace), default provider:`);
      console.log(`    preloaded by its fork server         ${latencyLine(mathPreloaded.latencies)}  ${mathPreloaded.cpuMs.toFixed(1)} ms CPU each ${target(mathPreloaded)}`);
      console.log(`    imported in each kernel (before)     ${latencyLine(mathImporting.latencies)}  ${mathImporting.cpuMs.toFixed(1)} ms CPU each`);

      // an idle pool: emptied IDLE_MS (10 s) after its last use, checked every 5 s; its cost is
      // its spares' ends (in the spawner's CPU, which reaps them) and the idle check
      // (a spec in demand: asked for three times, its spare started ahead)
      let probe: Sandbox | undefined;
      for (let i = 0; i < 3; i++) await (probe = await usersGet.create()).close();
      probe = probe!;
      spawnerPid = (probe as unknown as { spawner?: { pid: number | undefined } }).spawner?.pid;
      const idleFrom = performance.now();
      const cpu0 = { self: treeCpuMs([process.pid]), pool: treeCpuMs(spawnerPid === undefined ? [] : [spawnerPid]) };
      let emptiedS: number | undefined;
      while (performance.now() - idleFrom < 16_000) {
        await new Promise((resolve) => setTimeout(resolve, 250));
        if (emptiedS === undefined && spawnerPid !== undefined && childrenOf(spawnerPid).length === 0) emptiedS = (performance.now() - idleFrom) / 1000;
      }
      const cpu1 = { self: treeCpuMs([process.pid]), pool: treeCpuMs(spawnerPid === undefined ? [] : [spawnerPid]) };
      console.log(
        `  idle after use: the default provider's warm sandboxes ended ${emptiedS === undefined ? 'NOT within 16 s' : `${emptiedS.toFixed(1)} s after its last use`}; ` +
          `CPU in 16 s idle: their ends ${(cpu1.pool - cpu0.pool).toFixed(0)} ms, this process ${(cpu1.self - cpu0.self).toFixed(0)} ms (tick: 10 ms)`,
      );
    } finally {
      await usersGet.close?.();
    }

    // where a rollout's CPU goes: each start and its close, alone
    {
      const n = 60;
      // every helper started first (the kernel fork server, the spawner, which reaps the bash
      // tool's shells), so that what each reaps is counted from the first measure on
      const probe = await forked.create();
      await (await PythonKernel.start(probe)).close();
      await (await BashSession.start(probe)).close();
      await probe.close();
      const servers = serverPids(forked, probe);
      const parts: Record<string, number> = {};
      const measure = async (name: string, one: () => Promise<void>) => {
        const cpu0 = treeCpuMs([process.pid, ...servers]);
        for (let i = 0; i < n; i++) await one();
        await new Promise((resolve) => setTimeout(resolve, 100));
        parts[name] = (treeCpuMs([process.pid, ...servers]) - cpu0) / n;
      };
      await measure('sandbox', async () => (await forked.create()).close());
      await measure('sandbox + kernel', async () => {
        const sandbox = await forked.create();
        await (await PythonKernel.start(sandbox)).close();
        await sandbox.close();
      });
      await measure('sandbox + kernel with 4 cells', async () => {
        const sandbox = await forked.create();
        const kernel = await PythonKernel.start(sandbox);
        for (let turn = 1; turn < 9; turn += 2) await kernel.run(`x = ${turn} * 2\nprint(x)\nx + 1`);
        await kernel.close();
        await sandbox.close();
      });
      await measure('sandbox + bash', async () => {
        const sandbox = await forked.create();
        await (await BashSession.start(sandbox)).close();
        await sandbox.close();
      });
      console.log(
        `  CPU of each start with its close: sandbox ${parts.sandbox!.toFixed(1)} ms, kernel ${(parts['sandbox + kernel']! - parts.sandbox!).toFixed(1)} ms ` +
          `(with the ten-turn rollout's 4 cells ${(parts['sandbox + kernel with 4 cells']! - parts.sandbox!).toFixed(1)} ms), ` +
          `bash ${(parts['sandbox + bash']! - parts.sandbox!).toFixed(1)} ms`,
      );
    }

    heading(`sandboxed ten-turn rollouts (fresh sandbox, 5 bash + 4 Python calls), ${cores * 2} at once`);
    console.log(`  load average before: ${loadavg().map((x) => x.toFixed(2)).join(' ')}`);
    const concurrency = cores * 2;
    // as users get it (the provider the service, a node and NeMo Gym make: warm 'auto'), from its
    // first rollout, then rounds alternating with the floor, so that both see the same load.
    // CPU from a cpuacct group, where one can be had (what runs under bwrap's pid namespace never
    // reaches this process's cutime, so the floor's CPU cannot be read as ours is): made before
    // the provider, so that its spawners and fork servers start in it
    const group = cpuacctGroup();
    const tenProvider = createSandboxProvider();
    try {
      const first = await closedLoop(concurrency, 60, () => rollout(tenProvider));
      const rounds: Array<{ ours: number; plain: number; floor: number; cpu?: { ours: number; plain: number; floor: number } }> = [];
      const cpuPerRollout = async (loop: () => Promise<{ perS: number }>): Promise<{ perS: number; cpuMs: number }> => {
        const cpu0 = group?.usageMs() ?? 0;
        const { perS } = await loop();
        return { perS, cpuMs: ((group?.usageMs() ?? 0) - cpu0) / 60 };
      };
      for (let round = 0; round < 3; round++) {
        const ours = await cpuPerRollout(() => closedLoop(concurrency, 60, () => rollout(tenProvider)));
        // the same with kernels without IPython (PythonKernelOptions.shell 'plain'): what IPython costs a rollout
        const plain = await cpuPerRollout(() => closedLoop(concurrency, 60, () => rollout(tenProvider, { shell: 'plain' })));
        const floor = await cpuPerRollout(() => closedLoop(concurrency, 60, floorRollout));
        rounds.push({
          ours: ours.perS,
          plain: plain.perS,
          floor: floor.perS,
          ...(group === undefined ? {} : { cpu: { ours: ours.cpuMs, plain: plain.cpuMs, floor: floor.cpuMs } }),
        });
      }
      const unpooled = await closedLoop(concurrency, 60, () => rollout(forked));
      const tenBefore = await closedLoop(concurrency, 8, () => rollout(spawned));
      const median = (values: number[]) => percentile(values, 50);
      const range = (values: number[]) => `${Math.min(...values).toFixed(1)}-${Math.max(...values).toFixed(1)}`;
      const ratios = rounds.map((r) => r.ours / r.floor);
      console.log(`  default provider, its first 60        ${first.perS.toFixed(1)} rollouts/s`);
      console.log(
        `  default provider, then (3 rounds)     ${range(rounds.map((r) => r.ours))} rollouts/s; ` +
          `the floor beside each ${range(rounds.map((r) => r.floor))}; ours ${ratios.map((x) => x.toFixed(2)).join(', ')}× the floor (median ${median(ratios).toFixed(2)}×; target ≥ 1×, ≥ 37/s)`,
      );
      const plainRatios = rounds.map((r) => r.plain / r.floor);
      console.log(
        `  plain kernels (no IPython), beside    ${range(rounds.map((r) => r.plain))} rollouts/s; ` +
          `${plainRatios.map((x) => x.toFixed(2)).join(', ')}× the floor (median ${median(plainRatios).toFixed(2)}×)`,
      );
      if (group !== undefined) {
        const cpu = rounds.map((r) => r.cpu!);
        const byCpu = cpu.map((c) => c.floor / c.ours);
        console.log(
          `  by CPU (each side's process tree, sandboxes included, kernel threads not; load-independent): ours ${range(cpu.map((c) => c.ours))} ms a rollout, ` +
            `plain kernels ${range(cpu.map((c) => c.plain))}, the floor ${range(cpu.map((c) => c.floor))}; ours ${byCpu.map((x) => x.toFixed(2)).join(', ')}× the floor ` +
            `(median ${median(byCpu).toFixed(2)}×), plain ${median(cpu.map((c) => c.floor / c.plain)).toFixed(2)}×`,
        );
      } else console.log('  by CPU: not measured here (needs a cgroup v1 cpuacct hierarchy and root)');
      console.log(`  no warm sandboxes (warm: 0)           ${unpooled.perS.toFixed(1)} rollouts/s`);
      console.log(`  spawned kernels (before)              ${tenBefore.perS.toFixed(1)} rollouts/s`);
    } finally {
      await tenProvider.close?.();
      group?.close();
    }
    console.log(`  previous figure: ${PREVIOUS.rollouts}`);

    heading('code verification (environments/code), 10-test submissions, 8 at once, warm sandboxes');
    console.log(`  load average before: ${loadavg().map((x) => x.toFixed(2)).join(' ')}`);
    for (const [label, kernelForkServer] of [['forked Python (bare fork server)', true], ['new Python per submission (before)', false]] as const) {
      const provider = createBwrapProvider({ warm: 8, kernelForkServer });
      const runner = createCodeRunner({ concurrency: 8, provider });
      try {
        const submission = problem(10);
        await closedLoop(8, 16, async () => void (await runner.run(submission)));
        let failures = 0;
        const timed = await closedLoop(8, 120, async () => {
          const { result } = await runner.run(submission);
          if (!result.every((r) => r === true)) failures++;
        });
        console.log(
          `  ${label.padEnd(36)} ${timed.perS.toFixed(1)} verifications/s  (${(timed.perS / CODE_GEN_PER_S).toFixed(1)}× code_gen's ${CODE_GEN_PER_S}/s; target ≥ 5×)` +
            `${failures > 0 ? `  FAILURES ${failures}` : ''}`,
        );
      } finally {
        await runner.close();
        await provider.close?.();
      }
    }
    console.log(`  previous figure: ${PREVIOUS.verify}`);

    heading('an idle fork server');
    const sandbox = await forked.create();
    const kernel = await PythonKernel.start(sandbox);
    await kernel.close();
    await sandbox.close();
    const pids = serverPids(forked, sandbox);
    const idle0 = treeCpuMs(pids);
    await new Promise((resolve) => setTimeout(resolve, 5000));
    const rss = pids.map((pid) => Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'latin1'))?.[1] ?? 0) / 1024);
    console.log(`  ${pids.length} server(s): ${(treeCpuMs(pids) - idle0).toFixed(0)} ms CPU in 5 s idle (tick: 10 ms), RSS ${rss.map((mb) => `${mb.toFixed(0)} MiB`).join(', ')}`);
  } finally {
    await forked.close?.();
    await spawned.close?.();
  }
}
