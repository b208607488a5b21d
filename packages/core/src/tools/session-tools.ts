import { RolloutError } from '../errors.ts';
import { createSandboxProvider } from '../sandbox/registry.ts';
import type { Sandbox, SandboxProvider, SandboxSpec } from '../sandbox/types.ts';
import { BashSession, type BashSessionOptions } from './bash.ts';
import { channelLimitOf } from './channel-limit.ts';
import { Editor } from './editor.ts';
import { PythonKernel, type PythonKernelOptions } from './python.ts';

export interface SessionToolsOptions {
  /**
   * The provider that creates the session's sandbox.
   * @default createSandboxProvider(), the session's own (closed with it): both faces pass theirs,
   * shared by their sessions, whose warm sandboxes and kernel fork servers a provider per session
   * would start for one sandbox
   */
  provider?: SandboxProvider;
  /** The sandbox to create; a function is called when the sandbox is created. @default {} */
  spec?: SandboxSpec | (() => SandboxSpec);
  bash?: BashSessionOptions;
  python?: PythonKernelOptions;
  /**
   * Time limit of each start: the sandbox's creation, the shell's, the Python kernel's (with its
   * prelude). A start that misses it fails with a TIMEOUT RolloutError (and is reported by
   * `startFailure()` while the policy has not acted). The rollout service passes the task's
   * `limits.init_timeout_s`.
   * @default DEFAULT_START_TIMEOUT_MS (600 s)
   */
  startTimeoutMs?: number;
}

/** How long a start may take when the caller sets no limit (the default of `init_timeout_s`). */
export const DEFAULT_START_TIMEOUT_MS = 600_000;

/** How `python()` starts the kernel when the call starts it. */
export interface SessionPythonOptions extends PythonKernelOptions {
  /** Code run once in a fresh kernel before it is handed out (imports, helpers). */
  prelude?: string;
}

/**
 * A session's sandbox and tool backends (`ctx.tools`), each created on first use, once even when
 * calls race, and closed with the session. Both faces make it with `createSessionTools`.
 *
 * Starting them is not the policy's work: every start runs under its own limit
 * (`startTimeoutMs`) and its time is kept on a clock (`startupMs()`) that tool time limits leave
 * out. Whose failure a failed start is depends on when it fails. Until the policy has acted in
 * the sandbox (see `policyBegins`) nothing it did can have caused it: the failure is kept
 * (`startFailure()`) and the rollout service ends the rollout as an infrastructure failure, even
 * when a tool's handler swallowed the error. Once it has acted, a start can fail because of what
 * it did (a hook it planted where the interpreter reads, a full disk, processes hogging the
 * sandbox's limits), so the failure is only thrown to the call that wanted the start: the tool's
 * error, scored like any other, never a way out of a bad sample.
 */
export class SessionTools {
  private sandboxPromise: Promise<Sandbox> | undefined;
  private bashPromise: Promise<BashSession> | undefined;
  private pythonPromise: Promise<PythonKernel> | undefined;
  private editorInstance: Editor | undefined;
  private closed = false;
  private created: Sandbox | undefined;
  /** The provider made for this session when none was given. */
  private ownProvider: SandboxProvider | undefined;
  /** Starts under way, since when (overlapping starts count once), and the time of those done. */
  private starting = 0;
  private startingSince = 0;
  private startedMs = 0;
  private failure: RolloutError | undefined;
  /** The policy's calls have begun (`policyBegins`); it has acted in the sandbox. */
  private policyTurn = false;
  private acted = false;
  /** `startupMs()` when the policy first acted. */
  private startupAtAct = 0;
  /** Starts still running, each with what gives it up (session closed) and what it becomes. */
  private readonly pending = new Set<{ giveUp: () => void; settled: Promise<unknown> }>();

  constructor(private readonly options: SessionToolsOptions = {}) {}

  /** Time spent starting the sandbox and backends so far, ms; a start under way counts up to now. */
  startupMs(): number {
    return this.startedMs + (this.starting > 0 ? performance.now() - this.startingSince : 0);
  }

  /**
   * The first start that failed or missed its limit before the policy acted in the sandbox, if
   * one did: an infrastructure failure. One after is the failing call's error, not kept here.
   */
  startFailure(): RolloutError | undefined {
    return this.failure;
  }

