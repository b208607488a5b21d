import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { Agent, request } from 'undici';

// The start-up warm-up: a fresh service ran its first thousand rollouts at a third of its warm rate
// (`pnpm bench cold-start`), the cost being V8's JIT work on the hot path (interpreted code, then
// thousands of TurboFan compiles) and the environments' worker pools loading. Nothing cheaper than
// the real path pre-pays that work (a twin with a trivial environment and an in-memory store took
// off a third of it), so the warm-up runs rollouts through the real path before the service
// listens: a twin of the service (the same code: HTTP app on loopback, scheduler, runner, commits,
// the SQLite engine, the feed and its NDJSON stream, the LLM client) on a throwaway SQLite store in
// a temp directory, the configured environments (their `setup`s shared with the service, so the
// service serves with the worker pools the warm-up started and warmed), and a stand-in policy on
// loopback in place of the user's backends. Everything it starts is stopped and removed before the
// service is created.
//
// Two twins, one after the other (issue 28, `--trace-opt --trace-deopt`): with one, V8 compiled the
// hot path on assumptions that only one service had ever existed (fields written once held as
// constants, fields typed by the one object's hidden class); closing the twin and making the
// service broke them, and the runner's hot functions (run, runAgentLoop, #init, #eval, outcome, the
// commit path) and undici's parser callbacks were deoptimized then and compiled again in the first
// real round. A first twin closed after a fifth of the rollouts makes those changes early, and the
// code the second twin's rollouts compile holds through its close and the service's creation
// (3 functions marked for deoptimization there instead of ~30). The stand-in answers in vLLM's
// shape, field for field: a leaner body warmed the parsing of completions on objects of other
// hidden classes, deoptimized by the first real answers.

export interface WarmUpOptions {
  /** Rollouts to run; 0 turns the warm-up off. */
  rollouts: number;
  /**
   * Dataset rows (NeMo Gym form) by environment name: each twin's rollouts are shared evenly among
   * the environments given rows, one environment per batch, each cycling through its rows.
   * Environments without rows are not warmed.
   */
  rows: Record<string, ReadonlyArray<Record<string, unknown>>>;
  /**
   * What the stand-in policy answers (no tool calls); several are answered in turn. The default is
   * a final answer in the `\boxed{}` form that graders extract, bare and in a sentence, with no
   * code block (a code environment runs nothing).
   * @default ['\\boxed{8}', 'The answer is \\boxed{8}.']
   */
  reply?: string | readonly string[];
  /**
   * Tasks per POST at most (each batch's results read from the result stream before the next; a
   * batch is of one environment). @default 1000
   */
  batch?: number;
  /**
   * Rollouts run by a first twin, closed before a second twin runs the rest (see the note at the
   * top: the code compiled for the service then survives a twin's close and the service's
   * creation); 0, or all of `rollouts`: one twin. @default a fifth of `rollouts`
   */
  firstTwin?: number;
  /**
   * V8's interrupt budget while the warm-up runs, then set back (to the `--interrupt-budget` of
   * the command line or NODE_OPTIONS, else V8's default, 66 KiB). TurboFan compiles a function once
   * it has used about three budgets of bytecode, so a function run once per rollout is compiled
   * after thousands of rollouts; a budget 8 times smaller compiles the hot path within the warm-up.
   * Smaller still compiles on too little type feedback (the first real rollouts then deoptimize
   * it), and kept small after the warm-up it compiles lukewarm code: both measured worse.
   * false: V8's flags are left alone. @default 8192
   */
  interruptBudget?: number | false;
}

/** Set to '1' in the process's environment while the warm-up runs (for the worker threads it starts). */
export const WARMING_UP_ENV = 'ROLLSERVE_WARMING_UP';

/** The stand-in policy's answers, in turn: a bare final answer and one in a sentence. */
const DEFAULT_REPLIES = ['\\boxed{8}', 'The answer is \\boxed{8}.'];

/** V8's interrupt budget outside the warm-up: the one given to node, else V8's default (66 KiB). */
function givenInterruptBudget(): number {
  const flags = [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/)];
  for (const flag of flags.reverse()) {
    const match = /^--interrupt[-_]budget=(\d+)$/.exec(flag);
    if (match) return Number(match[1]);
  }
  return 66 * 1024;
}

/** What the warm-up did: rollouts run (by state), and how long it took. */
export interface WarmUpReport {
  rollouts: number;
  states: Record<string, number>;
  ms: number;
}

