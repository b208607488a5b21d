import { randomBytes } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildPrlimitArgs, openFilesWithin, resolveSandboxSpec } from './limits.ts';
import { CommandSandbox, type HostCommand } from './command-sandbox.ts';
import type { ResolvedSandboxSpec, SandboxLimitSupport, SandboxProvider, SandboxSpec, SandboxStatus } from './types.ts';

export interface LocalProviderOptions {
  /** Where the per-sandbox temporary directories go. @default os.tmpdir() */
  tmpDir?: string;
}

/**
 * What the local provider keeps: the per-process rlimits, set by `prlimit`. Not RLIMIT_NPROC (it
 * would count every process of the service's user), and no tmpfs or cgroup: the workspace is a
 * host directory. Their defaults are not applied; a spec giving one is refused.
 */
const LOCAL_LIMITS: SandboxLimitSupport = {
  memoryMib: 'RLIMIT_AS (prlimit)',
  maxFileSizeMib: 'RLIMIT_FSIZE (prlimit)',
  cpuSeconds: 'RLIMIT_CPU (prlimit)',
  maxOpenFiles: 'RLIMIT_NOFILE (prlimit)',
};

/**
 * Plain processes in a temporary directory: no isolation at all, for development and for hosts
 * without user namespaces; only used when chosen by name. The workdir is the host temp dir (the
 * spec's `workdir` is ignored); see LOCAL_LIMITS for the limits it keeps.
 */
class LocalSandbox extends CommandSandbox {
  readonly provider = 'local';
  private readonly limits: string[];

  constructor(id: string, base: string, workdir: string, socketDir: string, spec: ResolvedSandboxSpec) {
    super(workdir, { host: socketDir, sandbox: socketDir }, spec, [base], id);
    this.limits = buildPrlimitArgs(spec.resources);
  }

  protected wrap(inner: string[], env: Record<string, string>): HostCommand {
    return { argv: [...this.limits, ...inner], env, cwd: this.workdir };
  }

  protected override entersSandbox(): boolean {
    return false; // prlimit execs the program itself
  }

  protected override isSandboxFailure(stderr: string): boolean {
    return /^prlimit:/m.test(stderr);
  }

  async status(): Promise<SandboxStatus> {
    return this.closed ? 'stopped' : 'running';
  }

  protected async stop(): Promise<void> {
    // the tracked process trees were killed by close()
  }
}

export function createLocalProvider(options: LocalProviderOptions = {}): SandboxProvider {
  return {
    name: 'local',
    limits: () => ({ ...LOCAL_LIMITS }),
    async create(requested: SandboxSpec = {}) {
      const resolved = resolveSandboxSpec(requested, { name: 'local', limits: LOCAL_LIMITS });
      const spec = { ...resolved, resources: { ...resolved.resources, maxOpenFiles: openFilesWithin(resolved, 'local') } };
      const id = `rs-${randomBytes(6).toString('hex')}`;
      const base = join(options.tmpDir ?? tmpdir(), `rollserve-${id}`);
      const workdir = join(base, 'workspace');
      const socketDir = join(base, 'sock');
      await mkdir(base, { mode: 0o700 });
      await Promise.all([mkdir(workdir), mkdir(socketDir)]);
      const sandbox = new LocalSandbox(id, base, workdir, socketDir, spec);
      await sandbox.writeSpecFiles();
      return sandbox;
    },
  };
}
