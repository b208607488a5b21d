import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore, type RolloutStore } from '@rollserve/core/service';
import {
  call,
  nemoGymFixture,
  readJsonl,
  slurmMissing,
  startFakePolicy,
  startTestPostgres,
  startTestSlurm,
  workspaceRoot,
  type FakePolicy,
  type TestPostgres,
  type TestSlurm,
} from '@rollserve/testing';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

// Rollout nodes as a Slurm job array (deploy/slurm/rollserve-nodes.sbatch) on a real single-host
// cluster, the central service (`rollserve start`) on PostgreSQL, the scripted policy; then one
// failure per test while a batch of sandboxed (math_with_code: a Python kernel in bwrap) rollouts
// runs. Every rollout must end with exactly one result, none lost, no sandbox or sandbox dir left.
// Needs root, slurm-wlm, munge and PostgreSQL: skipped without them, but a failure under CI.
const missing = slurmMissing() ?? (existsSync('/usr/lib/postgresql') ? undefined : 'PostgreSQL is not installed');
if (missing !== undefined && process.env.CI) throw new Error(`the Slurm chaos suite must run in CI: ${missing}`);

const ROOT = workspaceRoot();
const ROLLSERVE = join(ROOT, 'packages', 'cli', 'bin', 'rollserve.js');
const TEMPLATE = join(ROOT, 'deploy', 'slurm', 'rollserve-nodes.sbatch');
const BATCH = 24;
const NODES = 4;

interface WireNode {
  node_id: string;
  host: string;
  pid: number;
  leases: number;
  state: 'up' | 'lost' | 'left';
  lost_reason?: string;
  last_seen_at: string;
  slurm?: { node_name?: string; job_id?: string; array_job_id?: string; array_task_id?: string };
}

/** `count` consecutive free loopback ports (the service's, then one per environment server). */
async function freePortRun(count: number): Promise<number> {
  for (let tries = 0; tries < 50; tries++) {
    const first = createServer();
    await new Promise<void>((resolve, reject) => first.once('error', reject).listen(0, '127.0.0.1', resolve));
    const base = (first.address() as { port: number }).port;
    const held: Server[] = [first];
    try {
      for (let i = 1; i < count; i++) {
        const server = createServer();
        await new Promise<void>((resolve, reject) => server.once('error', reject).listen(base + i, '127.0.0.1', resolve));
        held.push(server);
      }
      return base;
    } catch {
      // taken: try another base
    } finally {
      await Promise.all(held.map((s) => new Promise((resolve) => s.close(resolve))));
    }
  }
  throw new Error('no run of free ports');
}

