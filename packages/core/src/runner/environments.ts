import { createSandboxProvider } from '../sandbox/registry.ts';
import type { SandboxProvider, SandboxSpec } from '../sandbox/types.ts';
import type { Environment } from '../spec/environment.ts';

/**
 * What environments' `setup`s returned, by environment name, shared by runners of one process
 * (the start-up warm-up's and the service's, so that the service serves with the worker pools the
 * warm-up already started and warmed). Whoever owns them closes them.
 */
export type EnvironmentSetups = Map<string, Promise<unknown>>;

/**
 * The environments a runner serves, with their configs (parsed once), their `setup` (run on the
 * first rollout) and the sandboxes they have open.
 */
export class RunnerEnvironments {
  readonly #list: ReadonlyArray<Environment<any, any, any>>;
  readonly #envs = new Map<string, Environment<any, any, any>>();
  readonly #configs: Record<string, Record<string, unknown>> = {};
  /** What each environment's `setup` returned (started on its first rollout). */
  readonly #setups: EnvironmentSetups;
  /** Whether `close` closes the environments (false: their setups belong to another runner). */
  readonly #ownsSetups: boolean;
  readonly #sandboxes: CountedSandboxes;

  constructor(
    environments: ReadonlyArray<Environment<any, any, any>>,
    configs: Record<string, Record<string, unknown>> | undefined,
    sandboxProvider: SandboxProvider | undefined,
    shared: { setups?: EnvironmentSetups | undefined; closeEnvironments?: boolean | undefined } = {},
  ) {
    this.#list = environments;
    this.#setups = shared.setups ?? new Map();
    this.#ownsSetups = shared.closeEnvironments ?? true;
    for (const env of environments) {
      this.#envs.set(env.name, env);
      const given = configs?.[env.name] ?? {};
      this.#configs[env.name] = (env.config ? env.config.parse(given) : given) as Record<string, unknown>;
    }
    this.#sandboxes = new CountedSandboxes(sandboxProvider);
  }

  get names(): string[] {
    return [...this.#envs.keys()];
  }

  get(name: string): Environment<any, any, any> | undefined {
    return this.#envs.get(name);
  }

  config(env: Environment<any, any, any>): Record<string, unknown> {
    return this.#configs[env.name] ?? {};
  }

  /** Sandboxes open now, from every provider (GET /v1/status, /metrics). */
  get liveSandboxes(): number {
    return this.#sandboxes.live;
  }

  /** See RolloutRunner.rowSandboxSpec. */
  rowSandboxSpec(envName: string, row: Record<string, unknown>): SandboxSpec | undefined {
    const env = this.#envs.get(envName);
    if (!env?.sandbox?.spec) return undefined;
    return env.sandbox.spec(row, this.config(env));
  }

  /** The environment's `setup`, run once (on its first rollout); a failed one is tried again. */
  setupOf(env: Environment<any, any, any>): Promise<unknown> {
    if (!env.setup) return Promise.resolve(undefined);
    let started = this.#setups.get(env.name);
    if (!started) {
      const run = Promise.resolve().then(() => env.setup!(this.config(env)));
      run.catch(() => {
        if (this.#setups.get(env.name) === run) this.#setups.delete(env.name);
      });
      this.#setups.set(env.name, run);
      started = run;
    }
    return started;
  }

  /** Where a rollout of the environment gets its sandbox: the environment's provider, else the runner's. */
  sandboxProvider(env: Environment<any, any, any>, resources: unknown): SandboxProvider {
    return this.#sandboxes.provider(env.sandbox?.provider?.(this.config(env), resources));
  }

  /**
   * Closes every environment (one with a `setup` only if it ran, with what it returned); not
   * shared setups it does not own. The default provider, if it made one, too (its warm sandboxes).
   */
  async close(): Promise<void> {
    await this.#sandboxes.close();
    if (!this.#ownsSetups) return;
    await Promise.all(
      this.#list.map(async (env) => {
        if (!env.setup) return env.close?.(undefined);
        const started = this.#setups.get(env.name);
        if (started === undefined) return;
        const ran = await started.then((value) => ({ value }), () => undefined);
        if (ran) await env.close?.(ran.value);
      }),
    );
  }
}

/** Sandbox providers, each wrapped to count what it has open. */
class CountedSandboxes {
  live = 0;
  readonly #counted = new Map<SandboxProvider, SandboxProvider>();
  #fallback: SandboxProvider | undefined;
  /** The fallback when this made it (closed with the runner); a given one is its giver's. */
  #made: SandboxProvider | undefined;

  /**
   * `fallback`: the provider of environments that name none (@default createSandboxProvider(),
   * made at first use: warm bwrap sandboxes sized to demand).
   */
  constructor(fallback: SandboxProvider | undefined) {
    this.#fallback = fallback;
  }

  /** `given` (the environment's provider), else the fallback, counted. */
  provider(given?: SandboxProvider): SandboxProvider {
    const inner = given ?? (this.#fallback ??= this.#made = createSandboxProvider());
    const known = this.#counted.get(inner);
    if (known) return known;
    const counted: SandboxProvider = {
      name: inner.name,
      create: async (spec) => {
        const sandbox = await inner.create(spec);
        this.live++;
        let open = true;
        const close = sandbox.close.bind(sandbox);
        return Object.assign(sandbox, {
          close: async () => {
            if (open) {
              open = false;
              this.live--;
            }
            await close();
          },
        });
      },
      ...(inner.prefetch === undefined ? {} : { prefetch: (spec: SandboxSpec) => inner.prefetch!(spec) }),
    };
    this.#counted.set(inner, counted);
    return counted;
  }

  /** Closes the provider it made (its warm sandboxes, fork servers and spawner); the runner's sessions are closed by then. */
  async close(): Promise<void> {
    await this.#made?.close?.();
  }
}
