import type { Session } from '../spec/environment.ts';
import { createSandboxProvider } from '../sandbox/registry.ts';
import type { Sandbox, SandboxProvider, SandboxSpec } from '../sandbox/types.ts';
import { BashSession, type BashSessionOptions } from './bash.ts';
import { Editor } from './editor.ts';
import { PythonKernel, type PythonKernelOptions } from './python.ts';

export interface SessionToolsOptions {
  /** The provider that creates the session's sandbox. @default createSandboxProvider() */
  provider?: SandboxProvider;
  /** The sandbox to create. */
  spec?: SandboxSpec;
  bash?: BashSessionOptions;
  python?: PythonKernelOptions;
}

/**
 * A session's sandbox and tool backends, created on first use and closed with the session
 * (`session.onClose`). Each resource is created once even when calls race.
 */
export class SessionTools {
  private sandboxPromise: Promise<Sandbox> | undefined;
  private bashPromise: Promise<BashSession> | undefined;
  private pythonPromise: Promise<PythonKernel> | undefined;
  private editorInstance: Editor | undefined;
  private closed = false;
  private ownsSandbox = true;
  private created: Sandbox | undefined;

  constructor(private readonly options: SessionToolsOptions = {}) {}

  /** Uses a sandbox created elsewhere (the rollout service's INIT stage); it is not closed here. */
  attachSandbox(sandbox: Sandbox, options: { owned?: boolean } = {}): void {
    if (this.sandboxPromise !== undefined) throw new Error('the session already has a sandbox');
    this.ownsSandbox = options.owned ?? false;
    this.sandboxPromise = Promise.resolve(sandbox);
    this.created = sandbox;
  }

  sandbox(): Promise<Sandbox> {
    this.assertOpen();
    if (this.sandboxPromise === undefined) {
      this.sandboxPromise = (this.options.provider ?? createSandboxProvider()).create(this.options.spec ?? {});
      this.sandboxPromise.then((sandbox) => (this.created = sandbox), () => {});
    }
    return this.sandboxPromise;
  }

  /** Why the session's sandbox was ended by one of its limits, if it has one and it was. */
  limitExceeded(): string | undefined {
    return this.created?.checkLimits();
  }

  bash(): Promise<BashSession> {
    this.assertOpen();
    this.bashPromise ??= this.sandbox().then((sandbox) => BashSession.start(sandbox, this.options.bash));
    return this.bashPromise;
  }

  python(): Promise<PythonKernel> {
    this.assertOpen();
    this.pythonPromise ??= this.sandbox().then((sandbox) => PythonKernel.start(sandbox, this.options.python));
    return this.pythonPromise;
  }

  async editor(): Promise<Editor> {
    this.assertOpen();
    const sandbox = await this.sandbox();
    this.editorInstance ??= new Editor(sandbox);
    return this.editorInstance;
  }

  private assertOpen(): void {
    if (this.closed) throw new Error('session tools are closed');
  }

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
    if (this.ownsSandbox) await settle(this.sandboxPromise);
  }
}

// keyed by the session's state object: the same bag whichever Session wrapper a face hands out
const bySession = new WeakMap<object, SessionTools>();

/**
 * The session's tools, created on first use with `options` and closed when the session closes.
 *
 * @example
 * handler: async ({ command }, ctx) => (await sessionTools(ctx.session).bash()).run(command)
 */
export function sessionTools(session: Session, options?: SessionToolsOptions): SessionTools {
  let tools = bySession.get(session.state);
  if (tools === undefined) {
    tools = new SessionTools(options);
    bySession.set(session.state, tools);
    const created = tools;
    session.onClose(async () => {
      bySession.delete(session.state);
      await created.close();
    });
  }
  return tools;
}