/** A twin of the service, as startRolloutServer makes it, that the warm-up drives and closes. */
export interface WarmUpTwin {
  readonly url: string;
  close(): Promise<void>;
}

/** Starts a twin of the service on `store`, its policy at `llm`, its journal to import `journal` (a path where no file is). */
export type LaunchTwin = (twin: { store: string; llm: string; journal: string }) => Promise<WarmUpTwin>;

/**
 * A chat completion of `reply` in vLLM's shape, field for field and in vLLM's order (the JSON the
 * service parses becomes objects whose hidden classes follow the keys and their order: a leaner
 * body warmed code that real backends' answers then deoptimized): token ids and `token_id:N`
 * logprobs, as the service asks for them.
 */
function completionBody(reply: string, promptTokens: number): string {
  const ids = Array.from(Buffer.from(reply, 'utf8'), (byte) => 1000 + byte);
  return JSON.stringify({
    id: 'chatcmpl-warm-up',
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: 'warm-up',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: reply, refusal: null, annotations: null, audio: null, function_call: null, tool_calls: [], reasoning_content: null },
        logprobs: {
          content: ids.map((id) => {
            const token = `token_id:${id}`;
            const bytes = Array.from(Buffer.from(token, 'utf8'));
            return { token, logprob: -((id % 997) + 1) / 1000, bytes, top_logprobs: [] };
          }),
        },
        finish_reason: 'stop',
        stop_reason: null,
        token_ids: ids,
      },
    ],
    service_tier: null,
    system_fingerprint: null,
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens + ids.length, completion_tokens: ids.length, prompt_tokens_details: null },
    prompt_logprobs: null,
    prompt_token_ids: Array.from({ length: promptTokens }, (_, i) => 100 + i),
    kv_transfer_params: null,
  });
}

