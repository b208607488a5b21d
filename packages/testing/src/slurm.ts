import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { accessSync, closeSync, constants, openSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { hostname, tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';

const exec = promisify(execFile);

export interface TestSlurmOptions {
  /** Nodes n1..nN, each its own `slurmd -N nX` on its own port (default 4). */
  nodes?: number;
  /** CPUs each node declares (all nodes share the host's cores; default 2). */
  cpusPerNode?: number;
  /**
   * Seconds a node may miss slurmctld's pings before it is marked DOWN (Slurm pings every third
   * of it). Default 10.
   */
  slurmdTimeoutS?: number;
  /**
   * munge credential lifetime in seconds. It also holds back a requeued job's restart that long
   * (Slurm's default, 120 s, would make every requeue test wait two minutes). Default 10.
   */
  credExpireS?: number;
  /** Extra slurm.conf lines (appended before the node and partition lines). */
  extraConfig?: string[];
}

/** A node as `scontrol show node` reports it. */
export interface SlurmNodeState {
  /** The whole state, e.g. `IDLE`, `ALLOCATED+DRAIN`, `DOWN+NOT_RESPONDING`. */
  state: string;
  /** The base state without flags: `IDLE`, `ALLOCATED`, `MIXED`, `DOWN`, `COMPLETING`, … */
  base: string;
  /** The flags after the base state: `DRAIN`, `NOT_RESPONDING`, `COMPLETING`, … */
  flags: string[];
  reason?: string;
}

/** A job (or one task of a job array) as `scontrol show job` reports it. */
export interface SlurmJob {
  jobId: string;
  /** For array tasks: the array's job id and this task's index (a range for pending tasks not yet split). */
  arrayJobId?: string;
  arrayTaskId?: string;
  /** `PENDING`, `RUNNING`, `COMPLETED`, `FAILED`, `CANCELLED`, `NODE_FAIL`, `REQUEUED`, … */
  state: string;
  reason: string;
  /** How often the job was requeued. */
  restarts: number;
  /** Nodes it runs (or ran) on, `None assigned` while pending. */
  nodeList: string;
  batchHost?: string;
  exitCode: string;
  /** Every field scontrol printed. */
  fields: Record<string, string>;
}

export interface TestSlurm {
  /** The cluster's directory: config, state, spool, logs, munge socket, and the cwd of `run`. */
  dir: string;
  /** `jobs/` in `dir`: the default working directory of submitted jobs (their output files land here). */
  jobsDir: string;
  logDir: string;
  /** `n1`..`nN`. */
  nodes: string[];
  partition: string;
  /** The environment for Slurm clients and anything that calls them: `SLURM_CONF`, no inherited `SLURM_*`. */
  env: Record<string, string>;
  slurmdTimeoutS: number;
  credExpireS: number;
  /** How long bring-up took (config, munged, slurmctld, every node IDLE), in ms. */
  startupMs: number;
  /** Runs a Slurm client (`sbatch`, `srun`, `scontrol`, `squeue`, …) against this cluster; throws with its stderr on failure. */
  run(command: string, args: readonly string[], options?: { cwd?: string; env?: Record<string, string> }): Promise<{ stdout: string; stderr: string }>;
  /** `sbatch --parsable …`: the job id (the array's job id for `--array`). */
  sbatch(args: readonly string[], options?: { env?: Record<string, string> }): Promise<string>;
  /** Every job this cluster still knows (finished jobs stay listed for MinJobAge = 300 s), or one job / array's tasks. */
  jobs(jobId?: string): Promise<SlurmJob[]>;
  cancel(jobId: string): Promise<void>;
  nodeState(node: string): Promise<SlurmNodeState>;
  /** `scontrol update NodeName=… State=…`; DOWN and DRAIN need a reason. */
  setNodeState(node: string, state: 'DOWN' | 'RESUME' | 'DRAIN' | 'UNDRAIN' | 'IDLE', reason?: string): Promise<void>;
  /** SIGKILLs that node's slurmd and waits until it is dead (its slurmstepds and tasks keep running, as on a real crash). */
  killSlurmd(node: string): Promise<void>;
  /** Starts that node's slurmd again and waits until slurmctld sees it responding. */
  restartSlurmd(node: string): Promise<void>;
  /** PIDs of the daemons this cluster started and that are still alive. */
  daemonPids(): number[];
  /**
   * Polls `check` every `intervalMs` (default 250) until it returns something other than
   * undefined/false, for at most `timeoutMs` (default 60 s); then throws naming `what`.
   */
  waitFor<T>(what: string, check: () => Promise<T | undefined | false> | T | undefined | false, options?: { timeoutMs?: number; intervalMs?: number }): Promise<T>;
  /**
   * Cancels every job, kills what is left of this cluster's job steps (slurmstepd processes and
   * their trees whose cwd is in `dir`, and any process whose cwd is in `dir`), stops the daemons
   * it started and removes `dir`. Safe to call twice.
   */
  close(): Promise<void>;
}

const INSTALL_HINT = 'install Slurm and munge (Debian/Ubuntu: apt-get install slurm-wlm munge; scripts/install.sh does it)';
const DAEMONS = ['munged', 'slurmctld', 'slurmd', 'slurmstepd'] as const;
const CLIENTS = ['munge', 'unmunge', 'sbatch', 'srun', 'scontrol', 'squeue', 'sinfo', 'scancel'] as const;

function findCommand(name: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin', '/sbin', '/usr/bin', '/usr/local/sbin', '/usr/local/bin'];
  for (const dir of dirs) {
    if (!dir) continue;
    const path = join(dir, name);
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      // not here
    }
  }
  return undefined;
}

/**
 * Why a single-host test cluster cannot start here (missing commands, not root), or undefined
 * when it can. Tests skip on it locally; under CI (`process.env.CI`) they must fail instead.
 */
export function slurmMissing(): string | undefined {
  const missing = [...DAEMONS, ...CLIENTS].filter((name) => findCommand(name) === undefined);
  if (missing.length > 0) return `missing ${missing.join(', ')}: ${INSTALL_HINT}`;
  if (process.getuid?.() !== 0) return 'the single-host Slurm cluster runs as root (slurmd starts job steps as the submitting user)';
  return undefined;
}

export function slurmAvailable(): boolean {
  return slurmMissing() === undefined;
}

/** Distinct free loopback ports, all held open until every one is chosen. */
async function freePorts(count: number): Promise<number[]> {
  const servers: Server[] = [];
  try {
    for (let i = 0; i < count; i++) {
      const server = createServer();
      servers.push(server);
      await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
    }
    return servers.map((server) => (server.address() as { port: number }).port);
  } finally {
    await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  }
}

function comm(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** The process runs (not a zombie) and is `name` (so a recycled PID is never taken for ours). */
function alive(pid: number, name: string): boolean {
  if (comm(pid) !== name) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

/** pid → parent pid for every process now. */
function processTable(): Map<number, number> {
  const table = new Map<number, number>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // pid (comm) state ppid …: comm may hold spaces and parentheses, so read after the last ')'.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      table.set(Number(entry), ppid);
    } catch {
      // gone meanwhile
    }
  }
  return table;
}

function cwdOf(pid: number): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/cwd`);
  } catch {
    return undefined;
  }
}

/** `pids` and every descendant of theirs. */
function withDescendants(pids: readonly number[], table: Map<number, number>): Set<number> {
  const result = new Set(pids);
  let grew = true;
  while (grew) {
    grew = false;
    for (const [pid, ppid] of table) {
      if (!result.has(pid) && result.has(ppid)) {
        result.add(pid);
        grew = true;
      }
    }
  }
  return result;
}

function parseRecord(line: string): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const token of line.trim().split(/\s+/)) {
    const at = token.indexOf('=');
    if (at > 0) fields[token.slice(0, at)] = token.slice(at + 1);
  }
  return fields;
}

function parseJob(line: string): SlurmJob {
  const fields = parseRecord(line);
  const job: SlurmJob = {
    jobId: fields.JobId ?? '',
    state: fields.JobState ?? '',
    reason: fields.Reason ?? '',
    restarts: Number(fields.Restarts ?? 0),
    nodeList: /\bNodeList=(\S+(?: assigned)?)/.exec(line)?.[1] ?? '',
    exitCode: fields.ExitCode ?? '',
    fields,
  };
  if (fields.ArrayJobId) job.arrayJobId = fields.ArrayJobId;
  if (fields.ArrayTaskId) job.arrayTaskId = fields.ArrayTaskId;
  if (fields.BatchHost) job.batchHost = fields.BatchHost;
  return job;
}

/**
 * Starts a real Slurm cluster on this host for tests: munged with a fresh key, slurmctld and N
 * slurmd daemons (nodes n1..nN, one partition `ci`), all on loopback with free ports, in a temp
 * dir of their own. No systemd and no cgroups: proctrack/linuxproc, task/none. Needs root and
 * Debian's slurm-wlm and munge (see `slurmMissing()`).
 *
 * @example
 * const slurm = await startTestSlurm({ nodes: 4 });
 * const job = await slurm.sbatch(['--array=0-7', '-N1', '--wrap', 'hostname']);
 * await slurm.waitFor('array done', async () => (await slurm.jobs(job)).every((t) => t.state === 'COMPLETED'));
 * await slurm.close();
 */
export async function startTestSlurm(options: TestSlurmOptions = {}): Promise<TestSlurm> {
  const missing = slurmMissing();
  if (missing) throw new Error(`cannot start a test Slurm cluster: ${missing}`);
  const nodeCount = options.nodes ?? 4;
  const cpus = options.cpusPerNode ?? 2;
  const slurmdTimeoutS = options.slurmdTimeoutS ?? 10;
  const credExpireS = options.credExpireS ?? 10;
  const partition = 'ci';
  const nodes = Array.from({ length: nodeCount }, (_, i) => `n${i + 1}`);
  const bin = (name: string) => findCommand(name) as string;

  const t0 = Date.now();
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-slurm-'));
  const [etc, run, logDir, state, spool, mungeDir, jobsDir] = ['etc', 'run', 'log', 'state', 'spool', 'munge', 'jobs'].map((d) => join(dir, d)) as [string, string, string, string, string, string, string];
  const conf = join(etc, 'slurm.conf');
  const socket = join(mungeDir, 'munge.sock');
  const env: Record<string, string> = {};
  for (const [key, value] of Object.entries(process.env)) {
    // Nothing of a surrounding Slurm job (or the user's sbatch/srun defaults) leaks into this cluster's clients.
    if (value !== undefined && !/^(SLURM|SBATCH|SALLOC|SRUN)_/.test(key)) env[key] = value;
  }
  env.SLURM_CONF = conf;

  const daemons = new Map<string, { pid: number; name: string; child: ChildProcess }>();
  let closed = false;
  // A test process that ends without close() still takes its daemons along.
  const killOnExit = () => {
    for (const d of daemons.values()) if (alive(d.pid, d.name)) d.child.kill('SIGKILL');
  };
  process.on('exit', killOnExit);

  const spawnDaemon = (key: string, name: string, args: string[]) => {
    const out = openSync(join(logDir, `${key}.stderr`), 'a');
    try {
      const child = spawn(bin(name), args, { cwd: run, env, stdio: ['ignore', out, out] });
      child.on('error', () => {});
      if (child.pid === undefined) throw new Error(`${name} did not start`);
      daemons.set(key, { pid: child.pid, name, child });
      return child;
    } finally {
      closeSync(out);
    }
  };

  const clientRun: TestSlurm['run'] = async (command, args, runOptions = {}) => {
    try {
      const { stdout, stderr } = await exec(bin(command), [...args], {
        cwd: runOptions.cwd ?? jobsDir,
        env: { ...env, ...runOptions.env },
        maxBuffer: 16 * 1024 * 1024,
      });
      return { stdout, stderr };
    } catch (error) {
      const { stderr = '', stdout = '' } = error as { stderr?: string; stdout?: string };
      throw new Error(`${command} ${args.join(' ')} failed: ${(stderr || stdout).trim() || String(error)} (logs in ${logDir})`, { cause: error });
    }
  };

  const waitFor: TestSlurm['waitFor'] = async (what, check, waitOptions = {}) => {
    const timeoutMs = waitOptions.timeoutMs ?? 60_000;
    const deadline = Date.now() + timeoutMs;
    let lastError: unknown;
    for (;;) {
      try {
        const value = await check();
        if (value !== undefined && value !== false) return value;
      } catch (error) {
        lastError = error;
      }
      if (Date.now() > deadline) {
        throw new Error(`slurm: gave up after ${timeoutMs} ms waiting for ${what}${lastError ? ` (last error: ${String(lastError)})` : ''}`, { cause: lastError });
      }
      await sleep(waitOptions.intervalMs ?? 250);
    }
  };

  const nodeState: TestSlurm['nodeState'] = async (node) => {
    const { stdout } = await clientRun('scontrol', ['-o', 'show', 'node', node]);
    const fields = parseRecord(stdout);
    const raw = fields.State ?? '';
    const [base = '', ...flags] = raw.split('+');
    const result: SlurmNodeState = { state: raw, base: base.replace(/\*$/, ''), flags };
    const reason = /\bReason=(.*?)(?: \[[^\]]*\])?\s*(?:Comment=|$)/.exec(stdout.trim())?.[1];
    if (reason) result.reason = reason;
    return result;
  };

  const startSlurmd = (node: string) => spawnDaemon(`slurmd-${node}`, 'slurmd', ['-D', '-f', conf, '-N', node]);

  const responding = async (node: string) => {
    const s = await nodeState(node);
    return !s.flags.includes('NOT_RESPONDING') && s.base !== 'UNKNOWN' && !(s.base === 'DOWN' && s.reason?.startsWith('Not responding'));
  };

  const stop = async (keys: string[], graceMs = 10_000) => {
    const targets = keys.flatMap((key) => {
      const d = daemons.get(key);
      daemons.delete(key);
      return d && alive(d.pid, d.name) ? [d] : [];
    });
    for (const d of targets) d.child.kill('SIGTERM');
    const deadline = Date.now() + graceMs;
    while (targets.some((d) => alive(d.pid, d.name)) && Date.now() < deadline) await sleep(100);
    for (const d of targets) if (alive(d.pid, d.name)) d.child.kill('SIGKILL');
    while (targets.some((d) => d.child.exitCode === null && d.child.signalCode === null && alive(d.pid, d.name))) await sleep(50);
  };

  /** Processes of this cluster's jobs: slurmstepd trees and anything whose cwd is in `dir`. */
  const jobProcesses = () => {
    const table = processTable();
    const own = new Set<number>([process.pid, ...[...daemons.values()].map((d) => d.pid)]);
    const controller = daemons.get('slurmctld');
    // slurmctld's own helper (slurmscriptd) is stopped with it, not here.
    for (const [pid, ppid] of table) if (ppid === controller?.pid) own.add(pid);
    const roots: number[] = [];
    for (const pid of table.keys()) {
      if (own.has(pid)) continue;
      const cwd = cwdOf(pid);
      if (cwd !== undefined && (cwd === dir || cwd.startsWith(`${dir}/`))) roots.push(pid);
    }
    const all = withDescendants(roots, table);
    for (const pid of own) all.delete(pid);
    return all;
  };

  const close = async () => {
    if (closed) return;
    closed = true;
    const ctld = daemons.get('slurmctld');
    if (ctld && alive(ctld.pid, 'slurmctld')) {
      try {
        const { stdout } = await clientRun('squeue', ['-h', '-o', '%A']);
        const ids = [...new Set(stdout.split('\n').map((s) => s.trim()).filter(Boolean))];
        if (ids.length > 0) await clientRun('scancel', ['--quiet', '--full', ...ids]).catch(() => {});
        // Let slurmstepd end the tasks cleanly where a slurmd still runs; what a dead slurmd left
        // behind never ends by itself and is killed below.
        const live = nodes.filter((n) => {
          const d = daemons.get(`slurmd-${n}`);
          return d !== undefined && alive(d.pid, 'slurmd');
        });
        if (live.length > 0) {
          await waitFor('jobs to end', async () => (await clientRun('squeue', ['-h', '-o', '%A', '-w', live.join(',')])).stdout.trim() === '', { timeoutMs: 20_000 }).catch(() => {});
        }
      } catch {
        // the controller is unusable: kill what is left below
      }
    }
    for (let round = 0; round < 20; round++) {
      const left = jobProcesses();
      if (left.size === 0) break;
      for (const pid of left) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await sleep(100);
    }
    await stop(nodes.map((n) => `slurmd-${n}`));
    // slurmctld saves its state at once on SIGTERM, then can hang ~10 s in shutdown; the state is
    // thrown away with the dir, so it gets little grace.
    const controller = daemons.get('slurmctld');
    const scriptd = controller ? [...processTable()].filter(([pid, ppid]) => ppid === controller.pid && alive(pid, 'slurmscriptd')).map(([pid]) => pid) : [];
    await stop(['slurmctld'], 2_000);
    // slurmctld's helper for prolog/epilog scripts: it exits once its parent is gone.
    await waitFor('slurmscriptd to exit', () => scriptd.every((pid) => !alive(pid, 'slurmscriptd')), { timeoutMs: 5_000 }).catch(() => {
      for (const pid of scriptd) if (alive(pid, 'slurmscriptd')) process.kill(pid, 'SIGKILL');
    });
    await stop(['munged']);
    process.off('exit', killOnExit);
    await rm(dir, { recursive: true, force: true });
  };

  try {
    await Promise.all([etc, run, logDir, state, spool, jobsDir].map((d) => mkdir(d, { recursive: true })));
    await mkdir(mungeDir, { mode: 0o700 });
    await writeFile(join(etc, 'plugstack.conf'), '');
    const [ctlPort, ...nodePorts] = await freePorts(nodeCount + 1);
    const host = hostname().split('.')[0] ?? 'localhost';
    const lines = [
      `ClusterName=rs${randomBytes(3).toString('hex')}`,
      `SlurmctldHost=${host}(127.0.0.1)`,
      `SlurmctldPort=${ctlPort}`,
      'AuthType=auth/munge',
      'CredType=cred/munge',
      // cred_expire also holds a requeued job back that long before it may start again.
      `AuthInfo=socket=${socket},cred_expire=${credExpireS}`,
      'SlurmUser=root',
      'SlurmdUser=root',
      `StateSaveLocation=${state}`,
      `SlurmdSpoolDir=${spool}/%n`,
      `SlurmctldPidFile=${run}/slurmctld.pid`,
      `SlurmdPidFile=${run}/slurmd-%n.pid`,
      `SlurmctldLogFile=${logDir}/slurmctld.log`,
      `SlurmdLogFile=${logDir}/slurmd-%n.log`,
      `PlugStackConfig=${etc}/plugstack.conf`,
      // No systemd, no cgroup delegation: processes tracked by parentage, no task binding.
      'ProctrackType=proctrack/linuxproc',
      'TaskPlugin=task/none',
      'JobAcctGatherType=jobacct_gather/none',
      'AccountingStorageType=accounting_storage/none',
      'JobCompType=jobcomp/none',
      'SwitchType=switch/none',
      'MpiDefault=none',
      'SelectType=select/cons_tres',
      'SelectTypeParameters=CR_CPU',
      'SchedulerType=sched/backfill',
      'SchedulerParameters=bf_interval=1',
      // Every node declares its own CPUs although they all share the host's.
      'SlurmdParameters=config_overrides',
      // 1: a node set DOWN by hand stays DOWN until RESUME; one that merely stopped responding returns.
      'ReturnToService=1',
      `SlurmdTimeout=${slurmdTimeoutS}`,
      'SlurmctldTimeout=10',
      'MessageTimeout=5',
      'KillWait=3',
      'InactiveLimit=0',
      // Finished jobs stay visible to scontrol for 5 minutes (there is no accounting database).
      'MinJobAge=300',
      'JobRequeue=1',
      ...(options.extraConfig ?? []),
      ...nodes.map((n, i) => `NodeName=${n} NodeHostname=${host} NodeAddr=127.0.0.1 Port=${nodePorts[i]} CPUs=${cpus} RealMemory=1024 State=UNKNOWN`),
      `PartitionName=${partition} Nodes=${nodes.join(',')} Default=YES MaxTime=INFINITE State=UP`,
    ];
    await writeFile(conf, `${lines.join('\n')}\n`);

    const key = join(mungeDir, 'munge.key');
    await writeFile(key, randomBytes(1024), { mode: 0o400 });
    await chmod(key, 0o400);
    spawnDaemon('munged', 'munged', ['--foreground', '--force', `--socket=${socket}`, `--key-file=${key}`, `--pid-file=${run}/munged.pid`, `--log-file=${logDir}/munged.log`, `--seed-file=${mungeDir}/munged.seed`]);
    await waitFor('munged to answer', async () => {
      const { stdout } = await exec(bin('munge'), ['-n', '-S', socket]);
      await new Promise<void>((resolve, reject) => {
        const child = execFile(bin('unmunge'), ['-S', socket], (error) => (error ? reject(error) : resolve()));
        child.stdin?.end(stdout);
      });
      return true;
    }, { timeoutMs: 20_000 });

    spawnDaemon('slurmctld', 'slurmctld', ['-D', '-c', '-f', conf]);
    await waitFor('slurmctld to answer `scontrol ping`', async () => /UP/.test((await clientRun('scontrol', ['ping'])).stdout), { timeoutMs: 30_000 });
    for (const node of nodes) startSlurmd(node);
    await waitFor(`${nodeCount} nodes to be IDLE`, async () => {
      const states = await Promise.all(nodes.map((n) => nodeState(n)));
      return states.every((s) => s.state === 'IDLE');
    }, { timeoutMs: 90_000 });
  } catch (error) {
    const log = (() => {
      try {
        return readFileSync(join(logDir, 'slurmctld.log'), 'utf8').slice(-2_000);
      } catch {
        return '';
      }
    })();
    await close();
    throw new Error(`${error instanceof Error ? error.message : String(error)}${log ? `\nslurmctld.log:\n${log}` : ''}`, { cause: error });
  }

  return {
    dir,
    jobsDir,
    logDir,
    nodes,
    partition,
    env,
    slurmdTimeoutS,
    credExpireS,
    startupMs: Date.now() - t0,
    run: clientRun,
    async sbatch(args, sbatchOptions = {}) {
      const { stdout } = await clientRun('sbatch', ['--parsable', ...args], sbatchOptions.env ? { env: sbatchOptions.env } : {});
      const id = stdout.trim().split(';')[0];
      if (!id || !/^\d+$/.test(id)) throw new Error(`sbatch printed no job id: ${stdout}`);
      return id;
    },
    async jobs(jobId) {
      try {
        const { stdout } = await clientRun('scontrol', ['-o', 'show', 'job', ...(jobId ? [jobId] : [])]);
        return stdout.split('\n').filter((line) => line.includes('JobId=')).map(parseJob);
      } catch (error) {
        if (/Invalid job id|No jobs in the system/i.test(String(error))) return [];
        throw error;
      }
    },
    async cancel(jobId) {
      await clientRun('scancel', ['--full', jobId]);
    },
    nodeState,
    async setNodeState(node, newState, reason) {
      const args = ['update', `NodeName=${node}`, `State=${newState}`];
      if (reason !== undefined || newState === 'DOWN' || newState === 'DRAIN') args.push(`Reason=${reason ?? 'test'}`);
      await clientRun('scontrol', args);
    },
    async killSlurmd(node) {
      const d = daemons.get(`slurmd-${node}`);
      if (!d || !alive(d.pid, 'slurmd')) throw new Error(`slurm: no slurmd running for ${node}`);
      d.child.kill('SIGKILL');
      await waitFor(`the slurmd of ${node} to die`, () => !alive(d.pid, 'slurmd'), { timeoutMs: 10_000, intervalMs: 20 });
    },
    async restartSlurmd(node) {
      const d = daemons.get(`slurmd-${node}`);
      if (d && alive(d.pid, 'slurmd')) throw new Error(`slurm: slurmd for ${node} is still running (pid ${d.pid})`);
      if (d) await waitFor(`the old slurmd of ${node} to be reaped`, () => d.child.exitCode !== null || d.child.signalCode !== null, { timeoutMs: 10_000 });
      startSlurmd(node);
      await waitFor(`${node} to respond again`, () => responding(node), { timeoutMs: 60_000 });
    },
    daemonPids() {
      return [...daemons.values()].filter((d) => alive(d.pid, d.name)).map((d) => d.pid);
    },
    waitFor,
    close,
  };
}
