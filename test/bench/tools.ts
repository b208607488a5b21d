import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { promisify } from 'node:util';
import { Pool } from 'undici';
import { z } from 'zod';
import { cgroupSupport, createBwrapProvider, type Sandbox } from '../../packages/core/src/sandbox/index.ts';
import { BashSession, bashTool, PythonKernel } from '../../packages/core/src/tools/index.ts';
import { heading, latencyLine, percentile } from './stats.ts';

// `pnpm bench tools`: the tool backends side by side in one run (issue 3): the bash tool over the
// NeMo Gym HTTP face, the bash backend alone, the same command through tmux driven the way
// tmux-based agent runtimes do it, the Python kernel, the bwrap sandbox lifecycle, 200 concurrent
// sandbox sessions, and the memory of an idle bash session.

const run = promisify(execFile);

async function timeIt(n: number, fn: (i: number) => Promise<void>, warmup = Math.min(50, n)): Promise<number[]> {
  for (let i = 0; i < warmup; i++) await fn(-1 - i);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const start = performance.now();
    await fn(i);
    out.push(performance.now() - start);
  }
  return out;
}

/**
 * `echo hi` through tmux as tmux-based runtimes drive it: send-keys, then capture-pane until the
 * output shows up, polling every millisecond (tmux at its best). A private server (-L) that is
 * killed at the end.
 */
async function tmuxLatencies(n: number): Promise<number[]> {
  const socket = `rollserve-bench-${process.pid}-${Date.now()}`;
  const tmux = (...args: string[]) => run('tmux', ['-L', socket, ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', TERM: 'xterm' } });
  await tmux('-f', '/dev/null', 'new-session', '-d', '-s', 'bench', '-x', '200', '-y', '50', 'bash --noprofile --norc');
  try {
    return await timeIt(n, async (i) => {
      const id = i + 100_000;
      // the echoed command line shows "$((id+0))"; only the output shows the number itself
      await tmux('send-keys', '-t', 'bench', `echo hi; echo DONE_$((${id}+0))`, 'Enter');
      const done = new RegExp(`^DONE_${id}$`, 'm');
      for (;;) {
        const { stdout } = await tmux('capture-pane', '-p', '-t', 'bench');
        if (done.test(stdout)) break;
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
    }, 20);
  } finally {
    await tmux('kill-server').catch(() => undefined);
  }
}

/** All descendants of this process (the sandboxes, shells and kernels it started). */
function descendants(root = process.pid): number[] {
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

function memoryOf(pids: number[]): { pssKb: number; rssKb: number } {
  let pssKb = 0;
  let rssKb = 0;
  for (const pid of pids) {
    try {
      pssKb += Number(/^Pss:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'latin1'))?.[1] ?? 0);
      rssKb += Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'latin1'))?.[1] ?? 0);
    } catch {
      // exited
    }
  }
  return { pssKb, rssKb };
}

/**
 * Latencies of one tool over a NeMo Gym resources server at `url` (a session cookie is taken from
 * `/seed_session` and re-sent), for measuring a server in a process of its own.
 */