/** The stand-in policy: answers chat completions with `replies` in turn, the model list, and 404 else. */
async function startStandInPolicy(replies: readonly string[]): Promise<{ url: string; close(): Promise<void> }> {
  const completions = replies.flatMap((reply) => [completionBody(reply, 24), completionBody(reply, 61)]);
  let answered = 0;
  const models = JSON.stringify({ object: 'list', data: [{ id: 'warm-up', object: 'model' }] });
  const server: Server = createServer((incoming, outgoing) => {
    incoming.resume();
    incoming.once('end', () => {
      const path = incoming.url ?? '';
      const body = path.endsWith('/chat/completions') ? completions[answered++ % completions.length] : path.endsWith('/models') ? models : undefined;
      outgoing.writeHead(body === undefined ? 404 : 200, { 'content-type': 'application/json' });
      outgoing.end(body ?? '{"error":{"message":"not found"}}');
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/** A twin's batches: `count` rollouts from `start`, shared evenly among `envs` environments in turn, each share in batches of at most `batch`. */
function planTwin(start: number, count: number, envs: number, batch: number): Array<{ start: number; size: number; env: number }> {
  const plan: Array<{ start: number; size: number; env: number }> = [];
  let next = start;
  for (let env = 0; env < envs; env++) {
    const share = Math.floor(count / envs) + (env < count % envs ? 1 : 0);
    for (let done = 0; done < share; done += batch) {
      const size = Math.min(batch, share - done);
      plan.push({ start: next, size, env });
      next += size;
    }
  }
  return plan;
}

/** Submits `tasks` to the twin and reads their results from the result stream; returns their states. */
async function runBatch(url: string, dispatcher: Agent, tasks: Array<{ id: string }>, states: Record<string, number>, signal: AbortSignal): Promise<void> {
  const submitted = await request(`${url}/v1/rollouts`, {
    dispatcher,
    signal,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ tasks }),
  });
  const answer = await submitted.body.text();
  if (submitted.statusCode !== 202) throw new Error(`the warm-up's submit answered ${submitted.statusCode}: ${answer.slice(0, 500)}`);
  const stream = await request(`${url}/v1/rollouts/stream?ids=${tasks.map((t) => t.id).join(',')}`, { dispatcher, signal });
  if (stream.statusCode !== 200) throw new Error(`the warm-up's result stream answered ${stream.statusCode}: ${(await stream.body.text()).slice(0, 500)}`);
  let buffered = '';
  for await (const chunk of stream.body) {
    buffered += (chunk as Buffer).toString();
    let newline: number;
    while ((newline = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      if (!line.trim()) continue;
      const { state } = JSON.parse(line) as { state: string };
      states[state] = (states[state] ?? 0) + 1;
    }
  }
}

/**
 * Runs `options.rollouts` rollouts through twins of the service (`launch`, each on a throwaway
 * SQLite store, their policy a stand-in on loopback; the first closed before the second starts),
 * then stops the twin and the stand-in and removes the stores' directory, whatever happened. Throws when the twin fails to start or answer; a rollout
 * that fails is a result like any other (its state counted). A SIGINT or SIGTERM meanwhile stops
 * it and cleans up; then, unless the process handles the signal itself, the signal is raised again.
 */
export async function warmUp(options: WarmUpOptions, launch: LaunchTwin): Promise<WarmUpReport> {
  const started = performance.now();
  const states: Record<string, number> = {};
  const envs = Object.entries(options.rows).filter(([, rows]) => rows.length > 0);
  if (options.rollouts <= 0 || envs.length === 0) return { rollouts: 0, states, ms: 0 };
  const batch = Math.max(1, options.batch ?? 1000);
  const firstTwin = Math.min(options.rollouts, Math.max(0, Math.floor(options.firstTwin ?? options.rollouts / 5)));
  // Nothing of the warm-up may outlive it, a Ctrl-C included (the service's own signal handling
  // starts only once it listens).
  const interrupted = new AbortController();
  let signalled: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    signalled = signal;
    interrupted.abort(new Error(`the warm-up was interrupted (${signal})`));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const budget = options.interruptBudget ?? 8192;
  if (budget !== false) setFlagsFromString(`--interrupt-budget=${budget}`);
  // Told to the environments' worker threads started meanwhile (a thread starts with a copy of the
  // process's environment): each is an isolate V8 compiles apart, which the rollouts shared among
  // the threads warm too little, so a worker may warm itself at its start (the math grader's does).
  const warmingUp = process.env[WARMING_UP_ENV];
  process.env[WARMING_UP_ENV] = '1';
  const dispatcher = new Agent({ connections: 4, headersTimeout: 0, bodyTimeout: 0 });
  let dir: string | undefined;
  let policy: { url: string; close(): Promise<void> } | undefined;
  let twin: WarmUpTwin | undefined;
  try {
    const stores = (dir = await mkdtemp(join(tmpdir(), 'rollserve-warm-up-')));
    const llm = (policy = await startStandInPolicy(typeof options.reply === 'string' ? [options.reply] : (options.reply ?? DEFAULT_REPLIES))).url;
    const launchTwin = (n: number) => launch({ store: `sqlite://${join(stores, `warm-up-${n}.db`)}`, llm, journal: join(stores, 'no-journal.jsonl') });
    // Each batch is of one environment, as a training step's is (the bench's and a trainer's
    // batches: the grader's queue full, its slots taken, arrays grown to the batch's size); a twin's
    // rollouts are shared evenly among the environments, each share in batches of `batch`.
    const plan = [...planTwin(0, firstTwin, envs.length, batch), ...planTwin(firstTwin, options.rollouts - firstTwin, envs.length, batch)];
    twin = await launchTwin(1);
    let second = firstTwin === 0;
    const seen = new Map<number, number>();
    for (const { start, size, env: e } of plan) {
      interrupted.signal.throwIfAborted();
      if (!second && start >= firstTwin) {
        const first = twin;
        twin = undefined;
        await first.close();
        twin = await launchTwin(2);
        second = true;
      }
      const [env, rows] = envs[e]!;
      const offset = seen.get(e) ?? 0;
      seen.set(e, offset + size);
      const tasks = Array.from({ length: size }, (_, i) => ({ id: `warm-up-${start + i}`, env, row: rows[(offset + i) % rows.length]!, policy: { model: 'warm-up' } }));
      await runBatch(twin.url, dispatcher, tasks, states, interrupted.signal);
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    if (budget !== false) setFlagsFromString(`--interrupt-budget=${givenInterruptBudget()}`);
    if (warmingUp === undefined) delete process.env[WARMING_UP_ENV];
    else process.env[WARMING_UP_ENV] = warmingUp;
    await twin?.close();
    await dispatcher.close();
    await policy?.close();
    if (dir !== undefined) await rm(dir, { recursive: true, force: true });
    // raised again for the default action (the exit), unless the process has handlers of its own (they had it)
    if (signalled !== undefined && process.listenerCount(signalled) === 0) process.kill(process.pid, signalled);
  }
  return { rollouts: options.rollouts, states, ms: performance.now() - started };
}
