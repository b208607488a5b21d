import type { Logger } from 'pino';
import type { SessionTools } from '../tools/session-tools.ts';

/**
 * Per-rollout state. One session per rollout, keyed by the session cookie on the NeMo Gym face and
 * by the job on the rollout service. `state` is the environment's own bag; it is dropped after
 * `verify` (or by the idle reaper).
 */
export interface Session {
  /** Opaque id: a uuid. */
  readonly id: string;
  /** The environment's per-rollout state, for example `{ counter: 3 }`. */
  state: Record<string, unknown>;
  /**
   * Resources the session owns (sandboxes, kernels). Each is closed, in reverse order, when the
   * session ends, whatever happens to the rollout.
   */
  onClose(close: () => Promise<void> | void): void;
}

/**
 * What every hook of an environment receives besides its own arguments. Both faces build it the
 * same way, so a hook never needs to know which face runs it.
 */
export interface EnvironmentContext<Config = Record<string, unknown>, Resources = any> {
  /** The rollout's session. */
  session: Session;
  /**
   * The environment's configuration: the NeMo Gym YAML block of the server instance (after
   * interpolation), parsed by the environment's `config` schema when it has one.
   * @example { should_use_judge: false, library_verifier_timeout_seconds: 10 }
   */
  config: Config;
  /** A pino logger bound to the environment and the rollout. */
  logger: Logger;
  /** Aborted when the caller gives up (client gone, rollout cancelled or timed out). */
  signal: AbortSignal;
  /**
   * The session's sandbox and tool backends, closed with the session. The sandbox is the one
   * `sandbox` describes, for this session's row: the rollout service creates it in INIT (with
   * whatever the offered tools `prepare`), the NeMo Gym face on first use. Starting them is never
   * counted against a tool call's time limit (see `SessionTools.startupMs`).
   * @example const bash = await ctx.tools.bash(); await bash.run('ls')
   */
  tools: SessionTools;
  /**
   * What the environment's `setup` returned for this server (undefined without `setup`).
   * @example ctx.resources.grader.grade(expected, text)
   */
  resources: Resources;
}
