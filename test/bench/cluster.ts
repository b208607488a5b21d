import { spawn, type ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Agent, request } from 'undici';
import { childrenOf } from '../../packages/core/src/sandbox/process.ts';

// What the service-memory, nodes and node-loss benches share: `rollserve start` and `rollserve node`
// as child processes (the way users run them), tasks over HTTP, results from the NDJSON stream, and
// each process's CPU and memory from /proc. Every child started here is tracked: `stopAll()` ends
// them, and they are SIGKILLed if the bench process exits first.

const CLI = fileURLToPath(new URL('../../packages/cli/bin/rollserve.js', import.meta.url));
const TICKS_PER_S = 100; // USER_HZ on Linux

const children = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
});

const stopping = new WeakSet<ChildProcess>();

function track(child: ChildProcess, name: string): ChildProcess {
  children.add(child);
  child.once('exit', (code, signal) => {
    children.delete(child);
    if (!stopping.has(child)) console.error(`(${name}, pid ${child.pid}, exited by itself: ${signal ?? `code ${code}`})`);
  });
  return child;
}

/** Tracks a child started elsewhere (the policy process), so that `stopAll()` and the exit ends it too. */
export const adopt = (child: ChildProcess, name: string): ChildProcess => track(child, name);

/**
 * Spawns `node ...argv`, tracked, and resolves with the first stdout line matching `ready` (its
 * first group); rejects with what it printed if it exits first.
 */
export function spawnReady(
  argv: string[],
  ready: RegExp,
  { name, env = {}, cwd, onOutput }: { name: string; env?: NodeJS.ProcessEnv; cwd?: string; onOutput?: (chunk: Buffer) => void },
): Promise<{ child: ChildProcess; match: string }> {
  const child = track(
    spawn(process.execPath, argv, {
      ...(cwd ? { cwd } : {}),
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, ROLLSERVE_LOG_LEVEL: process.env.ROLLSERVE_BENCH_LOG_LEVEL ?? 'silent', ...env },
    }),
    name,
  );
  if (onOutput) child.stdout!.on('data', onOutput);
  return new Promise((resolve, reject) => {
    let seen = '';
    const onData = (chunk: Buffer) => {
      seen += chunk.toString();
      const match = ready.exec(seen);
      if (match) {
        child.stdout!.off('data', onData);
        child.stdout!.resume();
        child.off('exit', onExit);
        resolve({ child, match: match[1]! });
      }
    };
    const onExit = (code: number | null) => reject(new Error(`${name} exited with ${code}: ${seen}`));
    child.stdout!.on('data', onData);
    child.once('exit', onExit);
  });
}

/** Spawns the CLI and resolves with the first stdout line matching `ready` (its first group). */
function spawnCli(nodeArgs: string[], cliArgs: string[], ready: RegExp, env: NodeJS.ProcessEnv = {}, cwd?: string, onOutput?: (chunk: Buffer) => void): Promise<{ child: ChildProcess; match: string }> {
  return spawnReady([...nodeArgs, CLI, ...cliArgs], ready, { name: `rollserve ${cliArgs[0]}`, env, ...(cwd ? { cwd } : {}), ...(onOutput ? { onOutput } : {}) });
}

export interface ServiceProcess {
  url: string;
  child: ChildProcess;
  pid: number;
}

/**
 * `rollserve start --port 0 --llm <policy> --store sqlite://<store> ...args`, in the store's directory
 * (no journal of an earlier rollserve there to import). `storeUrl` puts another store in its place.
 */
export async function startService(
  policyUrl: string,
  store: string,
  {
    args = [],
    nodeArgs = [],
    env = {},
    storeUrl = `sqlite://${store}`,
    onOutput,
  }: { args?: string[]; nodeArgs?: string[]; env?: NodeJS.ProcessEnv; storeUrl?: string; /** every chunk of its stdout, from its start */ onOutput?: (chunk: Buffer) => void } = {},
): Promise<ServiceProcess> {
  const cliArgs = ['start', '--port', '0', '--llm', policyUrl, '--store', storeUrl, '--journal', join(dirname(store), 'no-journal.jsonl'), ...args];
  const { child, match } = await spawnCli(nodeArgs, cliArgs, /^rollouts\s+(http:\/\/\S+)/m, env, dirname(store), onOutput);
  return { url: match, child, pid: child.pid! };
}