  /**
   * Says that what uses the tools from now on is the policy (the rollout service calls it as RUN
   * begins, after INIT's starts and seeding). From then on, the policy has acted in the sandbox
   * once one of its calls is handed the sandbox or a backend (or resets one), or once a call of
   * its that ran ends (`policyCallEnded`: it may have reached the sandbox some other way). It can
   * run anything there, so a start that fails after that is that call's or a later call's error
   * (`startFailure()` stays empty). A call that starts what it needs at first use, before any
   * call was handed anything, is still not the policy's doing.
   */
  policyBegins(): void {
    this.policyTurn = true;
  }

  /** A call of the policy whose handler ran has ended: whatever it did is done (see `policyBegins`). */
  policyCallEnded(): void {
    this.markActed();
  }

  /** Whether the policy has acted in the sandbox (see `policyBegins`). */
  policyActed(): boolean {
    return this.acted;
  }

  /**
   * The part of `startupMs()` spent before the policy acted, ms. The rollout's time limit leaves
   * only this out: a start after it (a kernel the policy reset or broke) is the policy's time, as
   * its tool calls are, or its own restarts could stretch a rollout far past the limit.
   */
  startupBeforeActMs(): number {
    return this.acted ? this.startupAtAct : this.startupMs();
  }

  private markActed(): void {
    if (!this.policyTurn || this.acted) return;
    this.startupAtAct = this.startupMs();
    this.acted = true;
  }

  /** `got`, for a caller: when the caller is the policy, it has acted once it holds the value. */
  private handOut<T>(got: Promise<T>): Promise<T> {
    if (!this.policyTurn) return got;
    return got.then((value) => {
      this.markActed();
      return value;
    });
  }

  /**
   * Runs one start under the start limit, on the start-up clock. A start given up (limit passed,
   * session closed) is closed when it finishes anyway, so nothing it made outlives the session.
   */
  private start<T extends { close(): Promise<void> }>(what: string, begin: (timeoutMs: number) => Promise<T>): Promise<T> {
    const limitMs = this.options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
    if (this.starting++ === 0) this.startingSince = performance.now();
    const begun = Promise.resolve().then(() => begin(limitMs));
    let givenUp = false;
    let giveUp!: (error: RolloutError) => void;
    const bounded = new Promise<T>((resolve, reject) => {
      giveUp = (error) => {
        givenUp = true;
        reject(error);
      };
      begun.then(resolve, reject);
    });
    const timer = setTimeout(
      () => giveUp(new RolloutError({ code: 'TIMEOUT', message: `${what} did not start within ${limitMs / 1000} s (init_timeout_s)` })),
      limitMs,
    );
    const settled = begun.then(
      async (value) => {
        if (givenUp) await value.close().catch(() => undefined);
      },
      () => undefined,
    );
    const entry = { giveUp: () => giveUp(new RolloutError({ code: 'CANCELLED', message: 'session closed' })), settled };
    this.pending.add(entry);
    void settled.then(() => this.pending.delete(entry));
    return bounded.then(
      (value) => {
        this.startDone(timer);
        return value;
      },
      (error: unknown) => {
        this.startDone(timer);
        const wrapped = RolloutError.from(error, 'SANDBOX');
        // Judged when it fails, not when it began: the policy may have acted meanwhile.
        if (!this.closed && wrapped.code !== 'CANCELLED' && !this.acted) {
          this.failure ??= wrapped.message.includes(what) ? wrapped : new RolloutError({ code: wrapped.code, message: `${what} did not start: ${wrapped.message}`, cause: error });
        }
        throw wrapped;
      },
    );
  }

  private startDone(timer: NodeJS.Timeout): void {
    clearTimeout(timer);
    if (--this.starting === 0) this.startedMs += performance.now() - this.startingSince;
  }

  /** The session's sandbox. */
  sandbox(): Promise<Sandbox> {
    this.assertOpen();
    return this.handOut(this.startSandbox());
  }

  private startSandbox(): Promise<Sandbox> {
    if (this.sandboxPromise === undefined) {
      const { spec } = this.options;
      this.sandboxPromise = this.start('the sandbox', () =>
        (this.options.provider ?? (this.ownProvider = createSandboxProvider())).create((typeof spec === 'function' ? spec() : spec) ?? {}),
      );
      this.sandboxPromise.then((sandbox) => (this.created = sandbox), () => {});
    }
    return this.sandboxPromise;
  }

