import { RolloutError } from '../errors.ts';
import { createApptainerProvider, findApptainerBinary } from './apptainer/index.ts';
import { bwrapAvailable, createBwrapProvider, type BwrapProviderOptions } from './bwrap/index.ts';
import { resolveSandboxSpec } from './limits.ts';
import { createLocalProvider } from './local.ts';
import type { SandboxProvider, SandboxSpec } from './types.ts';

export type SandboxProviderFactory = (options?: any) => SandboxProvider;

/**
 * bwrap as users get it (the service's, a node's and NeMo Gym's default provider): warm sandboxes
 * per spec sized to demand (`warm: 'auto'`, else `$ROLLSERVE_SANDBOX_WARM`: 'auto' or a number,
 * 0 for none), unless the options say. An idle provider keeps none.
 */
function createDefaultBwrapProvider(options: BwrapProviderOptions = {}): SandboxProvider {
  return createBwrapProvider({ ...options, warm: options.warm ?? warmFromEnv() });
}

function warmFromEnv(): number | 'auto' {
  const given = process.env.ROLLSERVE_SANDBOX_WARM;
  if (given === undefined || given === '' || given === 'auto') return 'auto';
  const count = Number(given);
  if (!Number.isInteger(count) || count < 0) {
    throw new RolloutError({ code: 'BAD_REQUEST', message: `ROLLSERVE_SANDBOX_WARM is "auto" or a whole number of warm sandboxes per spec, not "${given}"` });
  }
  return count;
}

/** The built-in providers by name; a new one is its folder and one line here. */
const BUILT_IN = {
  bwrap: createDefaultBwrapProvider,
  apptainer: createApptainerProvider,
  singularity: createApptainerProvider,
  local: createLocalProvider,
} satisfies Record<string, SandboxProviderFactory>;

/** Each built-in provider's options, by name (from its factory's parameter). */
export type SandboxProviderOptionsMap = { [N in keyof typeof BUILT_IN]: NonNullable<Parameters<(typeof BUILT_IN)[N]>[0]> };

const registry = new Map<string, SandboxProviderFactory>(Object.entries(BUILT_IN));

/** Adds a provider (NeMo Gym's third-party providers register the same way). */
export function registerSandboxProvider(name: string, factory: SandboxProviderFactory): void {
  registry.set(name, factory);
}

export function sandboxProviderNames(): string[] {
  return [...registry.keys()];
}

/**
 * The provider used when none is named: `ROLLSERVE_SANDBOX_PROVIDER`, else bwrap on Linux when it
 * is installed, else Apptainer/Singularity when found. `local` is never chosen implicitly.
 */
export function defaultSandboxProviderName(): string {
  const fromEnv = process.env.ROLLSERVE_SANDBOX_PROVIDER;
  if (fromEnv !== undefined && fromEnv !== '') return fromEnv;
  if (bwrapAvailable()) return 'bwrap';
  if (findApptainerBinary() !== undefined) return 'apptainer';
  throw new RolloutError({
    code: 'SANDBOX',
    message: 'no sandbox provider is available (bwrap or apptainer); choose "local" explicitly to run without isolation',
  });
}

/**
 * Creates a provider by name, or from a NeMo Gym-style single-key config such as
 * `{ apptainer: { binDir: '/opt/apptainer/bin' } }`. bwrap keeps warm sandboxes sized to demand
 * (`warm: 'auto'`, or `$ROLLSERVE_SANDBOX_WARM`) unless its options give `warm`; whoever creates
 * a provider closes it (`provider.close()` ends its warm sandboxes).
 *
 * @example
 * const provider = createSandboxProvider('bwrap');
 * const sandbox = await provider.create({ network: false });
 */
export function createSandboxProvider<N extends keyof SandboxProviderOptionsMap>(
  name: N,
  options?: SandboxProviderOptionsMap[N],
): SandboxProvider;
export function createSandboxProvider(name?: string | Record<string, unknown>, options?: unknown): SandboxProvider;
export function createSandboxProvider(name?: string | Record<string, unknown>, options?: unknown): SandboxProvider {
  if (typeof name === 'object' && name !== null) {
    const keys = Object.keys(name);
    if (keys.length !== 1) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: 'a sandbox provider config has exactly one key, the provider name' });
    }
    return createSandboxProvider(keys[0]!, name[keys[0]!] ?? undefined);
  }
  const resolved = name ?? defaultSandboxProviderName();
  const factory = registry.get(resolved);
  if (factory === undefined) {
    throw new RolloutError({
      code: 'BAD_REQUEST',
      message: `unknown sandbox provider "${resolved}" (known: ${sandboxProviderNames().join(', ')})`,
    });
  }
  return declaringLimits(factory(options ?? undefined));
}

/**
 * A provider that does not say which limits it keeps (`limits`) is taken to keep none: a spec
 * giving one is refused, not passed on to be dropped in silence.
 */
function declaringLimits(provider: SandboxProvider): SandboxProvider {
  if (provider.limits !== undefined) return provider;
  return {
    name: provider.name,
    limits: () => ({}),
    create: async (spec?: SandboxSpec) => {
      resolveSandboxSpec(spec, { name: provider.name, limits: {} });
      return provider.create(spec);
    },
    ...(provider.close === undefined ? {} : { close: () => provider.close!() }),
    ...(provider.prefetch === undefined ? {} : { prefetch: (spec: SandboxSpec) => provider.prefetch!(spec) }),
  };
}