export interface NodeProcess {
  nodeId: string;
  child: ChildProcess;
  pid: number;
}

/** `rollserve node --service <url> ...args`; resolves once it has registered. */
export async function startNode(serviceUrl: string, args: string[] = []): Promise<NodeProcess> {
  const { child, match } = await spawnCli([], ['node', '--service', serviceUrl, ...args], /^node (\S+) registered with/m);
  return { nodeId: match, child, pid: child.pid! };
}

/** Sends `signal` and waits for the exit (SIGKILL after 20 s). */
export async function stop(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  stopping.add(child);
  child.kill(signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
  await exited;
  clearTimeout(timer);
}

/** Stops every child started here (nodes first, so that they leave while the service is up). */
export async function stopAll(first: readonly ChildProcess[] = []): Promise<void> {
  for (const child of first) await stop(child);
  await Promise.all([...children].map((child) => stop(child)));
}

/**
 * User + system CPU seconds of a process (its threads included), from /proc/PID/stat; with
 * `children`, also those of its children that have ended and been waited for (sandboxes).
 */
export async function cpuSeconds(pid: number, children = false): Promise<number> {
  const fields = (await readFile(`/proc/${pid}/stat`, 'latin1')).split(') ')[1]!.split(' ');
  const own = Number(fields[11]) + Number(fields[12]); // utime, stime
  return (children ? own + Number(fields[13]) + Number(fields[14]) : own) / TICKS_PER_S; // cutime, cstime
}

/**
 * User + system CPU seconds of a process's main thread alone (/proc/PID/task/PID/stat): for a Node
 * process, its event loop, without V8's and libuv's threads.
 */
export async function mainThreadCpuSeconds(pid: number): Promise<number> {
  const fields = (await readFile(`/proc/${pid}/task/${pid}/stat`, 'latin1')).split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / TICKS_PER_S;
}

/**
 * CPU seconds of a process and of everything under it that lives on: each live descendant's own
 * and its waited-for children's. A service's sandboxes are reaped by helpers that live as long as
 * it does (its kernel fork servers, its spawners), so `cpuSeconds(pid, true)` sees their CPU only
 * once those end; this sees it as it is spent (the processes of sandboxes still running included).
 */
export async function treeCpuSeconds(pid: number): Promise<number> {
  let total = 0;
  const queue = [pid];
  while (queue.length > 0) {
    const next = queue.pop()!;
    try {
      total += await cpuSeconds(next, true);
    } catch {
      continue; // ended meanwhile: its parent's waited-for children hold it (or will)
    }
    queue.push(...childrenOf(next));
  }
  return total;
}

/** Resident memory of a process in bytes (VmRSS in /proc/PID/status). */
export async function rssBytes(pid: number): Promise<number> {
  const match = /^VmRSS:\s+(\d+) kB/m.exec(await readFile(`/proc/${pid}/status`, 'latin1'));
  if (!match) throw new Error(`no VmRSS for ${pid}`);
  return Number(match[1]) * 1024;
}

/** Busy and total CPU time of the whole machine (all cores, in ticks), from /proc/stat. */
export async function machineTicks(): Promise<{ busy: number; total: number }> {
  const line = (await readFile('/proc/stat', 'latin1')).split('\n')[0]!;
  const values = line.trim().split(/\s+/).slice(1).map(Number);
  const total = values.reduce((a, b) => a + b, 0);
  const idle = (values[3] ?? 0) + (values[4] ?? 0); // idle + iowait
  return { busy: total - idle, total };
}

export const load = () => `load average ${loadavg().map((l) => l.toFixed(2)).join(' ')}`;

export const dispatcher = new Agent({ connections: 16, keepAliveTimeout: 30_000, headersTimeout: 0, bodyTimeout: 0 });

export const mathTask = (id: string) => ({
  id,
  env: 'math',
  row: { responses_create_params: { input: `What is 3+5? (${id})` }, question: 'What is 3+5?', expected_answer: '8' },
  policy: { model: 'fake-policy' },
});

export type WireResult = Record<string, unknown> & { id: string; task_id: string; state: string; reward: number };

export async function getJson<T>(url: string): Promise<T> {
  const response = await request(url, { dispatcher });
  if (response.statusCode !== 200) throw new Error(`GET ${url}: ${response.statusCode} ${await response.body.text()}`);
  return (await response.body.json()) as T;
}

/** POST /v1/rollouts; throws unless 202. */
export async function submit(url: string, tasks: object[]): Promise<void> {
  const submitted = await request(`${url}/v1/rollouts`, {
    dispatcher,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ tasks }),
  });
  if (submitted.statusCode !== 202) throw new Error(`submit: ${submitted.statusCode} ${await submitted.body.text()}`);
  await submitted.body.dump();
}

