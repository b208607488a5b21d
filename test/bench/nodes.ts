import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { nemoGymFixture, readJsonl } from '@rollserve/testing';
import { startPolicyProcess } from './policy-process.ts';
import {
  adopt,
  cpuSeconds,
  dispatcher,
  load,
  machineTicks,
  mainThreadCpuSeconds,
  mathTask,
  runBatch,
  startNode,
  startService,
  stop,
  stopAll,
  treeCpuSeconds,
  type NodeProcess,
  type ServiceProcess,
  type WireResult,
} from './cluster.ts';
import { heading } from './stats.ts';

// `pnpm bench nodes`: rollouts/s of the central service (`rollserve start --run-locally never`)
// with 1, 2 and 4 rollout nodes whose policy turns go through the service (`rollserve node
// --proxy-turns`) and 4 that send them to the backend themselves (the default; NODES_BENCH_SETUPS,
// e.g. `0,4,4d`, picks the set-ups), child processes on this host,
// and the service alone (`--run-locally auto`, no node) as the baseline, in the same run, against
// the same scripted policy (no latency) in its own process. Each set-up has its own service and
// store and a warm-up; all are up at once and their measured rounds interleaved. The CPU per
// rollout of the service, the nodes, the policy and this client comes from /proc (the service's
// and a node's with every process under them, their sandboxes included: treeCpuSeconds); the
// machine's busy time from /proc/stat (the cores are shared by all of them, and by whatever else
// runs here). Two workloads: single-turn math, and
// a multi-turn one with sandboxes (math_with_code: two `execute_python` calls in the rollout's
// bwrap sandbox and Python kernel, then the answer). NODES_BENCH_WORKLOADS=single|multi picks one.

/**
 * The set-ups: `0` the service alone; `<n>` n nodes whose policy turns go through the service
 * (`rollserve node --proxy-turns`, as every node did before direct backends); `<n>d` n nodes that
 * send them to the backend themselves on the service's routes (the default of `rollserve node`).
 */
interface SetupSpec {
  nodes: number;
  direct: boolean;
}
const SETUPS: SetupSpec[] = (process.env.NODES_BENCH_SETUPS ?? '0,1,2,4,4d').split(',').map((spec) => ({ nodes: Number.parseInt(spec, 10), direct: spec.trim().endsWith('d') }));

interface Workload {
  title: string;
  policy: Record<string, unknown>;
  task: (id: string) => object;
  check?: (result: WireResult) => boolean;
  warmup: number;
  rounds: number;
  perRound: number;
  /** `rollserve node` flags. */
  nodeArgs: string[];
}

const singleTurn: Workload = {
  title: 'single-turn math',
  policy: { reply: '\\boxed{8}' },
  task: mathTask,
  warmup: Number(process.env.NODES_BENCH_WARMUP ?? 2_000),
  rounds: Number(process.env.NODES_BENCH_ROUNDS ?? 3),
  perRound: Number(process.env.NODES_BENCH_ROLLOUTS ?? 1_000),
  nodeArgs: [],
};

const codeRow = () => readJsonl<Record<string, unknown>>(nemoGymFixture('math_with_code', 'example.jsonl')).find((r) => r.expected_result === '-3')!;

function multiTurn(): Workload {
  const row = codeRow();
  return {
    title: 'multi-turn math_with_code (2 execute_python calls in a bwrap sandbox + Python kernel, then the answer)',
    policy: { tool: 'execute_python', reply: JSON.stringify({ code: 'x = -3\nprint(x * x)' }), turns: 3 },
    task: (id) => ({ id, env: 'math', row, policy: { model: 'fake-policy' } }),
    // the scripted answer is not boxed (reward 0): what is checked is that both calls ran in the sandbox
    check: (r) => {
      const turns = r.turns as Array<{ tool_calls: Array<{ status: string; output: string }> }>;
      return r.state === 'done' && turns.length === 3 && turns.slice(0, 2).every((t) => t.tool_calls[0]?.status === 'ok' && t.tool_calls[0].output.includes('9'));
    },
    warmup: Number(process.env.NODES_BENCH_MT_WARMUP ?? 20),
    rounds: Number(process.env.NODES_BENCH_MT_ROUNDS ?? 3),
    perRound: Number(process.env.NODES_BENCH_MT_ROLLOUTS ?? 40),
    // With the default 64 INIT slots, 64 Python kernels starting at once on 2 shared cores starved
    // the node's heartbeats past the 10 s node timeout (every lease aborted, again and again).
    nodeArgs: (process.env.NODES_BENCH_MT_NODE_ARGS ?? '--init 8 --run 32 --eval 8').split(' '),
  };
}