export async function measureToolOverHttp(
  url: string,
  tool: string,
  body: unknown,
  n: number,
): Promise<number[]> {
  const pool = new Pool(url, { connections: 1, pipelining: 1 });
  try {
    const seeded = await pool.request({ path: '/seed_session', method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    await seeded.body.text();
    const setCookie = seeded.headers['set-cookie'];
    const cookie = (Array.isArray(setCookie) ? setCookie : [setCookie ?? '']).map((c) => String(c).split(';')[0]).join('; ');
    const payload = JSON.stringify(body);
    return await timeIt(n, async () => {
      const response = await pool.request({
        path: `/${tool}`,
        method: 'POST',
        headers: { 'content-type': 'application/json', cookie },
        body: payload,
      });
      const text = await response.body.text();
      if (response.statusCode !== 200) throw new Error(`${tool}: ${response.statusCode} ${text}`);
    });
  } finally {
    await pool.close();
  }
}

/** The bash tool over HTTP through an in-process resources server for an environment listing it. */
async function bashOverHttp(n: number): Promise<number[]> {
  const gym = (await import('../../packages/core/src/gym/index.ts')) as any;
  const spec = (await import('../../packages/core/src/spec/index.ts')) as any;
  const env = spec.defineEnvironment({
    name: 'bench_tools',
    domain: 'other',
    row: z.object({}),
    tools: { bash: bashTool },
    verify: () => ({ reward: 0 }),
  });
  const level = process.env.ROLLSERVE_LOG_LEVEL;
  process.env.ROLLSERVE_LOG_LEVEL = 'silent';
  const app = gym.createResourcesServer(env, {});
  if (level === undefined) delete process.env.ROLLSERVE_LOG_LEVEL;
  else process.env.ROLLSERVE_LOG_LEVEL = level;
  const server = await gym.serveFetch(app, { port: 0 });
  try {
    return await measureToolOverHttp(server.url, 'bash', { command: 'echo hi' }, n);
  } finally {
    await server.close();
    await app.close();
  }
}

export default async function bench(): Promise<void> {
  heading('tools: echo hi / 1+1 latencies (one run, side by side)');
  const provider = createBwrapProvider();
  const rows: Array<[string, number[]]> = [];

  let http: number[] | undefined;
  try {
    http = await bashOverHttp(1000);
  } catch (error) {
    console.log(`bash tool over HTTP: skipped (${(error as Error).message})`);
  }
  if (http !== undefined) rows.push(['bash tool over HTTP (NeMo Gym face, in-process server)', http]);

  const sandbox = await provider.create();
  let bashTimes: number[];
  let pythonTimes: number[];
  try {
    const bash = await BashSession.start(sandbox);
    bashTimes = await timeIt(2000, async () => {
      const r = await bash.run('echo hi');
      if (r.output !== 'hi\n') throw new Error(`bash: ${JSON.stringify(r)}`);
    });
    await bash.close();
    const kernel = await PythonKernel.start(sandbox);
    pythonTimes = await timeIt(2000, async () => {
      const r = await kernel.run('1+1');
      if (r.result !== '2') throw new Error(`python: ${JSON.stringify(r)}`);
    });
    await kernel.close();
  } finally {
    await sandbox.close();
  }
  rows.push(['bash backend alone (PTY + marker)', bashTimes]);
  const tmuxTimes = await tmuxLatencies(300);
  rows.push(['tmux send-keys + capture-pane (1 ms polling)', tmuxTimes]);
  rows.push(['python kernel 1+1 (Unix socket)', pythonTimes]);
  const lifecycle = await timeIt(200, async () => {
    const s = await provider.create();
    const r = await s.exec('echo hi');
    if (r.stdout !== 'hi\n') throw new Error(`exec: ${JSON.stringify(r)}`);
    await s.close();
  }, 10);
  rows.push(['bwrap sandbox create + first command + close (cold)', lifecycle]);
  if (cgroupSupport() !== null) {
    const noCgroup = createBwrapProvider({ cgroups: false });
    rows.push([
      '  the same without the per-sandbox cgroup',
      await timeIt(200, async () => {
        const s = await noCgroup.create();
        if ((await s.exec('echo hi')).stdout !== 'hi\n') throw new Error('exec');
        await s.close();
      }, 10),
    ]);
  }
  const warmProvider = createBwrapProvider({ warm: 2 });
  await new Promise((resolve) => setTimeout(resolve, 200));
  try {
    const warmLifecycle = await timeIt(200, async () => {
      const s = await warmProvider.create();
      const r = await s.exec('echo hi');
      if (r.stdout !== 'hi\n') throw new Error(`exec: ${JSON.stringify(r)}`);
      await s.close();
    }, 10);
    rows.push(['  the same with 2 warm sandboxes kept ready', warmLifecycle]);
  } finally {
    await warmProvider.close?.();
  }

  const width = Math.max(...rows.map(([name]) => name.length));
  console.log(
    `per-sandbox cgroup: ${cgroupSupport() === null ? 'none here (rlimit fallback)' : `v${cgroupSupport()}`}; ` +
      'target (issue 10): create+exec+close and bash over HTTP within 20 % of 892c5cf (before the stronger isolation) measured on the same machine at the same time',
  );
  for (const [name, times] of rows) console.log(`${name.padEnd(width)}  ${latencyLine(times)}`);
  const bashP50 = percentile(bashTimes, 50);
  const tmuxP50 = percentile(tmuxTimes, 50);
  console.log(
    `ratio bash/tmux (p50): ${(bashP50 / tmuxP50).toFixed(3)}  (the PTY backend is ${(tmuxP50 / bashP50).toFixed(1)}x faster; p99 ${(percentile(tmuxTimes, 99) / percentile(bashTimes, 99)).toFixed(1)}x)`,
  );

  heading('tools: 200 concurrent sandbox sessions (sandbox + bash), 5 commands each');
  const count = 200;
  const sessions: Array<{ sandbox: Sandbox; bash?: BashSession }> = [];
  let errors = 0;
  const started = performance.now();
  const commandTimes: number[] = [];
  try {
    await Promise.all(
      Array.from({ length: count }, async (_, i) => {
        try {
          const s = await provider.create();
          const entry: { sandbox: Sandbox; bash?: BashSession } = { sandbox: s };
          sessions.push(entry);
          entry.bash = await BashSession.start(s);
          const expected: Array<[string, string]> = [
            [`echo ${i}`, `${i}\n`],
            ['cd /tmp && pwd', '/tmp\n'],
            ['pwd', '/tmp\n'],
            [`export N=${i}; echo $((N * 2))`, `${i * 2}\n`],
            ['ls -d /workspace', '/workspace\n'],
          ];
          for (const [command, output] of expected) {
            const t = performance.now();
            const r = await entry.bash.run(command, { timeoutMs: 60_000 });
            commandTimes.push(performance.now() - t);
            if (r.output !== output || r.exitCode !== 0) {
              errors++;
              console.log(`session ${i}: ${command} -> ${JSON.stringify(r)}`);
            }
          }
        } catch (error) {
          errors++;
          console.log(`session ${i}: ${(error as Error).message}`);
        }
      }),
    );
    const elapsed = performance.now() - started;
    console.log(`sessions ${sessions.length}/${count}  errors ${errors}  wall ${(elapsed / 1000).toFixed(2)} s  per command ${latencyLine(commandTimes)}`);

    heading('tools: memory per idle bash session (bwrap + exec agent + nsenter + bash)');
    const pids = descendants();
    const { pssKb, rssKb } = memoryOf(pids);
    const live = sessions.filter((s) => s.bash !== undefined).length;
    console.log(
      `${live} idle sessions, ${pids.length} processes: PSS ${(pssKb / 1024 / live).toFixed(2)} MiB per session, RSS ${(rssKb / 1024 / live).toFixed(2)} MiB per session (RSS counts shared libraries once per process)`,
    );
  } finally {
    await Promise.all(sessions.map(async (s) => {
      await s.bash?.close();
      await s.sandbox.close();
    }));
  }
  const left = descendants().map((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'latin1').replaceAll('\0', ' ').trim();
    } catch {
      return '';
    }
  }).filter((cmd) => cmd !== '' && !cmd.includes('esbuild')); // tsx's own esbuild service
  console.log(`after close: ${left.length} child processes left${left.length > 0 ? `: ${left.join(' | ')}` : ''}`);
}
