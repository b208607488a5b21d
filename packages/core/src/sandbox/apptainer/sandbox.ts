import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CommandSandbox, TAG_VAR, type HostCommand } from '../command-sandbox.ts';
import { limitWrapper } from '../limits.ts';
import { runProcess, shQuote } from '../process.ts';
import { BASE_ENV, SOCKET_MOUNT, type ResolvedSandboxSpec, type SandboxStatus } from '../types.ts';
import { buildExecArgv, buildInstanceStopArgv } from './args.ts';

export class ApptainerSandbox extends CommandSandbox {
  readonly provider = 'apptainer';
  private envFiles = 0;

  constructor(
    id: string,
    workdir: string,
    socketHost: string,
    private readonly resolved: ResolvedSandboxSpec,
    private readonly base: string,
    private readonly binary: string,
    private readonly name: string,
    /** Appended to every `exec` (the provider's `extraExecArgs`). */
    private readonly extraExecArgs: string[] | undefined,
    /** Ends the instance's use of its cached SIF (see sif-cache.ts), once it is stopped. */
    private readonly releaseImage?: () => void,
  ) {
    super(workdir, { host: socketHost, sandbox: SOCKET_MOUNT }, resolved, [base], id);
  }

  protected override async released(): Promise<void> {
    this.releaseImage?.();
  }

  protected wrap(inner: string[], env: Record<string, string>): HostCommand {
    // the env file lives in the staging dir, which is not bound into the instance
    const envFile = join(this.base, 'env', `${++this.envFiles}.env`);
    const lines = Object.entries(env).map(([key, value]) => `${key}=${shQuote(value)}`);
    writeFileSync(envFile, `${lines.join('\n')}\n`, { mode: 0o600 });
    const argv = buildExecArgv({
      binary: this.binary,
      name: this.name,
      envFile,
      ...(this.extraExecArgs === undefined ? {} : { extraExecArgs: this.extraExecArgs }),
      command: [...limitWrapper(this.resolved.resources), ...inner],
    });
    return { argv, env: { ...BASE_ENV, ...pickHostEnv(), [TAG_VAR]: env[TAG_VAR] ?? '' }, cwd: this.base };
  }

  protected override isSandboxFailure(stderr: string): boolean {
    return /fatal:|no instance found|instance not found|does not exist|^rs-limits:/im.test(stderr);
  }

  async status(): Promise<SandboxStatus> {
    if (this.closed) return 'stopped';
    const result = await runProcess([this.binary, 'instance', 'list', '--json'], {
      env: { ...BASE_ENV, ...pickHostEnv() },
      timeoutMs: 30_000,
      maxOutputBytes: 1 << 20,
    });
    if (result.code !== 0) return 'unknown';
    try {
      const parsed = JSON.parse(result.stdout.toString('utf8')) as { instances?: Array<{ instance?: string }> };
      return parsed.instances?.some((i) => i.instance === this.name) ? 'running' : 'stopped';
    } catch {
      return 'unknown';
    }
  }

  protected async stop(): Promise<void> {
    await runProcess(buildInstanceStopArgv(this.binary, this.name), {
      env: { ...BASE_ENV, ...pickHostEnv() },
      timeoutMs: 60_000,
      maxOutputBytes: 1 << 16,
    });
  }
}


/** Apptainer itself needs a few host variables (its cache and tmp dirs); commands never see them. */
export function pickHostEnv(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (value !== undefined && /^(APPTAINER_|SINGULARITY_|HOME$|USER$|XDG_RUNTIME_DIR$)/.test(key)) out[key] = value;
  }
  return out;
}