/**
 * Reads GET /v1/rollouts/stream (`?ids=` when given: it ends when all of them are finished; without,
 * it runs until `close()`) and calls `onResult` for each line. Does not wait for the response: the
 * service sends its headers with the first result.
 */
export function openStream(url: string, onResult: (result: WireResult) => void, ids?: readonly string[]): { done: Promise<void>; close: () => void } {
  const controller = new AbortController();
  const done = (async () => {
    let buffered = '';
    try {
      const response = await request(`${url}/v1/rollouts/stream${ids ? `?ids=${ids.join(',')}` : ''}`, { dispatcher, signal: controller.signal });
      if (response.statusCode !== 200) throw new Error(`stream: ${response.statusCode} ${await response.body.text()}`);
      for await (const chunk of response.body) {
        buffered += chunk.toString();
        let newline: number;
        while ((newline = buffered.indexOf('\n')) >= 0) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          if (line.trim()) onResult(JSON.parse(line) as WireResult);
        }
      }
    } catch (error) {
      if (!controller.signal.aborted) throw error;
    }
  })();
  done.catch(() => undefined); // (rejects for whoever awaits it; not an unhandled rejection before that)
  return { done, close: () => controller.abort() };
}

/**
 * Submits a task per id (single-turn math by default) and reads their results; throws unless each
 * ends exactly once and passes `check` (by default: done with reward 1).
 */
export async function runBatch(url: string, ids: readonly string[], task: (id: string) => object = mathTask, check: (result: WireResult) => boolean = rewarded): Promise<{ seconds: number; results: WireResult[] }> {
  const started = performance.now();
  await submit(url, ids.map(task));
  const results: WireResult[] = [];
  await openStream(url, (r) => results.push(r), ids).done;
  const seconds = (performance.now() - started) / 1000;
  checkResults(ids, results, check);
  return { seconds, results };
}

const rewarded = (r: WireResult) => r.state === 'done' && r.reward === 1;

/** Exactly one result per id, each passing `check` (by default: done with reward 1). */
export function checkResults(ids: readonly string[], results: readonly WireResult[], check: (result: WireResult) => boolean = rewarded): void {
  const seen = new Map<string, number>();
  for (const r of results) seen.set(r.task_id, (seen.get(r.task_id) ?? 0) + 1);
  const missing = ids.filter((id) => !seen.has(id));
  const twice = [...seen].filter(([, n]) => n > 1);
  if (missing.length > 0 || twice.length > 0 || results.length !== ids.length) {
    throw new Error(`${results.length} results for ${ids.length} tasks: ${missing.length} missing (${missing.slice(0, 3).join(', ')}), ${twice.length} more than once`);
  }
  const wrong = results.filter((r) => !check(r));
  if (wrong.length > 0) {
    const { state, reward, critical_error, error, turns } = wrong[0]!;
    const calls = (turns as Array<{ tool_calls: Array<{ name: string; status: string; output: string }> }> | undefined)?.map((t) => t.tool_calls.map((c) => ({ name: c.name, status: c.status, output: c.output.slice(0, 200) })));
    throw new Error(`${wrong.length} of ${results.length} results not as expected, e.g. ${wrong[0]!.id}: ${JSON.stringify({ state, reward, critical_error, error, calls })}`);
  }
}

export interface WireNode {
  node_id: string;
  pid: number;
  leases: number;
  state: 'up' | 'lost' | 'left';
}

export const listNodes = async (url: string) => (await getJson<{ nodes: WireNode[] }>(`${url}/v1/nodes`)).nodes;

/** Polls `check` every `everyMs` until it returns a value (not undefined); throws after `timeoutMs`. */
export async function pollUntil<T>(what: string, check: () => Promise<T | undefined>, everyMs = 100, timeoutMs = 60_000): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}
