import { describe, expect, it } from 'vitest';
import { RolloutError } from '../errors.ts';
import { inodeShares, limitWrapper, resolveSandboxSpec, SANDBOX_LIMITS, serviceHardLimit } from './limits.ts';
import { DEFAULT_RESOURCES, type SandboxLimitSupport } from './types.ts';

const refusal = (fn: () => unknown): RolloutError => {
  try {
    fn();
  } catch (error) {
    expect(RolloutError.isInstance(error)).toBe(true);
    return error as RolloutError;
  }
  throw new Error('not refused');
};

describe('resolveSandboxSpec', () => {
  it('fills every default once and says which limits the spec gave', () => {
    const resolved = resolveSandboxSpec({ image: 'x', env: { A: '1' }, resources: { tmpMib: 16, maxOpenFiles: 64 } });
    expect(resolved.resources).toEqual({ ...DEFAULT_RESOURCES, tmpMib: 16, maxOpenFiles: 64 });
    expect([...resolved.given].sort()).toEqual(['maxOpenFiles', 'tmpMib']);
    expect(resolved.image).toBe('x');
    expect(resolved.env).toEqual({ A: '1' });
    expect(resolveSandboxSpec().resources).toEqual(DEFAULT_RESOURCES);
    expect(resolveSandboxSpec({ resources: { cpus: 1.5 } }).resources.cpus).toBe(1.5);
  });

  it('has an open-files default, and a task name for every limit', () => {
    expect(DEFAULT_RESOURCES.maxOpenFiles).toBe(1024);
    expect(Object.keys(SANDBOX_LIMITS).sort()).toEqual([...Object.keys(DEFAULT_RESOURCES), 'cpus'].sort());
  });

  it('refuses values that are no limit, naming the limit', () => {
    for (const bad of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, '10' as unknown as number]) {
      const error = refusal(() => resolveSandboxSpec({ resources: { maxInodes: bad } }));
      expect(error.message).toContain('maxInodes (max_inodes)');
      expect(error.code).toBe('SANDBOX');
    }
    expect(refusal(() => resolveSandboxSpec({ resources: { nrInodes: 5 } as never })).message).toMatch(/unknown sandbox limit "nrInodes"/);
    expect(refusal(() => resolveSandboxSpec({ resources: { maxInodes: 19 } })).message).toContain('must be at least 20');
  });

  it('refuses a given limit the provider cannot keep, and leaves its default unapplied', () => {
    const limits: SandboxLimitSupport = { memoryMib: 'RLIMIT_AS', maxOpenFiles: 'RLIMIT_NOFILE' };
    const error = refusal(() => resolveSandboxSpec({ resources: { memoryMib: 10, workspaceMib: 8 } }, { name: 'toy', limits }));
    expect(error.message).toContain('the toy sandbox provider cannot keep the limit workspaceMib (workspace_mib)');
    expect(error.message).toContain('it keeps memoryMib (memory_mib), maxOpenFiles (max_open_files)');
    expect(error.details).toEqual({ limit: 'workspaceMib' });
    expect(error.code).toBe('SANDBOX');
    // defaults are not "given": a provider without a workspace size takes a spec without one
    expect(resolveSandboxSpec({ resources: { memoryMib: 10 } }, { name: 'toy', limits }).given).toEqual(new Set(['memoryMib']));
  });
});

describe('inodeShares', () => {
  it('splits maxInodes between the workspace, /tmp and /dev/shm, never more in all', () => {
    expect(inodeShares(200_000)).toEqual({ workspace: 150_000, tmp: 40_000, shm: 10_000 });
    for (const n of [20, 21, 99, 999, 20_000, 123_457]) {
      const shares = inodeShares(n);
      expect(shares.workspace + shares.tmp + shares.shm).toBe(n);
      expect(Math.min(shares.workspace, shares.tmp, shares.shm)).toBeGreaterThanOrEqual(1);
    }
  });
});

describe('rlimit forms', () => {
  it('apptainer sets the per-process limits in the instance, open files included, or fails the command', () => {
    const [sh, flag, script] = limitWrapper({ memoryMib: 10, maxFileSizeMib: 1, cpuSeconds: 2, maxOpenFiles: 33 });
    expect([sh, flag]).toEqual(['/bin/sh', '-c']);
    expect(script).toContain('ulimit -n 33 || { echo "rs-limits: cannot set the open files to 33" >&2; exit 125; }');
    expect(script).not.toMatch(/ulimit -[up]/);
  });

  it('reads the service\'s own hard limits', () => {
    const hard = serviceHardLimit('Max open files');
    expect(hard === undefined || hard >= 1).toBe(true);
    expect(serviceHardLimit('No such limit')).toBeUndefined();
  });
});
