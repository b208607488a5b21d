import { readdirSync, readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';
import { cpuSeconds } from './cluster.ts';
import { heading, latencyLine, percentile } from './stats.ts';
import { startToolsServer } from './tools.ts';

// `pnpm bench tool-overhead` (issue 28): the per-call cost of a tool call over HTTP at 16
// concurrent sessions. Our face: the NeMo Gym resources server's tool routes (/bash, /execute_python)
// in a process of its own (tool-overhead-server.mjs). The floor, measured in the same run: the least
// HTTP face over the same backend (tool-overhead-floor-server.mjs: node:http holding the same
// BashSession / PythonKernel on the same bwrap provider, no framework, validation or session
// registry). Each face: 16 sessions (16 sandboxes, each its own shell and kernel), closed-loop
// clients on undici keep-alive (one connection per session), a warm-up, then CALLS calls each,
// the two faces taking turns in slices so that a shared machine's drifting load weighs on both.
// Target: ours >= 0.8x the floor's calls/s, judged on the median of the rounds' ratios (each round
// one slice of each face back to back), which a load that ramps within the run moves less than the
// ratio of the totals (two runs at load 3 -> 26 gave bash 0.68 and 1.57 by totals; both printed). ROLLSERVE_BENCH_PROFILE=<dir> writes a `--cpu-prof`
// profile of each server.

const SESSIONS = 16;
const WARMUP = Number(process.env.ROLLSERVE_BENCH_TOOL_WARMUP ?? 500);
const CALLS = Number(process.env.ROLLSERVE_BENCH_TOOL_CALLS ?? 1_000);
const TARGET = 0.8;
const ROUNDS = Number(process.env.ROLLSERVE_BENCH_TOOL_ROUNDS ?? 20);

const OURS = fileURLToPath(new URL('./tool-overhead-server.mjs', import.meta.url));
const FLOOR = fileURLToPath(new URL('./tool-overhead-floor-server.mjs', import.meta.url));

interface Tool {
  name: string;
  path: string;
  body: string;
  /** What the answer must contain (bash `echo x` prints x; Python `1+1` is 2). */
  expect: string;
}

const TOOLS: Tool[] = [
  { name: 'bash echo x', path: '/bash', body: JSON.stringify({ command: 'echo x' }), expect: 'x' },
  { name: 'python 1+1', path: '/execute_python', body: JSON.stringify({ code: '1+1' }), expect: '2' },
];

interface Run {
  latencies: number[];
  /** calls/s of each round's slice, in round order. */
  slices: number[];
  callsPerS: number;
  /** CPU of the server process per call (the sandboxes' shells and kernels are not in it). */
  serverCpuMsPerCall: number;
}

/** Every process under `root` (the server's sandboxes, shells and kernels). */
function descendants(root: number): number[] {
  const out: number[] = [];
  const stack = [root];
  while (stack.length > 0) {
    const pid = stack.pop()!;
    let tasks: string[] = [];
    try {
      tasks = readdirSync(`/proc/${pid}/task`);
    } catch {
      continue;
    }
    for (const tid of tasks) {
      try {
        const children = readFileSync(`/proc/${pid}/task/${tid}/children`, 'latin1').trim().split(/\s+/).filter(Boolean).map(Number);
        out.push(...children);
        stack.push(...children);
      } catch {
        // gone
      }
    }
  }
  return out;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

const commandLine = (pid: number) => {
  try {
    return `${pid} ${readFileSync(`/proc/${pid}/cmdline`, 'latin1').replaceAll('\0', ' ').trim()}`;
  } catch {
    return `${pid}`;
  }
};

interface Face {
  name: string;
  pid: number;
  pool: Pool;
  cookies: string[];
  stop(): Promise<void>;
}

/** A face's server started and its 16 sessions seeded (a cookie each). */
async function startFace(name: string, script: string): Promise<Face> {
  const server = await startToolsServer([script]);
  const pool = new Pool(server.url, { connections: SESSIONS, pipelining: 1, keepAliveTimeout: 30_000 });
  const stopFace = async () => {
    const spawned = descendants(server.pid);
    await pool.close();
    await server.stop();
    // the server ends its sessions on SIGTERM; a sandbox's last processes end on their parent's
    // death signal, a moment after it; what is still there after that is a leak
    let left = spawned.filter(alive);
    for (let i = 0; i < 50 && left.length > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      left = left.filter(alive);
    }
    if (left.length > 0) console.log(`  LEAK: ${left.length} processes of ${name} still alive 5 s after it stopped: ${left.map(commandLine).join(' | ')}`);
  };
  try {
    const cookies = await Promise.all(
      Array.from({ length: SESSIONS }, async () => {
        const seeded = await pool.request({ path: '/seed_session', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
        await seeded.body.text();
        const setCookie = seeded.headers['set-cookie'];
        return (Array.isArray(setCookie) ? setCookie : [setCookie ?? '']).map((c) => String(c).split(';')[0]).join('; ');
      }),
    );
    return { name, pid: server.pid, pool, cookies, stop: stopFace };
  } catch (error) {
    await stopFace();
    throw error;
  }
}

/** Every session of `face` calling `tool` `calls` times in a closed loop, all at once. */
async function loops(face: Face, tool: Tool, calls: number, into?: { latencies: number[]; wallMs: number; cpuS: number; slices: number[] }): Promise<void> {
  const call = async (cookie: string) => {
    const response = await face.pool.request({ path: tool.path, method: 'POST', headers: { 'content-type': 'application/json', cookie }, body: tool.body });
    const text = await response.body.text();
    if (response.statusCode !== 200 || !text.includes(tool.expect)) throw new Error(`${face.name} ${tool.path}: ${response.statusCode} ${text}`);
  };
  const cpuBefore = await cpuSeconds(face.pid);
  const started = performance.now();
  await Promise.all(face.cookies.map(async (cookie) => {
    for (let i = 0; i < calls; i++) {
      const t = performance.now();
      await call(cookie);
      into?.latencies.push(performance.now() - t);
    }
  }));
  if (into) {
    const wallMs = performance.now() - started;
    into.slices.push((face.cookies.length * calls * 1000) / wallMs);
    into.wallMs += wallMs;
    into.cpuS += (await cpuSeconds(face.pid)) - cpuBefore;
  }
}

export default async function bench(): Promise<void> {
  heading(`tool-overhead: per-call tool overhead over HTTP, ${SESSIONS} concurrent sessions (issue 28; each its own sandbox, shell and kernel; closed loops on undici keep-alive; ${WARMUP} calls of warm-up then ${CALLS} each)`);
  const load = () => loadavg().map((l) => l.toFixed(2)).join(' ');
  console.log(`load average before: ${load()}`);
  // Both servers stay up (an idle one costs nothing) and take turns, in ROUNDS slices of CALLS/ROUNDS
  // in the order ours, floor, floor, ours, ..., so that the load of a shared machine, which drifts
  // over a minute, weighs on both alike.
  const faces: Face[] = [];
  const ours = new Map<string, Run>();
  const floor = new Map<string, Run>();
  try {
    faces.push(await startFace('the resources server', OURS));
    faces.push(await startFace('the floor server', FLOOR));
    for (const tool of TOOLS) {
      for (const face of faces) await loops(face, tool, WARMUP);
      const acc = faces.map(() => ({ latencies: [] as number[], wallMs: 0, cpuS: 0, slices: [] as number[] }));
      for (let round = 0; round < ROUNDS; round++) {
        const order = round % 2 === 0 ? [0, 1] : [1, 0];
        for (const i of order) await loops(faces[i]!, tool, CALLS / ROUNDS, acc[i]);
      }
      const runOf = ({ latencies, wallMs, cpuS, slices }: { latencies: number[]; wallMs: number; cpuS: number; slices: number[] }): Run => ({
        latencies,
        slices,
        callsPerS: (latencies.length / wallMs) * 1000,
        serverCpuMsPerCall: (cpuS * 1000) / latencies.length,
      });
      ours.set(tool.name, runOf(acc[0]!));
      floor.set(tool.name, runOf(acc[1]!));
    }
  } finally {
    for (const face of faces) await face.stop();
  }
  const cpu = (run: Run) => `server ${run.serverCpuMsPerCall.toFixed(3)} ms CPU/call`;
  for (const tool of TOOLS) {
    const o = ours.get(tool.name)!;
    const f = floor.get(tool.name)!;
    const ratio = o.callsPerS / f.callsPerS;
    const rounds = o.slices.map((rate, i) => rate / f.slices[i]!);
    const sorted = [...rounds].sort((a, b) => a - b);
    const median = (sorted[(sorted.length - 1) >> 1]! + sorted[sorted.length >> 1]!) / 2;
    console.log(`\n${tool.name}:`);
    console.log(`  rollserve NeMo Gym face (resources server)     ${o.callsPerS.toFixed(0).padStart(6)} calls/s  ${latencyLine(o.latencies)}  (${cpu(o)})`);
    console.log(`  floor: node:http + the same sessions           ${f.callsPerS.toFixed(0).padStart(6)} calls/s  ${latencyLine(f.latencies)}  (${cpu(f)})`);
    console.log(
      `  ours/floor throughput: median of ${rounds.length} rounds ${median.toFixed(3)} (target >= ${TARGET}: ${median >= TARGET ? 'met' : 'NOT met'}; ` +
        `rounds ${Math.min(...rounds).toFixed(2)}-${Math.max(...rounds).toFixed(2)}; totals ${ratio.toFixed(3)})  ` +
        `p50 +${(percentile(o.latencies, 50) - percentile(f.latencies, 50)).toFixed(2)} ms, ` +
        `server CPU +${(o.serverCpuMsPerCall - f.serverCpuMsPerCall).toFixed(3)} ms/call over the floor`,
    );
  }
  console.log(`\nload average after: ${load()}`);
}
