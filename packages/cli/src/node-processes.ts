import { spawn, type ChildProcess } from 'node:child_process';
import { availableParallelism, constants } from 'node:os';
import { RolloutError } from '@rollserve/core';

/*
 * `rollserve node --processes K`: K node processes on one host, each registering as a node of its
 * own, with pools sized to its share of the CPUs (not pinned to them: the kernel schedules every
 * process over all of them). A node does its part of every rollout (leases, policy
 * turns, tool calls, results) on its event loop, one core, while its sandboxes use every core: on
 * a host with more cores than one event loop keeps busy, one node process leaves the rest idle
 * (README, "One node process carries a host only so far").
 *
 * This process only supervises: it starts the K nodes (`rollserve node` with the same flags, less
 * --processes; an `--id` gets `-<i>`; pools not given sized to the share), passes SIGTERM/SIGINT
 * on to them, and exits once they have all exited: 0 when every one left cleanly, otherwise with
 * the first one's status that did not (a status, or 128 + the signal that ended it). A node that
 * exits by itself (its service gone, refused) takes the others with it, so that the task ends as
 * one node's would. Each node reads the end of its stdin, a pipe only this process holds, as the
 * sign that its supervisor is gone, and leaves as on SIGTERM.
 */

/** The environment variable that tells a node a supervisor holds its stdin (see above). */
export const SUPERVISED_ENV = 'ROLLSERVE_NODE_SUPERVISED';

/** `total` split into `parts` as evenly as can be (the first ones one larger). */
function shares(total: number, parts: number): number[] {
  return Array.from({ length: parts }, (_, i) => Math.floor(total / parts) + (i < total % parts ? 1 : 0));
}

/** The pools of a node on `cores` cores: the flags given, else 4, 64 and 2 a core (at most 64, 512, 32). */
export function defaultPools(cores: number, given: { init?: number | undefined; run?: number | undefined; eval?: number | undefined }): { init: number; run: number; eval: number } {
  return {
    init: given.init ?? Math.min(64, 4 * cores),
    run: given.run ?? Math.min(512, 64 * cores),
    eval: given.eval ?? Math.min(32, 2 * cores),
  };
}

/** A command line less the string flags `names` and their values (`--name value`, `--name=value`). */
function withoutFlags(rawArgs: readonly string[], names: readonly string[]): string[] {
  const kept: string[] = [];
  for (let i = 0; i < rawArgs.length; i++) {
    const arg = rawArgs[i]!;
    if (arg === '--') {
      kept.push(...rawArgs.slice(i));
      break;
    }
    if (names.some((name) => arg === `--${name}`)) {
      i++; // its value
      continue;
    }
    if (names.some((name) => arg.startsWith(`--${name}=`))) continue;
    kept.push(arg);
  }
  return kept;
}

/** Without an --id, or with it (either form), as node `index` of them: `<id>-<index>`. */
function withIndexedId(args: readonly string[], index: number): string[] {
  const out = [...args];
  for (let i = 0; i < out.length; i++) {
    if (out[i] === '--') break;
    if (out[i] === '--id' && i + 1 < out.length) {
      out[i + 1] = `${out[i + 1]}-${index}`;
      return out;
    }
    if (out[i]!.startsWith('--id=')) {
      out[i] = `${out[i]}-${index}`;
      return out;
    }
  }
  return out;
}

/**
 * Starts `count` node processes and supervises them; resolves with the status to exit with.
 * `given` are the pools the flags gave (each node gets the same); the others are sized to each
 * node's share of this process's CPUs.
 */
export async function runNodeProcesses(
  count: number,
  rawArgs: readonly string[],
  given: { init?: number | undefined; run?: number | undefined; eval?: number | undefined },
): Promise<number> {
  // the CPUs this process may run on (its affinity: Slurm's binding, taskset), as a node sizes its pools
  const cpus = availableParallelism();
  if (count > cpus) {
    throw new RolloutError({ code: 'BAD_REQUEST', message: `--processes ${count}: this process may run on ${cpus} CPU${cpus === 1 ? '' : 's'}; at most one node process a CPU` });
  }
  // (the pools are given to each node below: its share's, or the flags' own)
  const base = withoutFlags(rawArgs, ['processes', 'init', 'run', 'eval']);
  const script = process.argv[1]!;
  const nodes: ChildProcess[] = [];
  let status: number | undefined;
  let stopping = false;
  const stopAll = (): void => {
    stopping = true;
    for (const node of nodes) if (node.exitCode === null && node.signalCode === null) node.kill('SIGTERM');
  };
  const exits = shares(cpus, count).map((share, index) => {
    const pools = defaultPools(share, given);
    // (the pools first: a `--` in the line given would make what follows it positional)
    const args = ['--init', String(pools.init), '--run', String(pools.run), '--eval', String(pools.eval), ...withIndexedId(base, index)];
    const node = spawn(process.execPath, [...process.execArgv, script, 'node', ...args], {
      stdio: ['pipe', 'inherit', 'inherit'],
      env: { ...process.env, [SUPERVISED_ENV]: '1' },
    });
    nodes.push(node);
    return new Promise<void>((resolve) => {
      node.once('error', (error) => {
        console.error(`rollserve node: node process ${index} could not start: ${error.message}`);
        status ??= 1;
        stopAll();
        resolve();
      });
      node.once('exit', (code, signal) => {
        const own = signal !== null ? 128 + (constants.signals[signal] ?? 0) : (code ?? 1);
        if (own !== 0) status ??= own;
        // one that ended by itself takes the others with it
        if (!stopping) stopAll();
        resolve();
      });
    });
  });
  const onSignal = (): void => stopAll();
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  try {
    await Promise.all(exits);
  } finally {
    process.off('SIGTERM', onSignal);
    process.off('SIGINT', onSignal);
  }
  return status ?? 0;
}
