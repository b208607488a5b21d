import { existsSync, mkdirSync, readFileSync, readdirSync, readlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { slurmMissing, startTestSlurm, type TestSlurm } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// The single-host Slurm harness itself: 4 real slurmd nodes on loopback. Needs root, slurm-wlm and
// munge; skipped without them on a workstation, but a failure under CI (where install.sh puts them).
const missing = slurmMissing();
const repoRoot = resolve(fileURLToPath(import.meta.url), '../../..');
if (missing !== undefined && process.env.CI) throw new Error(`the Slurm suite must run in CI: ${missing}`);

/** PIDs of every process whose cwd lies inside `dir` (job tasks and slurmstepd of that cluster). */
function processesIn(dir: string): number[] {
  return readdirSync('/proc')
    .filter((entry) => /^\d+$/.test(entry))
    .filter((pid) => {
      try {
        const cwd = readlinkSync(`/proc/${pid}/cwd`);
        return cwd === dir || cwd.startsWith(`${dir}/`);
      } catch {
        return false;
      }
    })
    .map(Number);
}

function comm(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return undefined;
  }
}

function environ(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0');
  } catch {
    return [];
  }
}

describe.skipIf(missing !== undefined)('single-host Slurm test cluster', () => {
  let slurm: TestSlurm;

  beforeAll(async () => {
    slurm = await startTestSlurm({ nodes: 4 });
    console.log(`[slurm] 4 nodes up in ${slurm.startupMs} ms (${slurm.dir})`);
  }, 120_000);

  afterAll(async () => {
    await slurm?.close();
  }, 120_000);

  it('brings up 4 idle nodes that each run a task of one srun', async () => {
    expect(slurm.nodes).toEqual(['n1', 'n2', 'n3', 'n4']);
    for (const node of slurm.nodes) expect((await slurm.nodeState(node)).state).toBe('IDLE');
    const { stdout } = await slurm.run('srun', ['-N4', '-n4', 'bash', '-c', 'echo $SLURMD_NODENAME']);
    expect(stdout.trim().split('\n').sort()).toEqual(['n1', 'n2', 'n3', 'n4']);
  }, 120_000);

  it('runs a job array of 8 one-node tasks to completion', async () => {
    const id = await slurm.sbatch(['--array=0-7', '-N1', '-n1', '-o', 'array-%A_%a.out', '--wrap', 'echo "$SLURM_ARRAY_TASK_ID $SLURMD_NODENAME"; sleep 1']);
    const tasks = await slurm.waitFor('8 array tasks to finish', async () => {
      const all = await slurm.jobs(id);
      return all.length === 8 && all.every((t) => !['PENDING', 'RUNNING', 'CONFIGURING', 'COMPLETING'].includes(t.state)) && all;
    }, { timeoutMs: 120_000 });
    expect(tasks.map((t) => t.state)).toEqual(Array(8).fill('COMPLETED'));
    expect(tasks.map((t) => Number(t.arrayTaskId)).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    for (const t of tasks) {
      const out = readFileSync(join(slurm.jobsDir, `array-${id}_${t.arrayTaskId}.out`), 'utf8').trim();
      expect(out).toBe(`${t.arrayTaskId} ${t.nodeList}`);
    }
  }, 180_000);

  it('a node set DOWN mid-job requeues only the array task that ran there (--requeue)', async () => {
    const log = join(slurm.jobsDir, 'requeue-starts.log');
    const id = await slurm.sbatch([
      '--array=1-4', '-N1', '-n1', '--exclusive', '--requeue', '-o', '/dev/null',
      '--wrap', `echo "$SLURM_ARRAY_TASK_ID $SLURMD_NODENAME \${SLURM_RESTART_COUNT:-0}" >> ${log}; exec sleep 600`,
    ]);
    const running = await slurm.waitFor('4 array tasks running on 4 nodes', async () => {
      const all = await slurm.jobs(id);
      return all.length === 4 && all.every((t) => t.state === 'RUNNING') && all;
    }, { timeoutMs: 120_000 });
    expect(new Set(running.map((t) => t.nodeList))).toEqual(new Set(slurm.nodes));
    const victim = running.find((t) => t.nodeList === 'n3')!;

    await slurm.setNodeState('n3', 'DOWN', 'test-node-failure');
    await slurm.waitFor(`task ${victim.arrayTaskId} to be requeued`, async () => {
      const t = (await slurm.jobs(victim.jobId))[0];
      return t !== undefined && t.restarts === 1;
    }, { timeoutMs: 60_000 });
    const others = (await slurm.jobs(id)).filter((t) => t.arrayTaskId !== victim.arrayTaskId);
    expect(others.map((t) => [t.state, t.restarts])).toEqual([['RUNNING', 0], ['RUNNING', 0], ['RUNNING', 0]]);
    expect((await slurm.nodeState('n3')).base).toBe('DOWN');

    // The other nodes are busy (--exclusive): the requeued task waits for n3 to come back.
    await slurm.setNodeState('n3', 'RESUME');
    await slurm.waitFor(`task ${victim.arrayTaskId} to run again`, async () => {
      const t = (await slurm.jobs(victim.jobId))[0];
      return t?.state === 'RUNNING';
    }, { timeoutMs: 120_000 });
    await slurm.waitFor('the restarted task to write its start line', () => readFileSync(log, 'utf8').trim().split('\n').length === 5);
    const starts = readFileSync(log, 'utf8').trim().split('\n').sort();
    expect(starts.filter((line) => line.endsWith(' 1'))).toEqual([`${victim.arrayTaskId} n3 1`]);
    expect(starts.filter((line) => line.endsWith(' 0'))).toHaveLength(4);

    await slurm.cancel(id);
    await slurm.waitFor('the array to be cancelled', async () => (await slurm.jobs(id)).every((t) => t.state === 'CANCELLED'), { timeoutMs: 60_000 });
  }, 300_000);

  it('a killed slurmd leaves its node DOWN after SlurmdTimeout; restarting it brings the node back', async () => {
    const started = Date.now();
    await slurm.killSlurmd('n2');
    await slurm.waitFor('n2 to be DOWN', async () => (await slurm.nodeState('n2')).base === 'DOWN', { timeoutMs: 120_000 });
    const downMs = Date.now() - started;
    expect((await slurm.nodeState('n2')).flags).toContain('NOT_RESPONDING');
    // No job lands on a DOWN node.
    const blocked = await slurm.sbatch(['-N1', '-w', 'n2', '-o', '/dev/null', '--wrap', 'true']);
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    expect((await slurm.jobs(blocked))[0]?.state).toBe('PENDING');

    const restarted = Date.now();
    await slurm.restartSlurmd('n2');
    await slurm.waitFor('the job pinned to n2 to complete', async () => (await slurm.jobs(blocked))[0]?.state === 'COMPLETED', { timeoutMs: 120_000 });
    console.log(`[slurm] slurmd kill -> node DOWN ${downMs} ms (SlurmdTimeout ${slurm.slurmdTimeoutS} s); restart -> job ran ${Date.now() - restarted} ms`);
    expect(['IDLE', 'MIXED', 'ALLOCATED']).toContain((await slurm.nodeState('n2')).base);
  }, 300_000);

  describe('deploy/slurm with a stand-in for `rollserve`', () => {
    // The stand-in records how it was started and where, and leaves on SIGTERM as `rollserve node` does.
    const stub = () => {
      const path = join(slurm.jobsDir, 'fake-rollserve.sh');
      const log = join(slurm.jobsDir, 'fake-rollserve.log');
      writeFileSync(path, [
        '#!/bin/bash',
        `echo "start $SLURMD_NODENAME $$ $PPID \${SLURM_ARRAY_TASK_ID:-} $*" >> ${log}`,
        `trap 'echo "term $SLURMD_NODENAME" >> ${log}; exit 0' TERM`,
        'while :; do sleep 0.2; done',
        '',
      ].join('\n'), { mode: 0o755 });
      writeFileSync(log, '');
      const lines = (kind: string) => readFileSync(log, 'utf8').split('\n').filter((line) => line.startsWith(`${kind} `));
      return { path, lines };
    };
    const env = (bin: string) => ({ ROLLSERVE_SERVICE: 'http://127.0.0.1:9/', ROLLSERVE_BIN: bin, ROLLSERVE_NODE_ARGS: '--init 1 --run 2' });

    it('rollserve-nodes.sbatch: one node per array task, each exec\'d by its task, all leave on scancel', async () => {
      const fake = stub();
      const id = await slurm.sbatch(['--array=1-4', '-o', '/dev/null', join(repoRoot, 'deploy/slurm/rollserve-nodes.sbatch')], { env: env(fake.path) });
      const starts = await slurm.waitFor('4 nodes started', () => fake.lines('start').length === 4 && fake.lines('start'), { timeoutMs: 120_000 });
      const parsed = starts.map((line) => line.split(' '));
      expect(new Set(parsed.map((p) => p[1]))).toEqual(new Set(slurm.nodes)); // --exclusive: one per node
      expect(parsed.map((p) => p[4]).sort()).toEqual(['1', '2', '3', '4']);
      for (const p of parsed) {
        expect(p.slice(5)).toEqual(['node', '--service', 'http://127.0.0.1:9/', '--init', '1', '--run', '2']);
        expect(comm(Number(p[3]))).toBe('slurmstepd'); // exec: no shell between Slurm and the node
      }
      await slurm.cancel(id);
      await slurm.waitFor('4 nodes to leave on SIGTERM', () => fake.lines('term').length === 4, { timeoutMs: 60_000 });
      await slurm.waitFor('the array to end', async () => (await slurm.jobs(id)).every((t) => t.state === 'CANCELLED'), { timeoutMs: 60_000 });
    }, 240_000);

    // A checkout whose CLI is a stand-in that records how it was started (node runs it, as it runs the real one).
    const standInCheckout = (name: string) => {
      const checkout = join(slurm.jobsDir, name);
      const log = join(slurm.jobsDir, `${name}-cli.log`);
      mkdirSync(join(checkout, 'packages', 'cli', 'bin'), { recursive: true });
      writeFileSync(log, '');
      writeFileSync(join(checkout, 'packages', 'cli', 'bin', 'rollserve.js'), [
        "import { appendFileSync } from 'node:fs';",
        `appendFileSync(${JSON.stringify(log)}, \`start \${process.argv.slice(2).join(' ')}\\n\`);`,
        "process.on('SIGTERM', () => process.exit(0));",
        'setInterval(() => {}, 1000);',
        '',
      ].join('\n'));
      writeFileSync(join(checkout, 'package.json'), '{"type":"module"}\n');
      return { checkout, log };
    };
    const noRollserveOnPath = `${dirname(process.execPath)}:/usr/bin:/bin`; // node and Slurm's commands, and no rollserve

    it("rollserve-nodes.sbatch as the README submits it (no ROLLSERVE_BIN, rollserve not on PATH): runs the checkout's CLI, or fails saying so", async () => {
      const { checkout, log } = standInCheckout('checkout');
      const base = { ROLLSERVE_SERVICE: 'http://127.0.0.1:9/', ROLLSERVE_NODE_ARGS: '--init 1', PATH: noRollserveOnPath };
      const id = await slurm.sbatch(['--array=1-1', '-D', checkout, '-o', '/dev/null', join(repoRoot, 'deploy/slurm/rollserve-nodes.sbatch')], { env: base });
      await slurm.waitFor("the checkout's CLI started", () => readFileSync(log, 'utf8').includes('start '), { timeoutMs: 120_000 });
      expect(readFileSync(log, 'utf8').trim()).toBe('start node --service http://127.0.0.1:9/ --init 1');
      await slurm.cancel(id);

      // elsewhere, the task fails at once and its output says what to set
      const elsewhere = join(slurm.jobsDir, 'not-a-checkout');
      mkdirSync(elsewhere, { recursive: true });
      const out = join(elsewhere, 'task.out');
      const failed = await slurm.sbatch(['-D', elsewhere, '-o', out, join(repoRoot, 'deploy/slurm/rollserve-nodes.sbatch')], { env: base });
      await slurm.waitFor('the task to fail', async () => (await slurm.jobs(failed)).every((t) => t.state === 'FAILED'), { timeoutMs: 120_000 });
      expect(readFileSync(out, 'utf8')).toMatch(/rollserve is not on PATH .* set ROLLSERVE_BIN/);
    }, 240_000);

    it("nodes-in-allocation.sh as the README runs it (no ROLLSERVE_BIN, rollserve not on PATH): runs its checkout's CLI on each host, or fails before any step saying so", async () => {
      const { checkout, log } = standInCheckout('allocation-checkout');
      mkdirSync(join(checkout, 'deploy', 'slurm'), { recursive: true });
      const script = join(checkout, 'deploy', 'slurm', 'nodes-in-allocation.sh');
      writeFileSync(script, readFileSync(join(repoRoot, 'deploy/slurm/nodes-in-allocation.sh')), { mode: 0o755 });
      const base = { ROLLSERVE_SERVICE: 'http://127.0.0.1:9/', ROLLSERVE_NODE_ARGS: '--init 1', PATH: noRollserveOnPath, ROLLSERVE_LOG_DIR: slurm.jobsDir };
      // started from another directory, as a trainer's batch script would
      const elsewhere = join(slurm.jobsDir, 'allocation-elsewhere');
      mkdirSync(elsewhere, { recursive: true });
      const id = await slurm.sbatch(['-N2', '--no-kill', '-D', elsewhere, '-o', '/dev/null', '--wrap', script], { env: base });
      await slurm.waitFor("the checkout's CLI started on both hosts", () => readFileSync(log, 'utf8').trim().split('\n').filter(Boolean).length === 2, { timeoutMs: 120_000 });
      expect(readFileSync(log, 'utf8').trim().split('\n')).toEqual(Array(2).fill('start node --service http://127.0.0.1:9/ --init 1'));
      await slurm.cancel(id);
      await slurm.waitFor('the job to end', async () => (await slurm.jobs(id))[0]?.state === 'CANCELLED', { timeoutMs: 60_000 });

      // a copy outside any checkout, started outside one: the job fails at once and says what to set
      const lone = join(elsewhere, 'nodes-in-allocation.sh');
      writeFileSync(lone, readFileSync(join(repoRoot, 'deploy/slurm/nodes-in-allocation.sh')), { mode: 0o755 });
      const out = join(elsewhere, 'allocation.out');
      const failed = await slurm.sbatch(['-N2', '--no-kill', '-D', elsewhere, '-o', out, '--wrap', lone], { env: base });
      await slurm.waitFor('the job to fail', async () => (await slurm.jobs(failed))[0]?.state === 'FAILED', { timeoutMs: 120_000 });
      expect(readFileSync(out, 'utf8')).toMatch(/rollserve is not on PATH .* set ROLLSERVE_BIN/);
      expect(readFileSync(out, 'utf8')).not.toMatch(/rollserve node: step on/);
    }, 240_000);

    it('nodes-in-allocation.sh: a step per host, so a failed host ends only its own node', async () => {
      const fake = stub();
      const script = join(repoRoot, 'deploy/slurm/nodes-in-allocation.sh');
      const id = await slurm.sbatch(['-N4', '--no-kill', '-o', 'in-allocation-%j.out', '--wrap', `${script}`], { env: { ...env(fake.path), ROLLSERVE_LOG_DIR: slurm.jobsDir } });
      await slurm.waitFor('a node on each of the 4 hosts', () => fake.lines('start').length === 4, { timeoutMs: 120_000 });
      expect(fake.lines('start').map((line) => line.split(' ')[1]).sort()).toEqual(slurm.nodes);
      const steps = async () => (await slurm.run('squeue', ['-h', '-s', '-j', id, '-o', '%i %N'])).stdout.trim().split('\n').filter((l) => /\.\d+ /.test(l));
      expect((await steps()).map((l) => l.split(' ')[1]).sort()).toEqual(slurm.nodes); // one step per host, none spanning several

      await slurm.setNodeState('n4', 'DOWN', 'test-node-failure');
      await slurm.waitFor('the step on n4 to end', async () => (await steps()).length === 3, { timeoutMs: 60_000 });
      expect((await steps()).map((l) => l.split(' ')[1]).sort()).toEqual(['n1', 'n2', 'n3']);
      expect((await slurm.jobs(id))[0]?.state).toBe('RUNNING');
      await slurm.setNodeState('n4', 'RESUME');

      await slurm.cancel(id);
      await slurm.waitFor('the other 3 nodes to leave on SIGTERM', () => fake.lines('term').length === 3, { timeoutMs: 60_000 });
      expect(fake.lines('term').map((line) => line.split(' ')[1]).sort()).toEqual(['n1', 'n2', 'n3']);
      await slurm.waitFor('the job to end', async () => (await slurm.jobs(id))[0]?.state === 'CANCELLED', { timeoutMs: 60_000 });
    }, 240_000);
  });

  it('close() stops every daemon and job process, orphans of a dead slurmd included, and removes its dir', async () => {
    const id = await slurm.sbatch(['--array=1-4', '-N1', '-n1', '--exclusive', '-o', '/dev/null', '--wrap', 'exec sleep 600']);
    // (a task is RUNNING to Slurm a while before its slurmstepd has started it, on a loaded machine)
    const sleepers = () => processesIn(slurm.dir).filter((pid) => comm(pid) === 'sleep' && environ(pid).includes(`SLURM_ARRAY_JOB_ID=${id}`)).length;
    await slurm.waitFor('4 sleepers running', async () => (await slurm.jobs(id)).filter((t) => t.state === 'RUNNING').length === 4 && sleepers() === 4, { timeoutMs: 120_000 });
    // A crashed slurmd leaves its slurmstepd and task running: close() must still get them.
    await slurm.killSlurmd('n4');
    const daemons = slurm.daemonPids();
    expect(daemons.length).toBe(1 + 1 + 3); // munged, slurmctld, three slurmd
    const jobProcs = processesIn(slurm.dir).filter((pid) => !daemons.includes(pid));
    const stepds = jobProcs.filter((pid) => comm(pid) === 'slurmstepd');
    expect(stepds.length).toBeGreaterThanOrEqual(4);
    const watched = [...daemons, ...jobProcs].map((pid) => ({ pid, comm: comm(pid) }));

    const started = Date.now();
    await slurm.close();
    console.log(`[slurm] close() with 4 running tasks and a dead slurmd: ${Date.now() - started} ms`);
    expect(watched.filter(({ pid, comm: name }) => name !== undefined && comm(pid) === name)).toEqual([]);
    expect(existsSync(slurm.dir)).toBe(false);
    expect(processesIn(slurm.dir)).toEqual([]);
  }, 180_000);
});
