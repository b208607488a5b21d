import { spawn, type ChildProcess } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { BashSession, bwrapAvailable, createBwrapProvider, type Sandbox } from '@rollserve/core/sandbox';
import { killTree, type KillTreeOptions } from '../../packages/core/src/sandbox/process.ts';
import { heading } from './stats.ts';

// What ending a shell costs the service on a busy host. A shell's or kernel's end, a command's or
// program's time limit sweep the processes that carry its tag (setsid'd, double-forked). The
// sweep looked at every process of the host (a readlink of its pid namespace each): on a node
// running hundreds of sandboxes, every end cost a read per process of the node. It now reads
// the sandbox's cgroup. Both measured here in the same run, beside N idle processes of the host.

const PREVIOUS = 'before the sweep read the cgroup (2026-11-28, nearly idle): a shell start + close with its sweep 5.6 ms of service CPU, 13.3 ms beside 1,000 host processes';

function cpuMs(): number {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1000;
}

export default async function bench(): Promise<void> {
  heading('sweeps of a sandbox on a busy host: what a shell\'s end costs the service');
  if (!bwrapAvailable()) {
    console.log('  skipped: bwrap is not installed');
    return;
  }
  const provider = createBwrapProvider();
  const idle: ChildProcess[] = [];
  let sandbox: Sandbox | undefined;
  try {
    sandbox = await provider.create();
    const sweepOptions = (sandbox as unknown as { killOptions(tag: string): KillTreeOptions }).killOptions('ROLLSERVE_SANDBOX=rs-bench-none');
    for (let i = 0; i < 20; i++) await (await BashSession.start(sandbox)).close();
    for (const extra of [0, 1000]) {
      while (idle.length < extra) idle.push(spawn('sleep', ['600'], { stdio: 'ignore' }));
      await new Promise((resolve) => setTimeout(resolve, 300));
      // one sweep alone, each way (a tag nothing carries: the scan is all it does)
      const sweeps = 200;
      let t0 = performance.now();
      for (let i = 0; i < sweeps; i++) killTree(undefined, sweepOptions);
      const cgroupMs = (performance.now() - t0) / sweeps;
      const { candidates: _, ...hostWide } = sweepOptions;
      t0 = performance.now();
      for (let i = 0; i < sweeps; i++) killTree(undefined, hostWide);
      const hostMs = (performance.now() - t0) / sweeps;
      // a shell's start and close, its sweep a moment later (the sandbox lives on)
      const n = 60;
      const c0 = cpuMs();
      for (let i = 0; i < n; i++) {
        await (await BashSession.start(sandbox)).close();
        await new Promise((resolve) => setTimeout(resolve, 60));
      }
      const shellMs = (cpuMs() - c0) / n;
      console.log(
        `  host processes +${String(extra).padEnd(5)} one sweep: the sandbox's cgroup ${cgroupMs.toFixed(3)} ms, every process of the host (before) ${hostMs.toFixed(3)} ms (${(hostMs / cgroupMs).toFixed(1)}×); ` +
          `a shell start + close with its sweep ${shellMs.toFixed(2)} ms of service CPU`,
      );
    }
    console.log(`  previous figure: ${PREVIOUS}`);
  } finally {
    for (const child of idle) child.kill('SIGKILL');
    await sandbox?.close();
    await provider.close?.();
  }
}
