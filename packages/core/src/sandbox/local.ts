import { randomBytes } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildPrlimitArgs } from './limits.ts';
import { CommandSandbox, type HostCommand } from './command-sandbox.ts';
import type { SandboxProvider, SandboxSpec, SandboxStatus } from './types.ts';

export interface LocalProviderOptions {
  /** Where the per-sandbox temporary directories go. @default os.tmpdir() */
  tmpDir?: string;
}

/**
 * Plain processes in a temporary directory: no isolation at all, for development and for hosts
 * without user namespaces; only used when chosen by name. The workdir is the host temp dir (the
 * spec's `workdir` is ignored) and RLIMIT_NPROC is not set, since it would count every process of
 * the service's user.
 */
class LocalSandbox extends CommandSandbox {
  readonly provider = 'local';
  private readonly limits: string[];

  constructor(id: string, base: string, workdir: string, socketDir: string, spec: SandboxSpec) {
    super(workdir, { host: socketDir, sandbox: socketDir }, spec, [base], id);
    this.limits = buildPrlimitArgs(spec.resources, false);
  }

  protected wrap(inner: string[], env: Record<string, string>): HostCommand {
    return { argv: [...this.limits, ...inner], env, cwd: this.workdir };
  }

  protected override entersSandbox(): boolean {
    return false; // prlimit execs the program itself
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
    async create(spec: SandboxSpec = {}) {
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