function readProc(pid: string, file: string): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/${file}`, 'latin1');
  } catch {
    return undefined;
  }
}

/** bwrap processes of sandboxes made under `sandboxTmp` (each runs in its sandbox's directory there). */
function sandboxesUnder(sandboxTmp: string): number[] {
  const cwd = (pid: string): string => {
    try {
      return readlinkSync(`/proc/${pid}/cwd`);
    } catch {
      return '';
    }
  };
  return readdirSync('/proc')
    .filter((pid) => /^\d+$/.test(pid) && readProc(pid, 'comm')?.trim() === 'bwrap' && cwd(pid).startsWith(`${sandboxTmp}/`))
    .map(Number);
}

const sandboxDirsUnder = (sandboxTmp: string) => readdirSync(sandboxTmp).filter((name) => name.startsWith('rollserve-'));

describe.skipIf(missing !== undefined)('rollout nodes on Slurm, under failures', () => {
  let slurm: TestSlurm;
  let pg: TestPostgres;
  let fake: FakePolicy;
  let store: RolloutStore | undefined;
  let dir: string;
  let sandboxTmp: string;
  let storeUrl: string;
  let port: number;
  let serviceUrl: string;
  let service: { child: ChildProcess; output: () => string } | undefined;
  let nodesJob: string;
  const row = readJsonl<Record<string, unknown>>(nemoGymFixture('math_with_code', 'example.jsonl')).find((r) => r.expected_result === '-3')!;

  const startService = async () => {
    const child = spawn(
      process.execPath,
      [ROLLSERVE, 'start', '--port', String(port), '--llm', fake.url, '--store', storeUrl, '--journal', join(dir, 'no-journal.jsonl'), '--run-locally', 'never'],
      // with this cluster's SLURM_CONF: the service asks squeue about its nodes' jobs
      { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...slurm.env, ROLLSERVE_LOG_LEVEL: 'warn', TMPDIR: sandboxTmp } },
    );
    let output = '';
    child.stdout!.on('data', (c: Buffer) => (output = (output + c).slice(-20_000)));
    child.stderr!.on('data', (c: Buffer) => (output = (output + c).slice(-20_000)));
    service = { child, output: () => output };
    await slurm.waitFor('the service to answer', async () => {
      if (child.exitCode !== null) throw new Error(`rollserve start exited ${child.exitCode}: ${output}`);
      return (await call(serviceUrl, 'GET', '/health')).status === 200;
    }, { timeoutMs: 60_000 });
  };

  const stopService = async (signal: NodeJS.Signals) => {
    const child = service?.child;
    service = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    await exited;
    clearTimeout(timer);
  };

  const nodes = async (): Promise<WireNode[]> => ((await call(serviceUrl, 'GET', '/v1/nodes')).json as { nodes: WireNode[] }).nodes;
  const upNodes = async () => (await nodes()).filter((n) => n.state === 'up');

  /** Every node DOWN or drained is resumed, every array task that ended is requeued; then 4 nodes up. */
  const restoreFleet = async () => {
    for (const node of slurm.nodes) {
      const state = await slurm.nodeState(node);
      if (state.base === 'DOWN' || state.flags.includes('DRAIN')) await slurm.setNodeState(node, 'RESUME');
    }
    for (const task of await slurm.jobs(nodesJob)) {
      if (!['RUNNING', 'PENDING', 'CONFIGURING', 'REQUEUED', 'REQUEUE_HOLD', 'COMPLETING'].includes(task.state)) {
        await slurm.run('scontrol', ['requeue', task.jobId]);
      }
    }
    await slurm.waitFor(`${NODES} rollout nodes up, one per Slurm node`, async () => {
      const up = await upNodes();
      const running = (await slurm.jobs(nodesJob)).filter((t) => t.state === 'RUNNING');
      const hosts = new Set(up.map((n) => n.slurm?.node_name));
      return up.length === NODES && running.length === NODES && hosts.size === NODES && up.every((n) => existsSync(`/proc/${n.pid}`));
    }, { timeoutMs: 180_000, intervalMs: 500 }).catch(async (error: Error) => {
      const up = (await upNodes()).map((n) => n.slurm?.node_name);
      const tasks = (await slurm.jobs(nodesJob)).map((t) => `${t.arrayTaskId} ${t.state} ${t.nodeList}`);
      const states = await Promise.all(slurm.nodes.map(async (node) => `${node} ${(await slurm.nodeState(node)).base}`));
      throw new Error(`${error.message}; rollout nodes up on [${up.join(', ')}]; tasks [${tasks.join('; ')}]; Slurm nodes [${states.join(', ')}]`);
    });
  };

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rollserve-chaos-'));
    sandboxTmp = join(dir, 'tmp');
    await mkdir(sandboxTmp);
    // The nodes' TMPDIR, where their sandboxes' dirs go: the sandbox uid (not root) must reach them.
    await chmod(dir, 0o755);
    await chmod(sandboxTmp, 0o1777);
    slurm = await startTestSlurm({ nodes: NODES });
    pg = await startTestPostgres();
    storeUrl = await pg.createDatabase();
    // Two Python tool calls, then the answer; each reply takes a while, so a batch runs for ~15 s.
    fake = await startFakePolicy({
      latencyMs: 800,
      script: (_request, ctx) => {
        if (ctx.turn === 0) return { toolCalls: [{ name: 'execute_python', arguments: { code: 'x = -3\nprint(x * x)' } }] };
        if (ctx.turn === 1) return { toolCalls: [{ name: 'execute_python', arguments: { code: 'print(x)' } }] };
        return 'The solution is \\boxed{-3}.';
      },
    });
    port = await freePortRun(6);
    serviceUrl = `http://127.0.0.1:${port}`;
    await startService();
    nodesJob = await slurm.sbatch(['--array=1-4', '-o', 'node-%A_%a.out', TEMPLATE], {
      env: {
        ROLLSERVE_SERVICE: serviceUrl,
        ROLLSERVE_BIN: `${process.execPath} ${ROLLSERVE}`,
        ROLLSERVE_NODE_ARGS: '--init 2 --run 3 --eval 2',
        ROLLSERVE_LOG_LEVEL: 'warn',
        TMPDIR: sandboxTmp,
      },
    });
    await restoreFleet();
  }, 300_000);

  afterEach(async () => {
    await store?.close();
    store = undefined;
  });

  afterAll(async () => {
    await slurm?.close();
    await stopService('SIGTERM');
    await fake?.close();
    await pg?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  }, 180_000);

  /**
   * Submits a batch, runs `chaos` once some node holds leases, waits for every rollout, and checks:
   * one result each (in the store and through the API), all correct, no sandbox process or dir left.
   */
  const batchSurvives = async (name: string, chaos: (victim: WireNode) => Promise<void>) => {
    try {
      return await runBatch(name, chaos);
    } catch (error) {
      // What the service and the nodes said, for the CI log.
      const logs = readdirSync(slurm.jobsDir).filter((f) => f.startsWith('node-')).map((f) => `--- ${f}\n${readFileSync(join(slurm.jobsDir, f), 'utf8').slice(-3_000)}`);
      console.error(`[chaos] ${name} failed; service output:\n${service?.output().slice(-5_000) ?? '(not running)'}\n${logs.join('\n')}`);
      throw error;
    }
  };

  const runBatch = async (name: string, chaos: (victim: WireNode) => Promise<void>) => {
    type View = { id: string; state: string; result?: { id: string; reward: number; turns: Array<{ tool_calls: Array<{ status: string; output: string }> }> } };
    const ids = Array.from({ length: BATCH }, (_, i) => `${name}-${i}`);
    let views: View[] = [];
    const submitted = await call(serviceUrl, 'POST', '/v1/rollouts', { tasks: ids.map((id) => ({ id, env: 'math', row, policy: { model: 'fake-policy' } })) });
    expect(submitted.status, submitted.text).toBe(202);
    // How many sandboxes ran at once, sampled through the batch (so "none left" means something).
    let sandboxesSeen = 0;
    const sampler = setInterval(() => (sandboxesSeen = Math.max(sandboxesSeen, sandboxesUnder(sandboxTmp).length)), 250);
    try {
      const victim = await slurm.waitFor('a node holding leases', async () => (await upNodes()).find((n) => n.leases >= 2), { timeoutMs: 120_000, intervalMs: 200 });
      await chaos(victim);
      views = await slurm.waitFor(`all ${BATCH} rollouts of ${name} to finish`, async () => {
        const all = await Promise.all(ids.map(async (id) => (await call(serviceUrl, 'GET', `/v1/rollouts/${id}`)).json as View));
        return all.every((v) => v.state === 'done' || v.state === 'failed' || v.state === 'cancelled') && all;
      }, { timeoutMs: 300_000, intervalMs: 1_000 });
    } finally {
      clearInterval(sampler);
    }

    const wrong = views.find((v) => v.state !== 'done' || v.result?.reward !== 1);
    expect(wrong, JSON.stringify(wrong, (key, value) => (['turns', 'messages', 'response'].includes(key) ? undefined : value))).toBeUndefined();
    expect(views.map((v) => [v.id, v.state, v.result?.id, v.result?.reward])).toEqual(ids.map((id) => [id, 'done', id, 1]));
    // Both Python calls ran in the rollout's sandbox, whichever node (and attempt) finished it.
    const failedCall = views.flatMap((v) => v.result!.turns.flatMap((t) => t.tool_calls)).find((c) => c.status !== 'ok');
    expect(failedCall, JSON.stringify(failedCall)).toBeUndefined();
    expect(views.map((v) => v.result!.turns.flatMap((t) => t.tool_calls.map((c) => c.status)))).toEqual(ids.map(() => ['ok', 'ok']));
    expect(sandboxesSeen).toBeGreaterThan(0);

    store = await openStore(storeUrl);
    const rollouts = await Promise.all(ids.map((id) => store!.getRollout(id)));
    expect(rollouts.map((r) => r?.state)).toEqual(ids.map(() => 'done'));
    const results: string[] = [];
    for (let cursor: string | null = null; ;) {
      const page = await store.listResults({ cursor, limit: 1_000 });
      results.push(...page.items.map((r) => r.id).filter((id) => id.startsWith(`${name}-`)));
      if (!(cursor = page.cursor)) break;
    }
    expect(results.sort()).toEqual([...ids].sort());
    const reissued = rollouts.filter((r) => (r?.attempt ?? 0) > 1).length;

    await slurm.waitFor('no sandbox process left', () => sandboxesUnder(sandboxTmp).length === 0, { timeoutMs: 60_000 }).catch(() => {});
    expect(sandboxesUnder(sandboxTmp)).toEqual([]);
    await slurm.waitFor('no sandbox dir left', () => sandboxDirsUnder(sandboxTmp).length === 0, { timeoutMs: 60_000 }).catch(() => {});
    expect(sandboxDirsUnder(sandboxTmp)).toEqual([]);
    console.log(`[chaos] ${name}: ${BATCH}/${BATCH} results, ${reissued} re-issued to another attempt, up to ${sandboxesSeen} sandboxes at once`);
    return { reissued };
  };

  it('a Slurm node set DOWN mid-batch: its task is killed and requeued, its rollouts run elsewhere', async () => {
    await batchSurvives('node-down', async (victim) => {
      await slurm.setNodeState(victim.slurm!.node_name!, 'DOWN', 'chaos');
      await slurm.waitFor('the victim node to leave', async () => (await nodes()).find((n) => n.node_id === victim.node_id)?.state !== 'up', { timeoutMs: 60_000 });
    });
    await restoreFleet();
  }, 600_000);

  it('a slurmd killed mid-batch: the node goes DOWN, the service learns from Slurm that the job is gone, the orphaned agent leaves', async () => {
    await batchSurvives('slurmd-kill', async (victim) => {
      const host = victim.slurm!.node_name!;
      await slurm.killSlurmd(host);
      try {
        await slurm.waitFor(`${host} DOWN`, async () => (await slurm.nodeState(host)).base === 'DOWN', { timeoutMs: 120_000 });
        // Slurm has given up on the node and requeued its job, but the agent there still runs (its
        // slurmstepd lives on) and still heartbeats: the service hears from squeue that its job is
        // gone, takes its work back, and refuses to take the node back, so the orphan leaves.
        const lost = await slurm
          .waitFor('the service to drop the orphan', async () => {
            const node = (await nodes()).find((n) => n.node_id === victim.node_id);
            return node?.state === 'lost' && node;
          }, { timeoutMs: 120_000 })
          .catch(async (error: Error) => {
            // what the service and Slurm said, in the failure itself (a CI log keeps its end)
            const job = `${victim.slurm!.array_job_id}_${victim.slurm!.array_task_id}`;
            const task = (await slurm.jobs(nodesJob)).find((t) => `${t.arrayJobId}_${t.arrayTaskId}` === job);
            const node = (await nodes()).find((n) => n.node_id === victim.node_id);
            const said = service?.output().split('\n').filter((line) => /slurm|node/i.test(line)).slice(-5).join('\n');
            throw new Error(`${error.message}; the victim: ${JSON.stringify({ state: node?.state, lost_reason: node?.lost_reason, last_seen_at: node?.last_seen_at })}; Slurm's ${job}: ${task?.state} on ${task?.nodeList}; the service said:\n${said}`);
          });
        expect(lost.lost_reason).toMatch(/^Slurm job \d+_\d+ is gone$/);
        await slurm.waitFor('the orphaned agent to exit', () => readProc(String(victim.pid), 'cmdline') === undefined, { timeoutMs: 60_000 });
      } finally {
        // whatever happened, the next test gets its four Slurm nodes back
        await slurm.restartSlurmd(host);
      }
    });
    await restoreFleet();
  }, 600_000);

  it('a node agent SIGKILLed mid-batch: its leases lapse and its rollouts are re-issued', async () => {
    const { reissued } = await batchSurvives('agent-kill', async (victim) => {
      expect(readProc(String(victim.pid), 'cmdline')).toContain('rollserve.js');
      process.kill(victim.pid, 'SIGKILL');
    });
    expect(reissued).toBeGreaterThanOrEqual(1);
    await restoreFleet();
  }, 600_000);

  it('the central service SIGKILLed mid-batch and restarted on the same port and store', async () => {
    await batchSurvives('service-kill', async () => {
      await stopService('SIGKILL');
      const down = Date.now();
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      await startService();
      console.log(`[chaos] service down for ${Date.now() - down} ms (killed, 2 s pause, restart until /health answers)`);
    });
    await restoreFleet();
  }, 600_000);

  it('the database restarted mid-batch', async () => {
    await batchSurvives('db-restart', async () => {
      await pg.restart();
    });
    await restoreFleet();
  }, 600_000);
});
