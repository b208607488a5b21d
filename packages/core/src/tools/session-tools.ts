import type { Session } from '../spec/environment.ts';
import { createSandboxProvider } from '../sandbox/registry.ts';
import type { Sandbox, SandboxProvider, SandboxSpec } from '../sandbox/types.ts';
import { BashSession, type BashSessionOptions } from './bash.ts';
import { Editor } from './editor.ts';
import { PythonKernel, type PythonKernelOptions } from './python.ts';

export interface SessionToolsOptions {
  /** The provider that creates the session's sandbox. @default createSandboxProvider() */
  provider?: SandboxProvider;
  /** The sandbox to create; a function is called when the sandbox is created. @default {} */
  spec?: SandboxSpec | (() => SandboxSpec);
  bash?: BashSessionOptions;
  python?: PythonKernelOptions;
}

/** How `python()` starts the kernel when the call starts it. */
export interface SessionPythonOptions extends PythonKernelOptions {
  /** Code run once in a fresh kernel before it is handed out (imports, helpers). */
  prelude?: string;
}

/**
 * A session's sandbox and tool backends (`ctx.tools`), each created on first use, once even when
 * calls race, and closed with the session. Both faces make it with `createSessionTools`.
 */
export class SessionTools {
  private sandboxPromise: Promise<Sandbox> | undefined;
  private bashPromise: Promise<BashSession> | undefined;
  private pythonPromise: Promise<PythonKernel> | undefined;
  private editorInstance: Editor | undefined;
  private closed = false;
  private created: Sandbox | undefined;

  constructor(private readonly options: SessionToolsOptions = {}) {}

  /** The session's sandbox. */
  sandbox(): Promise<Sandbox> {
    this.assertOpen();
    if (this.sandboxPromise === undefined) {
      const { spec } = this.options;
      this.sandboxPromise = Promise.resolve()
        .then(() => (this.options.provider ?? createSandboxProvider()).create((typeof spec === 'function' ? spec() : spec) ?? {}));
      this.sandboxPromise.then((sandbox) => (this.created = sandbox), () => {});
    }
    return this.sandboxPromise;
  }

  /** Why the session's sandbox was ended by one of its limits, if it has one and it was. */
  limitExceeded(): string | undefined {
    return this.created?.checkLimits();
  }

  /** A persistent shell in the sandbox. */
  bash(): Promise<BashSession> {
    this.assertOpen();
    this.bashPromise ??= this.sandbox().then((sandbox) => BashSession.start(sandbox, this.options.bash));
    return this.bashPromise;
  }

  /**
   * A persistent Python kernel in the sandbox. `options` apply when this call starts it (over the
   * session's); a running kernel is returned as it is.
   */
  python(options: SessionPythonOptions = {}): Promise<PythonKernel> {
    this.assertOpen();
    if (this.pythonPromise === undefined) {
      const { prelude, ...kernelOptions } = options;
      const started = this.sandbox().then(async (sandbox) => {
        const kernel = await PythonKernel.start(sandbox, { ...this.options.python, ...kernelOptions });
        if (prelude !== undefined) await kernel.run(prelude, { timeoutMs: 60_000 });
        return kernel;
      });
      this.pythonPromise = started;
      // a kernel that failed to start is not kept: the next call tries again
      started.catch(() => {
        if (this.pythonPromise === started) this.pythonPromise = undefined;
      });
    }
    return this.pythonPromise;
  }

  /** Stops the Python kernel; the next `python()` starts a fresh one (math_with_code's end_session). */
  async resetPython(): Promise<void> {
    const kernel = this.pythonPromise;
    this.pythonPromise = undefined;
    await kernel?.then((k) => k.close(), () => undefined);
  }

  /** The file editor (view, create, str_replace, insert, undo_edit) on the sandbox. */
  async editor(): Promise<Editor> {
    this.assertOpen();
    const sandbox = await this.sandbox();
    this.editorInstance ??= new Editor(sandbox);
    return this.editorInstance;
  }

  private assertOpen(): void {
    if (this.closed) throw new Error('session tools are closed');
  }

  /** Closes the backends and the sandbox; the session does it when it ends. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
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
  }
}

/**
 * The session's tools, closed when the session closes (`session.onClose`). The one way both faces
 * make `ctx.tools`: nothing is created until it is used.
 */
export function createSessionTools(session: Session, options: SessionToolsOptions = {}): SessionTools {
  const tools = new SessionTools(options);
  session.onClose(() => tools.close());
  return tools;
}
