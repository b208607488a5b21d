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

/**
 * Runs a tool's handler on already-validated arguments under its time limit. The handler's
 * `ctx.signal` is aborted when the limit passes, `signal` aborts or `abort` is aborted; a handler
 * that ignores it is abandoned (its result dropped), so a stuck tool never holds the caller.
 * The limit counts the tool's own work: time the session spends meanwhile starting its sandbox
 * or backends (`ctx.tools.startupMs()`, under a start limit of its own) is left out.
 */
export async function invokeTool<Config>(
  tool: ToolDefinition<any, Config>,
  args: unknown,
  ctx: Omit<EnvironmentContext<Config>, 'signal'>,
  options: { timeoutMs: number; signal?: AbortSignal; abort?: LazyAbort },
): Promise<ToolOutcome> {
  const abort = options.abort ?? new LazyAbort();
  // The caller's abort forwarded by hand: AbortSignal.any per call showed in tool-call profiles.
  const outer = options.signal;
  const forward = () => abort.abort(outer!.reason);
  if (outer?.aborted) forward();
  else outer?.addEventListener('abort', forward, { once: true });
  let timer: NodeJS.Timeout | undefined;
  // Tests and callers without session tools may hand a ctx whose `tools` has no start-up clock.
  const startup = (): number => (typeof ctx.tools?.startupMs === 'function' ? ctx.tools.startupMs() : 0);
  const startedAt = performance.now();
  const startupAt = startup();
  const limit = new Promise<ToolOutcome>((resolve) => {
    const expire = (): void => {
      const used = performance.now() - startedAt - (startup() - startupAt);
      // a start took part of the time: the call gets it back
      if (used < options.timeoutMs) {
        timer = setTimeout(expire, Math.max(1, Math.ceil(options.timeoutMs - used)));
        return;
      }
      const error = new RolloutError({ code: 'TIMEOUT', message: `tool call timed out after ${options.timeoutMs} ms` });
      abort.abort(error);
      resolve({ ok: false, timedOut: true, error });
    };
    timer = setTimeout(expire, options.timeoutMs);
  });
  const run = (async (): Promise<ToolOutcome> => {
    try {
      const signalled = {
        ...ctx,
        get signal() {
          return abort.signal;
        },
      };
      return { ok: true, value: await tool.handler(args, signalled) };
    } catch (error) {
      return { ok: false, timedOut: false, error };
    }
  })();
  try {
    return await Promise.race([run, limit]);
  } finally {
    clearTimeout(timer);
    outer?.removeEventListener('abort', forward);
  }
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
