import { RolloutError } from '../errors.ts';
import { createApptainerProvider, findApptainerBinary, type ApptainerProviderOptions } from './apptainer/index.ts';
import { bwrapAvailable, createBwrapProvider, type BwrapProviderOptions } from './bwrap/index.ts';
import { createLocalProvider, type LocalProviderOptions } from './local.ts';
import type { SandboxProvider } from './types.ts';

export type SandboxProviderFactory = (options?: any) => SandboxProvider;

export interface SandboxProviderOptionsMap {
  bwrap: BwrapProviderOptions;
  apptainer: ApptainerProviderOptions;
  local: LocalProviderOptions;
}

const registry = new Map<string, SandboxProviderFactory>([
  ['bwrap', createBwrapProvider],
  ['apptainer', createApptainerProvider],
  ['singularity', createApptainerProvider],
  ['local', createLocalProvider],
]);

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
 * `{ apptainer: { binDir: '/opt/apptainer/bin' } }`.
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
  return factory(options ?? undefined);
}
