import { RolloutError } from '../errors.ts';
import type { EnvironmentContext } from './context.ts';
import type { ToolDefinition } from './tool.ts';

export type ToolOutcome = { ok: true; value: unknown } | { ok: false; timedOut: boolean; error: unknown };

/**
 * An abort whose AbortSignal is made only when something asks for it: most handlers never read
 * `ctx.signal`, and two AbortControllers a call (the request's and the call's own) were 7 % of a
 * resources server's CPU under 16 bash sessions.
 */
export class LazyAbort {
  #controller: AbortController | undefined;
  #aborted: { reason: unknown } | undefined;

  get aborted(): boolean {
    return this.#aborted !== undefined;
  }

  get signal(): AbortSignal {
    if (this.#controller === undefined) {
      this.#controller = new AbortController();
      if (this.#aborted) this.#controller.abort(this.#aborted.reason);
    }
    return this.#controller.signal;
  }

  abort(reason: unknown): void {
    if (this.#aborted) return;
    this.#aborted = { reason };
    this.#controller?.abort(reason);
  }
}

/** A call's place in its limit's queue (see deadlineAfter); `expire` is dropped once the call ends. */
interface Deadline {
  at: number;
  expire: (() => void) | undefined;
  queue: DeadlineQueue;
}

/**
 * The calls under way with one time limit, in the order they began (so their deadlines are in
 * order too), under one Node timer armed for the earliest: a Timeout per call, set and cleared,
 * showed in the profile of a tool call over HTTP. Ended calls are dropped from the front as they
 * go, and the queue is compacted when they pile up behind a long one.
 */
class DeadlineQueue {
  private entries: Deadline[] = [];
  private head = 0;
  private live = 0;
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Infinity;

  constructor(
    private readonly ms: number,
    /** Called when the queue has no call left (it is then dropped: limits vary with tasks). */
    private readonly onEmpty: () => void,
  ) {}

  add(expire: () => void): Deadline {
    const deadline: Deadline = { at: performance.now() + this.ms, expire, queue: this };
    this.entries.push(deadline);
    this.live++;
    if (this.timer === undefined) this.arm(deadline.at);
    return deadline;
  }

  cancel(deadline: Deadline): void {
    if (deadline.expire === undefined) return;
    deadline.expire = undefined;
    this.live--;
    this.tidy();
  }

  private tidy(): void {
    const { entries } = this;
    while (this.head < entries.length && entries[this.head]!.expire === undefined) this.head++;
    if (this.live === 0) {
      this.entries = [];
      this.head = 0;
      clearTimeout(this.timer);
      this.timer = undefined;
      this.timerAt = Infinity;
      this.onEmpty();
    } else if (entries.length - this.head > 2 * this.live + 1024) {
      this.entries = entries.slice(this.head).filter((d) => d.expire !== undefined);
      this.head = 0;
    }
  }

  private arm(at: number): void {
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => this.fire(), Math.max(1, Math.ceil(at - performance.now())));
  }

  private fire(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    const now = performance.now();
    while (this.head < this.entries.length) {
      const deadline = this.entries[this.head]!;
      if (deadline.expire !== undefined && deadline.at > now) break;
      this.head++;
      const { expire } = deadline;
      if (expire === undefined) continue;
      deadline.expire = undefined;
      this.live--;
      expire();
    }
    this.tidy();
    // an expired call's abort may have begun another call meanwhile, arming the timer for it
    const next = this.entries[this.head];
    if (next !== undefined && next.at < this.timerAt) this.arm(next.at);
  }
}

const deadlineQueues = new Map<number, DeadlineQueue>();

/** Calls `expire` `ms` from now unless cancelled (`cancelDeadline`) first. */
function deadlineAfter(ms: number, expire: () => void): Deadline {
  let queue = deadlineQueues.get(ms);
  if (queue === undefined) {
    const created = new DeadlineQueue(ms, () => {
      if (deadlineQueues.get(ms) === created) deadlineQueues.delete(ms);
    });
    queue = created;
    deadlineQueues.set(ms, queue);
  }
  return queue.add(expire);
}

function cancelDeadline(deadline: Deadline): void {
  deadline.queue.cancel(deadline);
}

/**
 * Runs a tool's handler on already-validated arguments under its time limit. The handler's
 * `ctx.signal` is aborted when the limit passes, `signal` aborts or `abort` is aborted; a handler
 * that ignores it is abandoned (its result dropped), so a stuck tool never holds the caller.
 * The limit counts the tool's own work: time the session spends meanwhile starting its sandbox
 * or backends (`ctx.tools.startupMs()`, under a start limit of its own) is left out.
 */
export function invokeTool<Config>(
  tool: ToolDefinition<any, Config>,
  args: unknown,
  ctx: Omit<EnvironmentContext<Config>, 'signal'>,
  options: { timeoutMs: number; signal?: AbortSignal; abort?: LazyAbort },
): Promise<ToolOutcome> {
  const abort = options.abort ?? new LazyAbort();
  const { timeoutMs } = options;
  // The caller's abort forwarded by hand: AbortSignal.any per call showed in tool-call profiles.
  const outer = options.signal;
  const forward = () => abort.abort(outer!.reason);
  if (outer?.aborted) forward();
  else outer?.addEventListener('abort', forward, { once: true });
  // Tests and callers without session tools may hand a ctx whose `tools` has no start-up clock.
  const startup = (): number => (typeof ctx.tools?.startupMs === 'function' ? ctx.tools.startupMs() : 0);
  const startedAt = performance.now();
  const startupAt = startup();
  // One promise settled by whichever comes first, the handler or the limit (a race of two, and
  // an async wrapper around the handler, were a share of the call's own time).
  return new Promise<ToolOutcome>((resolve) => {
    let settled = false;
    let deadline: Deadline | undefined;
    let timer: NodeJS.Timeout | undefined;
    const settle = (outcome: ToolOutcome): void => {
      if (settled) return;
      settled = true;
      if (deadline !== undefined) cancelDeadline(deadline);
      clearTimeout(timer);
      outer?.removeEventListener('abort', forward);
      resolve(outcome);
    };
    const expire = (): void => {
      deadline = undefined;
      const used = performance.now() - startedAt - (startup() - startupAt);
      // a start took part of the time: the call gets it back
      if (used < timeoutMs) {
        timer = setTimeout(expire, Math.max(1, Math.ceil(timeoutMs - used)));
        return;
      }
      const error = new RolloutError({ code: 'TIMEOUT', message: `tool call timed out after ${timeoutMs} ms` });
      abort.abort(error);
      settle({ ok: false, timedOut: true, error });
    };
    deadline = deadlineAfter(timeoutMs, expire);
    const signalled = {
      ...ctx,
      get signal() {
        return abort.signal;
      },
    };
    let value: unknown;
    try {
      value = tool.handler(args, signalled);
    } catch (error) {
      settle({ ok: false, timedOut: false, error });
      return;
    }
    Promise.resolve(value).then(
      (result) => settle({ ok: true, value: result }),
      (error: unknown) => settle({ ok: false, timedOut: false, error }),
    );
  });
}

/**
 * The text a model reads for a tool's value: the tool's own `text` when it has one, else a string
 * as it is and anything else as JSON.
 */
export function toolOutputText(value: unknown, tool?: Pick<ToolDefinition<any, any>, 'text'>): string {
  if (tool?.text) return tool.text(value);
  return typeof value === 'string' ? value : JSON.stringify(value ?? null);
}

/** The code a call executes: the tool's `code`, else its `code` or `command` string argument. */
export function toolCallCode(tool: Pick<ToolDefinition<any, any>, 'code'>, args: unknown): string | null {
  if (tool.code) return tool.code(args);
  const record = (args ?? {}) as Record<string, unknown>;
  if (typeof record.code === 'string') return record.code;
  if (typeof record.command === 'string') return record.command;
  return null;
}
