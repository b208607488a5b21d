import { describe, expect, it } from 'vitest';
import { RolloutError } from '../errors.ts';
import { createSandboxProvider, registerSandboxProvider, sandboxProviderNames } from './registry.ts';

describe('createSandboxProvider', () => {
  it('creates the built-in providers by name and from a NeMo Gym-style config', () => {
    expect(createSandboxProvider('bwrap').name).toBe('bwrap');
    expect(createSandboxProvider('local').name).toBe('local');
    expect(createSandboxProvider({ apptainer: { binDir: '/nowhere' } }).name).toBe('apptainer');
    expect(sandboxProviderNames()).toEqual(expect.arrayContaining(['bwrap', 'apptainer', 'singularity', 'local']));
  });

  it('rejects unknown names with a RolloutError', () => {
    try {
      createSandboxProvider('docker-in-docker');
      expect.unreachable();
    } catch (error) {
      expect(RolloutError.isInstance(error)).toBe(true);
      expect((error as RolloutError).message).toContain('unknown sandbox provider');
    }
  });

  it('never picks local implicitly and takes third-party providers', () => {
    const previous = process.env.ROLLSERVE_SANDBOX_PROVIDER;
    delete process.env.ROLLSERVE_SANDBOX_PROVIDER;
    try {
      expect(createSandboxProvider().name).not.toBe('local');
    } finally {
      if (previous !== undefined) process.env.ROLLSERVE_SANDBOX_PROVIDER = previous;
    }
    registerSandboxProvider('fake', () => ({ name: 'fake', create: () => Promise.reject(new Error('no')) }));
    expect(createSandboxProvider('fake').name).toBe('fake');
  });

  it('refuses limits for a provider that does not say which it keeps, instead of letting it drop them', async () => {
    const created: unknown[] = [];
    registerSandboxProvider('silent', () => ({
      name: 'silent',
      create: (spec) => {
        created.push(spec);
        return Promise.reject(new Error('started'));
      },
    }));
    const provider = createSandboxProvider('silent');
    expect(provider.limits?.()).toEqual({});
    await expect(provider.create({ resources: { maxInodes: 100 } })).rejects.toThrow('the silent sandbox provider cannot keep the limit maxInodes (max_inodes)');
    expect(created).toEqual([]);
    await expect(provider.create({ image: 'x' })).rejects.toThrow('started'); // a spec without limits goes through as it was
    expect(created).toEqual([{ image: 'x' }]);
    // the built-in ones declare theirs
    for (const name of ['bwrap', 'local', 'apptainer']) expect(createSandboxProvider(name).limits?.()).toHaveProperty('memoryMib');
  });
});
