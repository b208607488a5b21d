import { createHash } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { SANDBOX_LIMITS, type Sandbox, type SandboxLimit, type SandboxProvider, type SandboxSpec } from '@rollserve/core/sandbox';

/** Sandboxes a test created; closed in afterEach whatever the test did. */
export class SandboxPool {
  private readonly open: Sandbox[] = [];
  constructor(private readonly provider: () => SandboxProvider) {}
  async create(spec: SandboxSpec = {}): Promise<Sandbox> {
    const sandbox = await this.provider().create(spec);
    this.open.push(sandbox);
    return sandbox;
  }
  async close(): Promise<void> {
    await Promise.all(this.open.splice(0).map((s) => s.close()));
  }
}

/**
 * The behaviour every provider must show (`describeSandboxBehaviour('docker', () => createDockerProvider())`
 * in a provider package's tests), run here against bwrap, local and (where the binary exists)
 * apptainer. `skip` is the printed reason when the provider cannot run here.
 */
export function describeSandboxBehaviour(name: string, provider: () => SandboxProvider, options: { skip?: string; spec?: SandboxSpec } = {}): void {
  if (options.skip !== undefined) console.warn(`[sandbox suite] skipping ${name}: ${options.skip}`);
  describe.skipIf(options.skip !== undefined)(`sandbox behaviour: ${name}`, () => {
    const pool = new SandboxPool(provider);
    const create = (spec: SandboxSpec = {}) => pool.create({ ...options.spec, ...spec });
    afterEach(() => pool.close());

    it('runs a command and reports stdout, stderr and the exit code', async () => {
      const sandbox = await create();
      const result = await sandbox.exec('echo out; echo err >&2; exit 3');
      expect(result).toEqual({ stdout: 'out\n', stderr: 'err\n', returnCode: 3 });
    });

    it('runs in the workdir by default, honours cwd and env, and feeds stdin', async () => {
      const sandbox = await create({ env: { FROM_SPEC: 'spec' } });
      expect((await sandbox.exec('pwd')).stdout.trim()).toBe(sandbox.workdir);
      expect((await sandbox.exec('pwd', { cwd: '/tmp' })).stdout).toBe('/tmp\n');
      const env = await sandbox.exec('echo "$FROM_SPEC $FROM_CALL"', { env: { FROM_CALL: 'call' } });
      expect(env.stdout).toBe('spec call\n');
      expect((await sandbox.exec('tr a-z A-Z', { stdin: 'hello' })).stdout).toBe('HELLO');
      const missing = await sandbox.exec('pwd', { cwd: '/does/not/exist' });
      expect(missing.returnCode).not.toBe(0);
    });

    it('keeps files between commands and round-trips binary upload and download', async () => {
      const sandbox = await create({ files: { 'seeded.txt': 'from spec' } });
      expect((await sandbox.exec('cat seeded.txt')).stdout).toBe('from spec');
      const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
      await sandbox.upload(`${sandbox.workdir}/dir/bin.dat`, bytes);
      expect((await sandbox.exec('wc -c < dir/bin.dat')).stdout.trim()).toBe('256');
      expect(Buffer.compare(await sandbox.download(`${sandbox.workdir}/dir/bin.dat`), bytes)).toBe(0);
      await expect(sandbox.download(`${sandbox.workdir}/nope`)).rejects.toThrow(/nope/);
      // Whole files above an exec's output cap (10 MiB) come back whole, not cut in the middle.
      await sandbox.exec('head -c 12000000 /dev/urandom > big.bin');
      const big = await sandbox.download(`${sandbox.workdir}/big.bin`);
      expect(big.length).toBe(12_000_000);
      expect((await sandbox.exec('sha256sum < big.bin')).stdout.split(' ')[0]).toBe(createHash('sha256').update(big).digest('hex'));
    });

    it('ends a command at its time limit with 125/timeout and stays usable', async () => {
      const sandbox = await create();
      const started = Date.now();
      const result = await sandbox.exec('echo partial; sleep 30', { timeoutMs: 300 });
      expect(Date.now() - started).toBeLessThan(3000);
      expect(result.returnCode).toBe(125);
      expect(result.errorType).toBe('timeout');
      expect(result.stdout).toBe('partial\n');
      expect((await sandbox.exec('echo ok')).stdout).toBe('ok\n');
    });

    it('runs concurrent commands independently', async () => {
      const sandbox = await create();
      const results = await Promise.all(Array.from({ length: 16 }, (_, i) => sandbox.exec(`echo ${i}; exit ${i % 3}`)));
      results.forEach((r, i) => {
        expect(r.stdout).toBe(`${i}\n`);
        expect(r.returnCode).toBe(i % 3);
      });
    });

    it('reports status and refuses work after close (125/sandbox)', async () => {
      const sandbox = await create();
      expect(await sandbox.status()).toBe('running');
      await sandbox.close();
      await sandbox.close();
      expect(await sandbox.status()).toBe('stopped');
      const result = await sandbox.exec('echo hi');
      expect(result.returnCode).toBe(125);
      expect(result.errorType).toBe('sandbox');
    });

    it('stays within its limits while it works, and says so', async () => {
      const sandbox = await create();
      await sandbox.exec('echo hi > f');
      expect(sandbox.checkLimits()).toBeUndefined();
      await sandbox.close();
      expect(sandbox.checkLimits()).toBeUndefined(); // closed by its owner, not by a limit
    });

    it('declares the limits it keeps, and refuses a spec giving any other, naming it', async () => {
      const declared = provider().limits?.();
      expect(declared, 'a provider says which limits it keeps (SandboxProvider.limits)').toBeDefined();
      const refused = (Object.keys(SANDBOX_LIMITS) as SandboxLimit[]).filter((limit) => declared![limit] === undefined);
      for (const limit of refused) {
        await expect(create({ resources: { [limit]: 64 } }), limit).rejects.toThrow(new RegExp(`cannot keep the limit ${limit}\\b`));
      }
      // defaults are not given: a spec without resources runs whatever the provider keeps
      expect((await (await create()).exec('echo ok')).stdout).toBe('ok\n');
    });

    it('gives every process an open-files limit, the one the spec asks for', async (context) => {
      if (provider().limits?.().maxOpenFiles === undefined) return context.skip('the provider does not keep maxOpenFiles');
      const sandbox = await create({ resources: { maxOpenFiles: 48 } });
      // (sh builtins only: an image may have no grep)
      const probe = 'echo "nofile $(ulimit -Sn) $(ulimit -Hn)"';
      expect((await sandbox.exec(probe)).stdout).toBe('nofile 48 48\n');
      // the processes that enter from outside (a PTY, a piped process) too
      const term = sandbox.spawnPty(['/bin/sh', '-c', probe]);
      let out = '';
      term.onData((d) => {
        out += d;
      });
      await new Promise<void>((resolve) => term.onExit(() => resolve()));
      expect(out).toContain('nofile 48 48');
      const proc = sandbox.spawn(['/bin/sh', '-c', probe]);
      let piped = '';
      proc.stdout.on('data', (d: Buffer) => {
        piped += d.toString();
      });
      // (its exit can come before the last of its output: read to the end of the pipe too)
      const drained = new Promise((resolve) => proc.stdout.once('end', resolve));
      expect(await proc.exited).toBe(0);
      await drained;
      expect(piped).toBe('nofile 48 48\n');
      // and a default where none is asked for
      expect((await (await create()).exec(probe)).stdout).toMatch(/^nofile \d+ \d+\n$/);
    });

    it('has the kernel keep the file count: creating files past it fails at once (ENOSPC), in one command', async (context) => {
      if (provider().limits?.().maxInodes === undefined) return context.skip('the provider does not keep maxInodes');
      const sandbox = await create({ resources: { maxInodes: 400 } });
      // one command tries 2000 files: a sampled cap would let it make them all before it looked
      const result = await sandbox.exec('i=0; while [ $i -lt 2000 ] && touch "f$i" 2>/dev/null; do i=$((i+1)); done; echo "made $i"; touch one-more');
      const made = Number(/made (\d+)/.exec(result.stdout)?.[1]);
      expect(made).toBeGreaterThan(0);
      expect(made).toBeLessThanOrEqual(400);
      expect(result.stderr).toMatch(/No space left on device/);
      // reaching it ends the sandbox, with the reason
      expect(sandbox.checkLimits()).toEqual(expect.any(String));
    });

    it('has the kernel keep the workspace size (ENOSPC), never the host disk', async (context) => {
      if (provider().limits?.().workspaceMib === undefined) return context.skip('the provider does not keep workspaceMib');
      const sandbox = await create({ resources: { workspaceMib: 8 } });
      const result = await sandbox.exec('head -c 16777216 /dev/zero > big; echo "rc=$?"; wc -c < big');
      expect(result.stderr).toMatch(/No space left on device/);
      expect(Number(result.stdout.trim().split('\n').at(-1))).toBeLessThanOrEqual(8 * 1024 * 1024);
    });

    it('stages read-only files for the sandbox', async () => {
      const sandbox = await create();
      const path = sandbox.stageFile('staged.txt', 'from the service');
      expect((await sandbox.exec(`cat ${path}`)).stdout).toBe('from the service');
      expect(() => sandbox.stageFile('../escape', 'x')).toThrow();
    });

    it('offers a PTY and piped processes inside the sandbox', async () => {
      const sandbox = await create();
      const term = sandbox.spawnPty(['/bin/sh', '-c', 'test -t 0 && echo tty-ok; pwd']);
      let out = '';
      term.onData((d) => {
        out += d;
      });
      await new Promise<void>((resolve) => term.onExit(() => resolve()));
      expect(out).toContain('tty-ok');
      expect(out).toContain(sandbox.workdir);
      const proc = sandbox.spawn(['/bin/sh', '-c', 'read line; echo "got $line"']);
      let piped = '';
      proc.stdout.on('data', (d: Buffer) => {
        piped += d.toString();
      });
      proc.stdin.end('x\n');
      expect(await proc.exited).toBe(0);
      expect(piped).toBe('got x\n');
    });

    it('delivers PTY writes whole and in order past a full terminal, and ignores writes after exit', async () => {
      const sandbox = await create();
      // 300 kB is far more than a terminal buffers, so the writes below outrun the reader and must
      // wait their turn; lines stay under the terminal's 4 kB line limit (no stty in every image).
      // The sum goes to a file: a terminal's last output can be lost when its program exits.
      const term = sandbox.spawnPty(['/bin/sh', '-c', 'echo ready; head -c 300000 | sha256sum > pty-write.sum']);
      let out = '';
      const ready = new Promise<void>((resolve) => {
        term.onData((d) => {
          out += d;
          if (out.includes('ready')) resolve();
        });
      });
      const exited = new Promise<void>((resolve) => term.onExit(() => resolve()));
      await ready;
      const chunks = Array.from({ length: 300 }, (_, i) => `${String(i).padStart(4, '0')}:${'abcdefghij'.repeat(100)}`.slice(0, 999) + '\n');
      for (const chunk of chunks) term.write(chunk);
      await exited;
      expect((await sandbox.exec('cat pty-write.sum')).stdout).toContain(createHash('sha256').update(chunks.join('')).digest('hex'));
      expect(() => term.write('late\n')).not.toThrow();
    });
  });
}
