import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { chmod, mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { removeStaleSandboxDirs } from '@rollserve/core/sandbox';
import { serveFetch } from '@rollserve/core/gym';
import type { NodeEvent, RolloutNodeOptions } from '@rollserve/core/node';
import { createRolloutApi, LlmBackendPool, PoolModelProvider, RolloutService, type RolloutResult, type RolloutServiceOptions } from '@rollserve/core/service';
import { call, shellEnvironment, startFakePolicy, workspaceRoot, type FakePolicy } from '@rollserve/testing';
import { request } from 'undici';

/** What a test started, stopped in reverse order by `cleanup()` (afterEach). */
export class Resources {
  readonly #stops: Array<() => Promise<void>> = [];

  add(stop: () => Promise<void>): void {
    this.#stops.push(stop);
  }

  async cleanup(): Promise<void> {
    while (this.#stops.length) await this.#stops.pop()!();
  }
}

/**
 * The scripted policy of the shell environment: the first turn runs `echo tag-<tag>` in the
 * sandbox (after `sleep` seconds: a rollout that holds its sandbox that long), the second ends.
 */
export async function startShellPolicy(resources: Resources): Promise<FakePolicy & { sleep: number }> {
  const state = { sleep: 0 };
  const fake = await startFakePolicy({
    script: (req) => {
      const messages = req.messages as Array<{ role: string; content?: unknown }>;
      if (messages.some((m) => m.role === 'tool')) return 'done';
      const tag = /tag (\w+)/.exec(JSON.stringify(messages))![1]!;
      return { toolCalls: [{ name: 'bash', arguments: { command: state.sleep > 0 ? `sleep ${state.sleep}; echo tag-${tag}` : `echo tag-${tag}` } }] };
    },
  });
  resources.add(() => fake.close());
  return Object.defineProperty(fake, 'sleep', { get: () => state.sleep, set: (value: number) => (state.sleep = value) }) as FakePolicy & { sleep: number };
}

export interface TestService {
  url: string;
  service: RolloutService;
  /** Every result the service committed, in order (a rollout twice here is a duplicate). */
  results: RolloutResult[];
  /** Stops it (what nodes hold stays theirs in the store); also done at cleanup. */
  close(): Promise<void>;
}

/** The central service on loopback with the shell environment; only nodes run rollouts. */
export async function startService(
  resources: Resources,
  llm: string | readonly string[],
  options: Partial<RolloutServiceOptions> & { token?: string; nodeToken?: string; port?: number } = {},
): Promise<TestService> {
  const { token, nodeToken, port, ...serviceOptions } = options;
  const backends = new LlmBackendPool();
  for (const baseUrl of typeof llm === 'string' ? [llm] : llm) backends.add({ baseUrl });
  const models = new PoolModelProvider(backends);
  const service = await RolloutService.create({
    environments: [shellEnvironment],
    models,
    heartbeatMs: 250,
    nodeTimeoutMs: 3_000,
    leaseMs: 10_000,
    runLocally: 'never',
    ...serviceOptions,
  });
  const results: RolloutResult[] = [];
  service.onResult((result) => results.push(result));
  const running = await serveFetch(createRolloutApi(service, { backends, ...(token ? { token } : {}), ...(nodeToken ? { nodeToken } : {}) }), { port: port ?? 0 });
  let closed: Promise<void> | undefined;
  const close = () =>
    (closed ??= (async () => {
      await running.close();
      await service.close();
      await models.close();
    })());
  resources.add(close);
  return { url: running.url, service, results, close };
}

/** A directory for the sandboxes of node processes (TMPDIR), swept and removed at cleanup. */
export async function sandboxDir(resources: Resources): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-node-'));
  // the sandbox uid (nobody, under root) makes its mounts from there
  await chmod(dir, 0o755);
  const sandboxes = join(dir, 'sandboxes');
  await mkdir(sandboxes);
  await chmod(sandboxes, 0o755);
  resources.add(async () => {
    const left = (await readdir(sandboxes)).filter((name) => name.startsWith('rollserve-rs-')).map((name) => name.slice('rollserve-'.length));
    if (left.length > 0) await removeStaleSandboxDirs({ tmpDir: sandboxes, minAgeMs: 0, ids: left });
    await rm(dir, { recursive: true, force: true });
  });
  return sandboxes;
}

export interface NodeProcess {
  child: ChildProcess;
  pid: number;
  events: NodeEvent[];
  output: () => string;
  /** Resolves with the first event (from the start) that fits; rejects if the process exits first. */
  waitFor<T extends NodeEvent['type']>(type: T, fits?: (event: Extract<NodeEvent, { type: T }>) => boolean): Promise<Extract<NodeEvent, { type: T }>>;
  /** Resolves once `count` events fit. */
  waitForCount<T extends NodeEvent['type']>(type: T, count: number, fits?: (event: Extract<NodeEvent, { type: T }>) => boolean): Promise<Array<Extract<NodeEvent, { type: T }>>>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * A node (fixtures/node-agent.ts, or `agent`: another fixture) in a child process, with `env`
 * over the test's environment; resolves once it has registered.
 */
export async function startNode(
  resources: Resources,
  options: Omit<RolloutNodeOptions, 'environments' | 'onEvent'>,
  sandboxes: string,
  { agent = 'node-agent.ts', env = {} }: { agent?: string; env?: Record<string, string> } = {},
): Promise<NodeProcess> {
  const script = fileURLToPath(new URL(`./fixtures/${agent}`, import.meta.url));
  // TMPDIR (`sandboxes`) is set by the preload after tsx: see fixtures/sandbox-tmpdir.mjs
  const preload = fileURLToPath(new URL('./fixtures/sandbox-tmpdir.mjs', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', '--import', preload, '--conditions=@rollserve/source', script, JSON.stringify({ claimWaitMs: 1_000, ...options })], {
    cwd: workspaceRoot(),
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLSERVE_LOG_LEVEL: process.env.ROLLSERVE_LOG_LEVEL ?? 'silent', ROLLSERVE_TEST_NODE_TMPDIR: sandboxes, ...env },
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  resources.add(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
    }
    await exited;
  });
  const events: NodeEvent[] = [];
  let text = '';
  let pending = '';
  const listeners = new Set<() => void>();
  child.stdout!.on('data', (chunk: Buffer) => {
    text += chunk;
    pending += chunk;
    const lines = pending.split('\n');
    pending = lines.pop()!;
    for (const line of lines) {
      if (line.startsWith('{')) events.push(JSON.parse(line) as NodeEvent);
    }
    for (const listener of [...listeners]) listener();
  });
  child.stderr!.on('data', (chunk: Buffer) => (text += chunk));
  const output = () => text;
  const matching = <T extends NodeEvent['type']>(type: T, fits?: (event: Extract<NodeEvent, { type: T }>) => boolean) =>
    events.filter((e): e is Extract<NodeEvent, { type: T }> => e.type === type && (!fits || fits(e as Extract<NodeEvent, { type: T }>)));
  const waitForCount: NodeProcess['waitForCount'] = (type, count, fits) =>
    new Promise((resolve, reject) => {
      const check = () => {
        const found = matching(type, fits);
        if (found.length >= count) {
          listeners.delete(check);
          resolve(found);
        }
      };
      listeners.add(check);
      check();
      void exited.then(({ code, signal }) => {
        if (!listeners.has(check)) return;
        listeners.delete(check);
        reject(new Error(`the node exited (${code ?? signal}) before ${count} "${type}" events: ${text}`));
      });
    });
  const node: NodeProcess = {
    child,
    pid: child.pid!,
    events,
    output,
    waitForCount,
    waitFor: async (type, fits) => (await waitForCount(type, 1, fits))[0]!,
    exited,
  };
  await node.waitFor('registered');
  return node;
}

/** The processes under `pid` (its descendants), with their command names. */
export function descendants(pid: number): Array<{ pid: number; comm: string }> {
  const parents = new Map<number, number>();
  const comms = new Map<number, string>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      comms.set(Number(entry), stat.slice(stat.indexOf('(') + 1, close));
      parents.set(Number(entry), Number(stat.slice(close + 2).split(' ')[1]));
    } catch {
      // exited
    }
  }
  const found = new Set([pid]);
  for (let grew = true; grew; ) {
    grew = false;
    for (const [child, parent] of parents) {
      if (!found.has(child) && found.has(parent)) {
        found.add(child);
        grew = true;
      }
    }
  }
  found.delete(pid);
  return [...found].map((p) => ({ pid: p, comm: comms.get(p) ?? '' }));
}

