import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { bwrapAvailable, createSandboxProvider } from '@rollserve/core/sandbox';
import { closedLoop, floorRollout, rollout } from './kernel.ts';
import { heading } from './stats.ts';

// Where a sandboxed ten-turn rollout's CPU goes, ours beside the floor (issue 28), by the command
// that ran: perf samples every CPU (cpu-clock, one sample each PERIOD_NS of a CPU's time, idle
// included) while the rollouts of one side run, and nothing else. The rounds alternate, ours then
// the floor's, so that both see the same host. What `pnpm bench kernel` measures as a rate and
// as a cpuacct total, this splits: the floor is one bare bwrap running one sh (the five commands)
// and one python3, spawned from Node; ours is the default provider with the bash tool's shell and
// a forked IPython kernel, as users get them. Root and `perf` (linux-perf) needed; elsewhere skipped.

const PERIOD_NS = 500_000;
const ROUNDS = 2;
const PER_ROUND = 150;

/** Each sample's command, grouped: [test on the command name, the row it counts in]. */
const ROWS: Array<[(comm: string) => boolean, string]> = [
  [(c) => c === 'node', 'Node: ours the service, the floor its spawn of bwrap'],
  [(c) => c === 'bwrap', 'bwrap'],
  [(c) => c === 'perl', "perl: the spawners (ours: each sandbox's bwrap, each shell's entry)"],
  [(c) => c === 'bash', "bash: ours the bash tool's shell"],
  [(c) => c === 'sh', "sh: ours the sandbox's exec agent, the floor's shell"],
  [(c) => c === 'ls' || c === 'wc', 'ls and wc: the commands'],
  [(c) => c === 'python3' || c.startsWith('py-'), 'Python: ours the kernels and their servers, the floor python3'],
  [(c) => /^(kworker|ksoftirqd|rcu|migration|kdamond|kcompactd|khugepaged|kswapd|cpuhp|watchdog)/.test(c), 'kernel threads'],
  [(c) => c === 'swapper', 'idle'],
  [() => true, "other (the rest of the host's processes)"],
];

interface Perf {
  enable(): Promise<void>;
  /** Stops recording and returns the sample count of each row. */
  stop(): Promise<Map<string, number>>;
  /** Ends the recording if it still runs (a round that failed). */
  kill(): void;
}

function ack(stream: Readable): Promise<void> {
  return new Promise((resolve, reject) => {
    stream.once('data', () => resolve());
    stream.once('error', reject);
  });
}

/** `perf record -a` with events disabled until `enable` (its control descriptors: 3 in, 4 out). */
function startPerf(dir: string, name: string): Perf {
  const file = join(dir, `${name}.data`);
  const child = spawn('perf', ['record', '-q', '-a', '-e', 'cpu-clock', '-c', String(PERIOD_NS), '-D', '-1', '--control', 'fd:3,4', '-o', file], {
    stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const control = child.stdio[3] as Writable;
  const acks = child.stdio[4] as Readable;
  const command = async (what: string): Promise<void> => {
    const acked = ack(acks);
    control.write(`${what}\n`);
    const outcome = await Promise.race([acked.then(() => 'ack'), exited.then(() => 'exit')]);
    if (outcome !== 'ack') throw new Error(`perf record ended (${stderr.trim()})`);
  };
  return {
    enable: () => command('enable'),
    stop: async () => {
      await command('disable');
      child.kill('SIGINT');
      await exited;
      const script = spawnSync('perf', ['script', '-i', file, '-F', 'comm'], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 });
      if (script.status !== 0) throw new Error(`perf script: ${script.stderr}`);
      const counts = new Map<string, number>();
      for (const line of script.stdout.split('\n')) {
        const comm = line.trim();
        if (comm === '') continue;
        const row = ROWS.find(([test]) => test(comm))![1];
        counts.set(row, (counts.get(row) ?? 0) + 1);
      }
      return counts;
    },
    kill: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}

/** Milliseconds of CPU a rollout in each row, for `total` rollouts. */
const perRollout = (counts: Map<string, number>, total: number): Map<string, number> =>
  new Map([...counts].map(([row, n]) => [row, (n * PERIOD_NS) / 1e6 / total]));

export default async function bench(): Promise<void> {
  heading("where a sandboxed ten-turn rollout's CPU goes, ours beside the floor (perf, every CPU; ms a rollout)");
  if (!bwrapAvailable()) return console.log('  skipped: bwrap is not installed');
  if (process.getuid?.() !== 0) return console.log('  skipped: needs root (perf record -a)');
  if (spawnSync('perf', ['--version']).status !== 0) return console.log('  skipped: perf (linux-perf) is not installed');
  const probe = spawnSync('perf', ['record', '-q', '-a', '-e', 'cpu-clock', '-o', '/dev/null', '--', 'true'], { encoding: 'utf8' });
  if (probe.status !== 0) return console.log(`  skipped: perf cannot sample every CPU here (${probe.stderr.trim().split('\n')[0]})`);
  const concurrency = availableParallelism() * 2;
  console.log(`  load average before: ${loadavg().map((x) => x.toFixed(2)).join(' ')}; ${concurrency} at once, ${ROUNDS} rounds of ${PER_ROUND} each side, alternating`);
  const dir = mkdtempSync(join(tmpdir(), 'rollserve-perf-'));
  const provider = createSandboxProvider();
  const sides = { ours: [] as Array<Map<string, number>>, floor: [] as Array<Map<string, number>> };
  const rates = { ours: [] as number[], floor: [] as number[] };
  try {
    // as users get it, warm (its first rollouts start its spawners and fork servers)
    await closedLoop(concurrency, 60, () => rollout(provider));
    await closedLoop(concurrency, 20, floorRollout);
    for (let round = 0; round < ROUNDS; round++) {
      for (const side of ['ours', 'floor'] as const) {
        const perf = startPerf(dir, `${side}-${round}`);
        try {
          await perf.enable();
          const { perS } = await closedLoop(concurrency, PER_ROUND, side === 'ours' ? () => rollout(provider) : floorRollout);
          sides[side].push(perRollout(await perf.stop(), PER_ROUND));
          rates[side].push(perS);
        } finally {
          perf.kill();
        }
      }
    }
  } finally {
    await provider.close?.();
    rmSync(dir, { recursive: true, force: true });
  }
  const mean = (maps: Array<Map<string, number>>, row: string): number => maps.reduce((sum, map) => sum + (map.get(row) ?? 0), 0) / maps.length;
  const range = (values: number[]): string => `${Math.min(...values).toFixed(1)}-${Math.max(...values).toFixed(1)}`;
  const cell = (value: number): string => value.toFixed(2).padStart(7);
  console.log(`  ${'row'.padEnd(72)}   ours   floor   ours - floor`);
  const busy = { ours: 0, floor: 0 };
  for (const [, row] of ROWS) {
    const ours = mean(sides.ours, row);
    const floor = mean(sides.floor, row);
    if (row !== 'idle' && !row.startsWith('other')) {
      busy.ours += ours;
      busy.floor += floor;
    }
    console.log(`  ${row.padEnd(72)} ${cell(ours)} ${cell(floor)} ${cell(ours - floor)}`);
  }
  console.log(`  ${'busy (every row but idle and other)'.padEnd(72)} ${cell(busy.ours)} ${cell(busy.floor)} ${cell(busy.ours - busy.floor)}  (ours ${(busy.floor / busy.ours).toFixed(2)}× the floor by CPU)`);
  console.log(`  rate in the same rounds: ours ${range(rates.ours)} rollouts/s, the floor ${range(rates.floor)}`);
}