interface Measured {
  nodes: number;
  direct: boolean;
  rates: number[];
  /** Rollouts measured. */
  total: number;
  /** CPU ms per rollout over the measured rounds. */
  cpu: { service: number; nodes: number; policy: number; client: number };
  /** Of the nodes' CPU per rollout (ms), their processes' main threads': their event loops. */
  nodeEventLoop: number;
  /** Fraction of the machine's CPU time busy during them (every process on it). */
  machineBusy: number;
  /** Rollouts that ended otherwise than expected (failed, a tool call in error), and why the first did. */
  unexpected: number;
  firstUnexpected?: string;
}

/** Why a result is not as expected, in a line: its state, error, and any tool call not ok. */
function whyNot(result: WireResult): string {
  const turns = (result.turns ?? []) as Array<{ tool_calls: Array<{ status: string; output: string }> }>;
  const call = turns.flatMap((t) => t.tool_calls).find((c) => c.status !== 'ok');
  const error = result.error as { message?: string } | null;
  return `${result.state}${error?.message ? `: ${error.message}` : ''}${call ? `; a tool call ${call.status}: ${call.output.slice(0, 160)}` : ''}`;
}

/** One set-up (a service, its nodes), started and warmed up; `round()` measures one batch. */
interface Setup {
  nodes: number;
  direct: boolean;
  label: string;
  round(index: number): Promise<void>;
  measured(): Measured;
  close(): Promise<void>;
}

async function startSetup(work: Workload, policyUrl: string, policyPid: number, dir: string, { nodes: nodeCount, direct }: SetupSpec): Promise<Setup> {
  const label =
    nodeCount === 0 ? 'service alone (--run-locally auto, no node)' : `--run-locally never + ${nodeCount} node${nodeCount > 1 ? 's' : ''}, ${direct ? 'direct to the backend' : 'turns via the service'}`;
  const nodes: NodeProcess[] = [];
  const service: ServiceProcess = await startService(policyUrl, join(dir, `store-${nodeCount}-${Math.random().toString(36).slice(2)}.db`), { args: ['--run-locally', nodeCount === 0 ? 'auto' : 'never'] });
  const close = async () => {
    for (const node of nodes) await stop(node.child);
    await stop(service.child);
  };
  try {
    for (let i = 0; i < nodeCount; i++) nodes.push(await startNode(service.url, ['--id', `bench-node-${i}`, ...(direct ? [] : ['--proxy-turns']), ...work.nodeArgs]));
    for (let done = 0; done < work.warmup; done += work.perRound) {
      await runBatch(service.url, Array.from({ length: Math.min(work.perRound, work.warmup - done) }, (_, i) => `warm-${done + i}`), work.task, () => true);
    }
  } catch (error) {
    await close();
    throw error;
  }
  const sum = async (pids: number[], cpu: (pid: number) => Promise<number>) => (await Promise.all(pids.map(cpu))).reduce((a, b) => a + b, 0);
  const cpuOf = async () => {
    const own = process.cpuUsage();
    // (the service's and the nodes' with their sandboxes: their fork servers and spawners reap them)
    return {
      service: await sum([service.pid], treeCpuSeconds),
      nodes: await sum(nodes.map((n) => n.pid), treeCpuSeconds),
      nodeEventLoop: await sum(nodes.map((n) => n.pid), mainThreadCpuSeconds),
      policy: await sum([policyPid], (pid) => cpuSeconds(pid, true)),
      client: (own.user + own.system) / 1e6,
    };
  };
  const rates: number[] = [];
  const cpu = { service: 0, nodes: 0, nodeEventLoop: 0, policy: 0, client: 0 };
  const ticks = { busy: 0, total: 0 };
  const unexpected: { count: number; first?: string } = { count: 0 };
  return {
    nodes: nodeCount,
    direct,
    label,
    async round(index) {
      const cpuBefore = await cpuOf();
      const ticksBefore = await machineTicks();
      // each rollout must end exactly once; one that ends otherwise than expected is counted, not fatal
      const batch = await runBatch(service.url, Array.from({ length: work.perRound }, (_, i) => `r${index}-${i}`), work.task, () => true);
      for (const result of batch.results) {
        if (work.check ? work.check(result) : result.state === 'done' && result.reward === 1) continue;
        unexpected.count++;
        unexpected.first ??= whyNot(result);
      }
      const cpuAfter = await cpuOf();
      const ticksAfter = await machineTicks();
      rates.push(work.perRound / batch.seconds);
      for (const key of Object.keys(cpu) as Array<keyof typeof cpu>) cpu[key] += cpuAfter[key] - cpuBefore[key];
      ticks.busy += ticksAfter.busy - ticksBefore.busy;
      ticks.total += ticksAfter.total - ticksBefore.total;
    },
    measured() {
      const per = (seconds: number) => (seconds / (rates.length * work.perRound)) * 1000;
      return {
        nodes: nodeCount,
        direct,
        rates,
        total: rates.length * work.perRound,
        cpu: { service: per(cpu.service), nodes: per(cpu.nodes), policy: per(cpu.policy), client: per(cpu.client) },
        nodeEventLoop: per(cpu.nodeEventLoop),
        machineBusy: ticks.busy / ticks.total,
        unexpected: unexpected.count,
        ...(unexpected.first ? { firstUnexpected: unexpected.first } : {}),
      };
    },
    close,
  };
}