  /** Why the session's sandbox was ended by one of its limits, if it has one and it was. */
  limitExceeded(): string | undefined {
    // a channel the sandbox flooded (the kernel's socket, the terminal) ended it as well
    return channelLimitOf(this.created) ?? this.created?.checkLimits();
  }

  /** A persistent shell in the sandbox. */
  bash(): Promise<BashSession> {
    this.assertOpen();
    if (this.bashPromise === undefined) {
      const started = this.startSandbox().then((sandbox) =>
        this.start('the bash shell', (startTimeoutMs) => BashSession.start(sandbox, { startTimeoutMs, ...this.options.bash })),
      );
      this.bashPromise = started;
      // a shell that failed to start is not kept: the next call tries again
      started.catch(() => {
        if (this.bashPromise === started) this.bashPromise = undefined;
      });
    }
    return this.handOut(this.bashPromise);
  }

  /**
   * A persistent Python kernel in the sandbox. `options` apply when this call starts it (over the
   * session's); a running kernel is returned as it is.
   */
  python(options: SessionPythonOptions = {}): Promise<PythonKernel> {
    this.assertOpen();
    if (this.pythonPromise === undefined) {
      const { prelude, ...kernelOptions } = options;
      const started = this.startSandbox().then((sandbox) =>
        this.start('the Python kernel', async (startTimeoutMs) => {
          const kernel = await PythonKernel.start(sandbox, { startTimeoutMs, ...this.options.python, ...kernelOptions });
          if (prelude !== undefined) await kernel.run(prelude, { timeoutMs: startTimeoutMs });
          return kernel;
        }),
      );
      this.pythonPromise = started;
      // a kernel that failed to start is not kept: the next call tries again
      started.catch(() => {
        if (this.pythonPromise === started) this.pythonPromise = undefined;
      });
    }
    return this.handOut(this.pythonPromise);
  }

  /**
   * Stops the Python kernel; the next `python()` starts a fresh one (math_with_code's end_session).
   * The policy's reset is its act: it caused the start that follows.
   */
  async resetPython(): Promise<void> {
    this.markActed();
    const kernel = this.pythonPromise;
    this.pythonPromise = undefined;
    await kernel?.then((k) => k.close(), () => undefined);
  }

  /** The file editor (view, create, str_replace, insert, undo_edit) on the sandbox. */
  async editor(): Promise<Editor> {
    this.assertOpen();
    const sandbox = await this.startSandbox();
    this.editorInstance ??= new Editor(sandbox);
    return this.handOut(Promise.resolve(this.editorInstance));
  }

  private assertOpen(): void {
    if (this.closed) throw new Error('session tools are closed');
  }

  /** Closes the backends and the sandbox; the session does it when it ends. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // Starts under way are given up now (each is closed when it finishes), not waited for.
    for (const entry of this.pending) entry.giveUp();
    const settle = async <T extends { close(): Promise<void> }>(p: Promise<T> | undefined): Promise<void> => {
      if (p === undefined) return;
      try {
        await (await p).close();
      } catch {
        // creation failed: nothing to close
      }
    };
    await Promise.all([settle(this.bashPromise), settle(this.pythonPromise)]);
    await settle(this.sandboxPromise);
    // What the given-up starts made, closed (a kernel start ends when its sandbox is gone).
    await Promise.all([...this.pending].map((entry) => entry.settled));
    await this.ownProvider?.close?.();
  }
}

/**
 * What the tools need of a session (the spec's `Session`): a hook run when it ends. Declared here,
 * not imported, because the spec's `ctx.tools` is typed by this folder: tools/ sits below spec/.
 */
export interface SessionCloser {
  onClose(close: () => Promise<void> | void): void;
}

/**
 * The session's tools, closed when the session closes (`session.onClose`). The one way both faces
 * make `ctx.tools`: nothing is created until it is used.
 */
export function createSessionTools(session: SessionCloser, options: SessionToolsOptions = {}): SessionTools {
  const tools = new SessionTools(options);
  session.onClose(() => tools.close());
  return tools;
}