/** Submits shell tasks; answers their rollout ids. */
export async function submit(url: string, ids: readonly string[], headers: Record<string, string> = {}): Promise<string[]> {
  const tasks = ids.map((id) => ({ id, env: 'shell', row: { responses_create_params: { input: `print tag ${id}` }, tag: id }, policy: { model: 'fake-policy' } }));
  const response = await request(`${url}/v1/rollouts`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ tasks }) });
  const body = (await response.body.json()) as { tasks: Array<{ rollout_ids: string[] }> };
  if (response.statusCode !== 202) throw new Error(`submit answered ${response.statusCode}: ${JSON.stringify(body)}`);
  return body.tasks.flatMap((t) => t.rollout_ids);
}

/** Every result of `ids`, as the API streams them (snake_case), once all have finished. */
export async function streamResults(url: string, ids: readonly string[]): Promise<Array<{ id: string; state: string; reward: number; error: unknown }>> {
  const response = await request(`${url}/v1/rollouts/stream?ids=${ids.join(',')}`);
  return (await response.body.text()).split('\n').filter((l) => l.trim() !== '').map((line) => JSON.parse(line) as { id: string; state: string; reward: number; error: unknown });
}

/** A call through @rollserve/testing's `call`: a body (or `raw` text) makes it a POST; `json` is the text when the body is not JSON. */
export async function getJson(url: string, path: string, init: { method?: string; body?: unknown; raw?: string; headers?: Record<string, string> } = {}): Promise<{ status: number; json: any }> {
  const body = init.raw ?? init.body;
  const answer = await call(url, init.method ?? (body === undefined ? 'GET' : 'POST'), path, body, init.headers);
  return { status: answer.status, json: answer.json ?? answer.text };
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` until it is true (the test's own timeout bounds it). */
export async function until(check: () => boolean | Promise<boolean>, everyMs = 50): Promise<void> {
  while (!(await check())) await sleep(everyMs);
}


/**
 * A proxy in front of the service that loses commits: the first `lostAnswers` POST …/results
 * reach the service but their answer is dropped (the connection cut), the next `unavailable`
 * get a 503 without reaching it. With `oldService`, commits whose results come with their token
 * ids sent once get the 422 a service from before that form gives them. Everything else passes through.
 */
export async function startCommitFaults(
  resources: Resources,
  target: string,
  faults: { lostAnswers: number; unavailable: number; oldService?: boolean; slowAnswersMs?: number },
): Promise<{ url: string; seen: { lost: number; refused: number; passed: number; refusedForm: number } }> {
  const seen = { lost: 0, refused: 0, passed: 0, refusedForm: 0 };
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const isCommit = req.method === 'POST' && /\/results$/.test(req.url ?? '');
    if (isCommit && faults.oldService && Buffer.concat(chunks).includes('"$tokens"')) {
      seen.refusedForm++;
      res.writeHead(422, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code: 'UNPROCESSABLE', message: 'results.0.result.turns.1.promptTokenIds: Invalid input: expected array, received object', retryable: false } }));
      return;
    }
    if (isCommit && seen.lost >= faults.lostAnswers && seen.refused < faults.unavailable) {
      seen.refused++;
      res.writeHead(503, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code: 'UNAVAILABLE', message: 'proxy says no', retryable: true } }));
      return;
    }
    try {
      const headers = Object.fromEntries(Object.entries(req.headers).filter(([key]) => !['host', 'connection', 'content-length'].includes(key))) as Record<string, string>;
      const answer = await request(`${target}${req.url}`, { method: req.method as 'POST', headers, ...(chunks.length ? { body: Buffer.concat(chunks) } : {}) });
      const body = Buffer.from(await answer.body.arrayBuffer());
      if (isCommit && seen.lost < faults.lostAnswers) {
        seen.lost++;
        req.socket.destroy(); // the commit went through; its answer never arrives
        return;
      }
      if (isCommit) seen.passed++;
      // the service has taken the commit; its answer arrives late (heartbeats go on meanwhile)
      if (isCommit && faults.slowAnswersMs) await new Promise((resolve) => setTimeout(resolve, faults.slowAnswersMs));
      res.writeHead(answer.statusCode, { 'content-type': String(answer.headers['content-type'] ?? 'application/json') }).end(body);
    } catch {
      req.socket.destroy();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  resources.add(() => new Promise((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  }));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, seen };
}