function describe(label: string, m: Measured): string {
  return (
    `${label.padEnd(66)} ${m.rates.map((r) => r.toFixed(r < 100 ? 1 : 0)).join(', ')} rollouts/s;  CPU per rollout: service ${m.cpu.service.toFixed(2)} ms, nodes ${m.cpu.nodes.toFixed(2)} ms, ` +
    `policy ${m.cpu.policy.toFixed(2)} ms, this client ${m.cpu.client.toFixed(2)} ms;  machine ${(m.machineBusy * 100).toFixed(0)}% busy` +
    (m.unexpected > 0 ? `;  ${m.unexpected} of ${m.total} rollouts not as expected (first: ${m.firstUnexpected})` : '')
  );
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;

/**
 * Rollouts/s over all the measured rounds (equal rounds: the harmonic mean of their rates), the
 * rate the CPU per rollout, summed over the same rounds, turns into cores busy.
 */
const overallRate = (m: Measured): number => m.rates.length / m.rates.reduce((sum, rate) => sum + 1 / rate, 0);

function summary(measured: Measured[]): void {
  const cores = cpus().length;
  const name = (m: Measured) => (m.nodes === 0 ? 'alone' : `${m.nodes} node${m.nodes > 1 ? 's' : ''}${m.direct ? ' direct' : ''}`);
  const baseline = measured.find((m) => m.nodes === 0);
  console.log(
    `curve (median rollouts/s): ${measured.map((m) => `${name(m)} ${median(m.rates).toFixed(1)}${baseline && m !== baseline ? ` (${(median(m.rates) / median(baseline.rates)).toFixed(2)}× alone)` : ''}`).join('  ')}`,
  );
  const perRollout = (m: Measured) => m.cpu.service + m.cpu.nodes + m.cpu.policy + m.cpu.client;
  for (const m of measured) {
    const busy = (ms: number) => ((ms * overallRate(m)) / 1000).toFixed(2); // CPU ms per rollout × rollouts/s = cores busy
    console.log(
      `  ${name(m).padEnd(14)} cores busy: service ${busy(m.cpu.service)}, nodes ${busy(m.cpu.nodes)}, policy ${busy(m.cpu.policy)}, client ${busy(m.cpu.client)} ` +
        `= ${busy(perRollout(m))} of ${cores}; the whole machine ${(m.machineBusy * cores).toFixed(2)} of ${cores} (the rest: other processes on this host)`,
    );
  }
  const leastBusy = Math.min(...measured.map((m) => m.machineBusy));
  const growing = measured.length > 1 && measured.every((m, i) => i === 0 || perRollout(m) >= perRollout(measured[i - 1]!) * 0.95);
  const withNodes = measured.filter((m) => m.nodes > 0);
  const serviceCores = Math.max(...withNodes.map((m) => (m.cpu.service * overallRate(m)) / 1000));
  console.log(
    `bound: ${leastBusy > 0.9 ? `CPU — the machine's ${cores} cores were ≥${(leastBusy * 100).toFixed(0)}% busy in every set-up (other processes on this host included)` : `not CPU alone — the machine was only ${(leastBusy * 100).toFixed(0)}% busy in one set-up`}; ` +
      `CPU per rollout (service + nodes and their sandboxes + policy + client): ${measured.map((m) => `${name(m)} ${perRollout(m).toFixed(2)} ms`).join(', ')}${growing ? ', growing with the node count' : ''}; ` +
      `the service's own: ${measured.map((m) => `${name(m)} ${m.cpu.service.toFixed(2)}`).join(', ')} ms (alone: the rollouts it runs, sandboxes included; with nodes it still takes the submissions, the store and the stream, and, unless they are direct, every policy turn` +
      `${withNodes.length > 0 ? `, using at most ${serviceCores.toFixed(2)} of one core` : ''}). ` +
      `${growing ? 'On one host, more nodes add CPU per rollout, not capacity; ' : ''}with ${cores} whole cores to themselves the ceilings would be ~${measured.map((m) => `${name(m)} ${((cores * 1000) / perRollout(m)).toFixed(0)}`).join(', ')} rollouts/s.`,
  );
  if (baseline) {
    for (const m of withNodes.filter((n) => n.nodes === 4)) {
      console.log(
        `service CPU per rollout with 4 nodes (${m.direct ? 'direct' : 'via the service'}) ${m.cpu.service.toFixed(2)} ms vs alone ${baseline.cpu.service.toFixed(2)} ms: ` +
          `${m.cpu.service <= baseline.cpu.service ? 'at most the service alone (target met)' : `${(m.cpu.service / baseline.cpu.service).toFixed(2)}× the service alone (target: ≤ 1×)`}`,
      );
    }
  }
  for (const m of withNodes.filter((n) => n.nodes === Math.max(...withNodes.map((w) => w.nodes)))) console.log(efficiency(m, cores, name(m)));
}

/**
 * Scaling efficiency of a cluster from the measured CPU per rollout: each node on a host of its own
 * with `cores` cores (as this one) runs at most cores / (its CPU per rollout) rollouts/s (the
 * policy's GPUs apart: the fake policy's CPU is not counted), so N nodes ideally N times that; the
 * one service process does its part of every rollout on one core (its event loop), so the cluster
 * runs at most 1 / (the service's CPU per rollout). Efficiency at N = achieved / ideal =
 * min(1, service ceiling / (N × a node's rate)). Measured here with every process on one host.
 */
function efficiency(m: Measured, cores: number, label: string): string {
  // (the nodes' CPU per rollout is per rollout, whichever node ran it)
  const nodeRate = (cores * 1000) / Math.max(m.cpu.nodes, Number.EPSILON);
  const serviceCeiling = 1000 / m.cpu.service;
  const at = (n: number) => {
    const ideal = n * nodeRate;
    return `${n} nodes ${((Math.min(ideal, serviceCeiling) / ideal) * 100).toFixed(0)}% (${Math.min(ideal, serviceCeiling).toFixed(0)} of ${ideal.toFixed(0)} rollouts/s)`;
  };
  // a node process's own part of each rollout runs on its event loop, one core whatever the host
  // has: past the cores whose rollouts that loop keeps up with, a host needs more node processes
  const loop = Math.max(m.nodeEventLoop, Number.EPSILON);
  return (
    `scaling (${label}): a node's CPU per rollout ${m.cpu.nodes.toFixed(2)} ms → ${nodeRate.toFixed(0)} rollouts/s per ${cores}-core node; the service's ${m.cpu.service.toFixed(2)} ms → a ceiling of ${serviceCeiling.toFixed(0)} rollouts/s on one core; ` +
    `efficiency (achieved / ideal) at ${at(8)}, ${at(32)}; ` +
    `a node process's event loop (its main thread) ${m.nodeEventLoop.toFixed(2)} ms of it → at most ${(1000 / loop).toFixed(0)} rollouts/s per node process, ` +
    `the work of ≈ ${(m.cpu.nodes / loop).toFixed(1)} cores: a host with more runs one node process per that many`
  );
}

export default async function bench(): Promise<void> {
  const cores = cpus().length;
  const chosen = (process.env.NODES_BENCH_WORKLOADS ?? 'single,multi').split(',');
  const workloads = [...(chosen.includes('single') ? [singleTurn] : []), ...(chosen.includes('multi') ? [multiTurn()] : [])];
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-nodes-bench-'));
  try {
    for (const work of workloads) {
      heading(
        `rollout nodes: rollouts/s of the central service alone and with ${SETUPS.filter((s) => s.nodes > 0).map((s) => `${s.nodes}${s.direct ? ' direct' : ''}`).join(', ')} \`rollserve node\` on this host (${cores} cores shared by service, nodes, policy and client); ` +
          `${work.rounds}×${work.perRound.toLocaleString('en')} ${work.title} after ${work.warmup.toLocaleString('en')} of warm-up, zero-latency policy${work.nodeArgs.length ? `; nodes ${work.nodeArgs.join(' ')}` : ''}`,
      );
      console.log(`(${load()} at the start)`);
      const policy = await startPolicyProcess(work.policy);
      adopt(policy.child, 'policy');
      const setups: Setup[] = [];
      try {
        // every set-up up at once, their rounds interleaved: the load of other processes on this
        // host falls on each alike (the idle ones cost little: a long poll per node)
        for (const spec of SETUPS) setups.push(await startSetup(work, policy.url, policy.child.pid!, dir, spec));
        for (let round = 0; round < work.rounds; round++) for (const setup of setups) await setup.round(round);
        for (const setup of setups) console.log(describe(setup.label, setup.measured()));
        console.log(`(${load()} at the end)`);
        summary(setups.map((setup) => setup.measured()));
      } finally {
        for (const setup of setups) await setup.close();
        await stop(policy.child);
      }
    }
  } finally {
    await stopAll();
    await dispatcher.close();
    await rm(dir, { recursive: true, force: true });
  }
}
