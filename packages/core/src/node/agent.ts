import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino, type Logger } from 'pino';
import { RolloutError } from '../errors.ts';
import { MAX_NODE_ROLLOUTS, type NodeClaim, type NodeCommit, type NodeCommitStatus, type NodeLease, type NodeRegistered, type NodeRegistration } from '../protocol/nodes.ts';
import { goneSlurmJobs, slurmJobOf } from '../slurm/watch.ts';
import { RolloutRunner, type StageName } from '../runner/runner.ts';
import type { RolloutResult } from '../protocol/rollout.ts';
import type { SandboxProvider } from '../sandbox/types.ts';
import type { Environment } from '../spec/environment.ts';
import { isRetryable, NodeClient, withRetry } from './client.ts';
import { RemoteModelProvider } from './remote-models.ts';

export interface RolloutNodeOptions {
  /** The central service, `http://host:8100`. */
  serviceUrl: string;
  /** Its bearer token. */
  token?: string;
  /** @default `${host}-${SLURM_JOB_ID or pid}-${random}` */
  nodeId?: string;
  /** The environments this node runs (the service refuses a node that lacks one of its own). */
  environments: ReadonlyArray<Environment<any, any, any>>;
  environmentConfigs?: Record<string, Record<string, unknown>>;
  /** Worker slots per stage. @default the runner's: { init: 64, run: 512, eval: 32 } */
  pools?: Partial<Record<StageName, number>>;
  /** Rollouts held at most at once (claimed, running or waiting to be committed). @default pools.init + pools.run */
  maxRollouts?: number;
  /** The host name the node registers with. @default os.hostname() */
  host?: string;
  /** @default slurmFromEnv(process.env) */
  slurm?: NodeRegistration['slurm'];
  version?: string;
  /** How long a claim waits for work (the service's long poll). @default 5_000 */
  claimWaitMs?: number;
  /**
   * A node the service has not answered for this long (unreachable, or only 5xx answers) is an
   * orphan: it kills its sandboxes and ends (see `ended`), instead of retrying for ever after its
   * service or Slurm job is gone. Counts from the start, so a first registration is bounded too.
   * @default 300_000
   */
  serviceLostMs?: number;
  /**
   * Asks Slurm (squeue) every `everyMs` whether the node's own job (SLURM_JOB_ID, or its array
   * task) is gone (cancelled, requeued, ended): then the node is an orphan and ends. Only when the
   * node runs as a Slurm task and squeue exists; nothing is concluded while squeue cannot answer.
   * @default { everyMs: 30_000 }
   */
  slurmCheck?: false | { everyMs?: number; squeue?: string; env?: NodeJS.ProcessEnv };
  sandboxProvider?: SandboxProvider;
  logger?: Logger;
  /** What the node does, as it happens (the CLI's line on registration, tests). */
  onEvent?: (event: NodeEvent) => void;
}

export type NodeEvent =
  | { type: 'registered'; nodeId: string; timings: NodeTimings; again: boolean }
  | { type: 'claimed'; rolloutId: string; attempt: number }
  | { type: 'committed'; rolloutId: string; attempt: number; status: NodeCommitStatus; state: RolloutResult['state'] }
  /** A lease the node stopped: the service said so, or the node could not reach it for longer than the node timeout. */
  | { type: 'lost'; rolloutId: string; attempt: number; reason: 'service' | 'timeout' }
  /** The run of a lost lease has ended here (its sandbox is gone); nothing of it is committed. */
  | { type: 'dropped'; rolloutId: string; attempt: number }
  | { type: 'cancel'; rolloutId: string }
  | { type: 'left'; released: number }
  /**
   * The service refused to take the node back (its Slurm job reported gone, an environment it
   * lacks now, a token that no longer fits): the node leaves, as on SIGTERM (see `ended`).
   */
  | { type: 'refused'; code: string; message: string }
  /**
   * The node ends by itself: the service did not answer for `serviceLostMs`, or its Slurm job is
   * gone. Its sandboxes are killed; it does not try to reach the service again (see `ended`).
   */
  | { type: 'orphaned'; reason: string };

/** Slurm's ids of the task the node runs as (`registration.slurm`); undefined outside Slurm. */
export function slurmFromEnv(env: NodeJS.ProcessEnv = process.env): NodeRegistration['slurm'] {
  const names = {
    job_id: 'SLURM_JOB_ID',
    array_job_id: 'SLURM_ARRAY_JOB_ID',
    array_task_id: 'SLURM_ARRAY_TASK_ID',
    step_id: 'SLURM_STEP_ID',
    node_name: 'SLURMD_NODENAME',
    proc_id: 'SLURM_PROCID',
    restart_count: 'SLURM_RESTART_COUNT',
  } as const;
  const slurm: NonNullable<NodeRegistration['slurm']> = {};
  for (const [key, name] of Object.entries(names) as Array<[keyof typeof names, string]>) if (env[name]) slurm[key] = env[name];
  return Object.keys(slurm).length > 0 ? slurm : undefined;
}

/** `${host}-${SLURM_JOB_ID or pid}-${random}`, in the characters a node id allows. */
export function defaultNodeId(host = hostname(), env: NodeJS.ProcessEnv = process.env): string {
  const id = `${host}-${env.SLURM_JOB_ID ?? process.pid}-${randomBytes(3).toString('hex')}`.replace(/[^A-Za-z0-9._:-]/g, '-').replace(/^[^A-Za-z0-9]+/, '');
  return id.slice(-128);
}

/** A lease the node holds, from its claim until its commit is answered (or it is lost). */
interface Held {
  claim: NodeClaim;
  lost: boolean;
  /** Set when the rollout has finished: waiting to be committed. */
  result?: RolloutResult;
  /** Its run here, until the runner lets go of it. */
  done?: Promise<unknown>;
}

const DEFAULT_TIMINGS = { lease_ms: 30_000, heartbeat_ms: 2_000, node_timeout_ms: 10_000 };

/** What a registration answered but the credential (which stays in the client). */
export type NodeTimings = Omit<NodeRegistered, 'credential'>;

/**
 * A rollout node (`rollserve node`): runs the INIT/RUN/EVAL pools and sandboxes of this machine
 * for a central service. It registers, pulls work while it has free slots (each rollout under a
 * lease), heartbeats the leases it holds, runs each rollout's whole session here, and commits the
 * results. A lease it loses (the service says so, or it could not reach the service for longer
 * than the node timeout, after which the service has given the work to another node) is aborted
 * here, sandbox and all, and never committed.
 */
export class RolloutNode {
  readonly nodeId: string;
  readonly runner: RolloutRunner;
  readonly logger: Logger;
  readonly #client: NodeClient;
  readonly #options: RolloutNodeOptions;
  readonly #registration: NodeRegistration;
  readonly #held = new Map<string, Held>();
  /** Rollouts aborted here whose runner has not let go yet (a re-issued claim of one waits for it). */
  readonly #draining = new Map<string, Promise<unknown>>();
  /** Finished rollouts waiting for a commit. */
  #pending: Held[] = [];
  /** Results go to the service whole, not with each token id once (it refused that form). */
  #wholeCommits = false;
  #committing: Promise<void> | undefined;
  #timings: NodeTimings;
  #registering: Promise<void> | undefined;
  #registeredOnce = false;
  /** When the service last answered a heartbeat or a registration (performance.now()). */
  #lastContact = performance.now();
  readonly #stop = new AbortController();
  #slotFreed: (() => void) | undefined;
  #loops: Promise<unknown>[] = [];
  #closing: Promise<void> | undefined;
  #refused: RolloutError | undefined;
  /** Why the node ended by itself (see the 'orphaned' event). */
  #orphaned: string | undefined;
  #watchdog: NodeJS.Timeout | undefined;
  #slurmTimer: NodeJS.Timeout | undefined;
  #slurmAsking = false;

  private constructor(options: RolloutNodeOptions) {
    this.#options = options;
    this.logger = options.logger ?? pino({ name: 'rollserve-node', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'info' });
    this.nodeId = options.nodeId ?? defaultNodeId(options.host);
    this.#client = new NodeClient({ serviceUrl: options.serviceUrl, ...(options.token ? { token: options.token } : {}) });
    const models = new RemoteModelProvider({
      client: this.#client,
      nodeId: this.nodeId,
      attemptOf: (id) => {
        const held = this.#held.get(id);
        return held && !held.lost ? held.claim.attempt : undefined;
      },
      reregister: () => this.#reregister(),
      leaseLost: (id) => {
        const held = this.#held.get(id);
        if (held) this.#lose(held, 'service');
      },
    });
    this.runner = new RolloutRunner({
      environments: options.environments,
      models,
      logger: this.logger,
      ...(options.environmentConfigs ? { environmentConfigs: options.environmentConfigs } : {}),
      ...(options.pools ? { pools: options.pools } : {}),
      ...(options.sandboxProvider ? { sandboxProvider: options.sandboxProvider } : {}),
    });
    const capacity = this.runner.capacity;
    const slurm = options.slurm ?? slurmFromEnv();
    this.#registration = {
      node_id: this.nodeId,
      host: options.host ?? hostname(),
      pid: process.pid,
      capacity,
      max_rollouts: options.maxRollouts ?? Math.min(MAX_NODE_ROLLOUTS, capacity.init + capacity.run),
      environments: this.runner.environments,
      ...(slurm ? { slurm } : {}),
      ...(options.version ? { version: options.version } : {}),
    };
    this.#timings = { node_id: this.nodeId, ...DEFAULT_TIMINGS };
  }

  /**
   * Starts a node: resolves once it is registered (retrying while the service cannot be reached);
   * a refusal (a missing environment, a wrong token) rejects.
   */
  static async start(options: RolloutNodeOptions): Promise<RolloutNode> {
    const node = new RolloutNode(options);
    node.#watchdog = setInterval(() => node.#checkContact(), 250);
    node.#watchSlurm();
    try {
      await node.#reregister();
    } catch (error) {
      if (node.#orphaned !== undefined) {
        await node.#closing;
        throw new RolloutError({ code: 'UNAVAILABLE', message: node.#orphaned, cause: error });
      }
      node.#stopWatching();
      await node.runner.close();
      await node.#client.close();
      throw error;
    }
    node.#loops = [node.#claimLoop(), node.#heartbeatLoop()].map((loop) =>
      loop.catch((error: unknown) => node.logger.error({ err: error }, 'node loop failed')),
    );
    return node;
  }

  /**
   * Resolves once the node has left: after close(), or by itself when the service refused to take
   * it back (then with that refusal).
   */
  async ended(): Promise<{ refused?: RolloutError; orphaned?: string }> {
    await new Promise<void>((resolve) => {
      if (this.#closing) resolve();
      else this.#stop.signal.addEventListener('abort', () => resolve(), { once: true });
    });
    await this.#closing;
    return { ...(this.#refused ? { refused: this.#refused } : {}), ...(this.#orphaned !== undefined ? { orphaned: this.#orphaned } : {}) };
  }

  get registration(): NodeRegistration {
    return this.#registration;
  }

  get timings(): NodeTimings {
    return this.#timings;
  }

  /** The node ends by itself: its service or its Slurm job is gone. Sandboxes are killed; the service is not called again. */
  #orphan(reason: string): void {
    if (this.#orphaned !== undefined || this.#closing) return;
    this.#orphaned = reason;
    this.logger.error({ service: this.#client.serviceUrl }, `${reason}: ending this node (its sandboxes killed)`);
    this.#emit({ type: 'orphaned', reason });
    void this.#close(false);
  }

  #stopWatching(): void {
    clearInterval(this.#watchdog);
    clearInterval(this.#slurmTimer);
  }

  /** Asks Slurm now and then whether this node's own job is gone (see `slurmCheck`). */
  #watchSlurm(): void {
    const check = this.#options.slurmCheck;
    const job = slurmJobOf(this.#registration);
    if (check === false || job === undefined) return;
    const ask = async () => {
      if (this.#slurmAsking || this.#closing) return;
      this.#slurmAsking = true;
      try {
        const gone = await goneSlurmJobs([{ id: job, node: this.#registration.slurm?.node_name }], { ...(check?.squeue ? { squeue: check.squeue } : {}), ...(check?.env ? { env: check.env } : {}) });
        if (gone.length > 0) this.#orphan(`Slurm job ${job} of this node is gone (squeue)`);
      } catch (error) {
        if ((error as { code?: unknown }).code === 'ENOENT') clearInterval(this.#slurmTimer); // no Slurm client here
        else this.logger.debug({ err: error }, 'asking Slurm about this node\'s job failed; nothing concluded');
      } finally {
        this.#slurmAsking = false;
      }
    };
    this.#slurmTimer = setInterval(() => void ask(), check?.everyMs ?? 30_000);
    this.#slurmTimer.unref();
  }

  /** Leases held now (running or waiting to be committed). */
  get held(): number {
    return this.#held.size;
  }

  #emit(event: NodeEvent): void {
    try {
      this.#options.onEvent?.(event);
    } catch (error) {
      this.logger.error({ err: error }, 'node event listener failed');
    }
  }

  /**
   * Registers (again, under the same id); one registration at a time. `leaveFirst`: deregister
   * before (the service then releases at once whatever it still counts as this node's).
   */
  #reregister(leaveFirst = false): Promise<void> {
    this.#registering ??= (async () => {
      try {
        if (leaveFirst) await this.#client.deregister(this.nodeId).catch(() => undefined);
        let tries = 0;
        const register = () =>
          this.#client.register(this.#registration, this.#stop.signal).catch((error: unknown) => {
            if (tries++ === 0 && isRetryable(error)) this.logger.warn({ err: error, service: this.#client.serviceUrl }, 'cannot register with the service yet; trying again');
            throw error;
          });
        const timings = await withRetry(register, { signal: this.#stop.signal, maxMs: 5_000 }).catch((error: unknown) => {
          // taken back no more: trying again would only spin; the node ends (start() reports a first refusal itself)
          if (this.#registeredOnce && !isRetryable(error) && !this.#stop.signal.aborted) {
            const refusal = RolloutError.from(error);
            this.logger.error({ err: error }, 'the service refused to take this node back: leaving');
            this.#emit({ type: 'refused', code: refusal.code, message: refusal.message });
            this.#refused = refusal;
            void this.close();
          }
          throw error;
        });
        const { credential: _credential, ...kept } = timings; // the credential stays in the client
        this.#timings = kept;
        this.#lastContact = performance.now();
        this.#emit({ type: 'registered', nodeId: this.nodeId, timings, again: this.#registeredOnce });
        this.#registeredOnce = true;
      } finally {
        this.#registering = undefined;
      }
    })();
    return this.#registering;
  }

  #freeSlot(): void {
    const wake = this.#slotFreed;
    this.#slotFreed = undefined;
    wake?.();
  }

  #leases(): NodeLease[] {
    return [...this.#held.values()].map(({ claim, result }) => ({
      rollout_id: claim.rollout_id,
      attempt: claim.attempt,
      stage: result ? 'eval' : (this.runner.running(claim.rollout_id)?.stage ?? 'queued'),
    }));
  }

  async #claimLoop(): Promise<void> {
    const signal = this.#stop.signal;
    let failures = 0;
    while (!signal.aborted) {
      const free = this.#registration.max_rollouts - this.#held.size;
      if (free <= 0) {
        await new Promise<void>((resolve) => {
          const done = () => {
            signal.removeEventListener('abort', done);
            resolve();
          };
          this.#slotFreed = done;
          signal.addEventListener('abort', done, { once: true });
        });
        continue;
      }
      try {
        if (this.#registering) await this.#registering;
        const claims = await this.#client.claim(this.nodeId, free, this.#options.claimWaitMs ?? 5_000, signal);
        failures = 0;
        for (const claim of claims) this.#start(claim);
      } catch (error) {
        if (signal.aborted) break;
        if (mustRegisterAgain(error)) {
          await this.#reregister().catch(() => undefined);
          continue;
        }
        if (!isRetryable(error)) this.logger.error({ err: error }, 'claim refused');
        else this.logger.debug({ err: error }, 'claim failed');
        const wait = Math.min(5_000, 100 * 2 ** Math.min(failures++, 10));
        await sleep(wait, undefined, { signal }).catch(() => undefined);
      }
    }
  }

  #start(claim: NodeClaim): void {
    const id = claim.rollout_id;
    const previous = this.#held.get(id);
    if (previous) this.#lose(previous, 'service'); // re-issued to this node: the old attempt is over
    const held: Held = { claim, lost: false };
    this.#held.set(id, held);
    this.#emit({ type: 'claimed', rolloutId: id, attempt: claim.attempt });
    const draining = this.#draining.get(id);
    const run = async () => {
      await draining;
      if (held.lost) return;
      const result = await this.runner.run({ id, taskId: claim.task_id, sampleIndex: claim.sample_index, attempt: claim.attempt, task: claim.task });
      if (held.lost || this.#held.get(id) !== held) {
        this.#emit({ type: 'dropped', rolloutId: id, attempt: claim.attempt });
        return;
      }
      held.result = result;
      this.#pending.push(held);
      this.#flush();
    };
    held.done = run().catch((error: unknown) => {
      // the runner refused the job (it is closing): the lease is left for the service to re-issue
      this.logger.warn({ err: error, rollout: id }, 'rollout not run');
      if (this.#held.get(id) === held) this.#held.delete(id);
      this.#freeSlot();
    });
  }

  /** Stops a lease: its rollout is aborted (sandbox killed), and its result never committed. */
  #lose(held: Held, reason: 'service' | 'timeout'): void {
    if (held.lost) return;
    held.lost = true;
    const id = held.claim.rollout_id;
    if (this.#held.get(id) === held) this.#held.delete(id);
    this.#pending = this.#pending.filter((p) => p !== held);
    if (!held.result && held.done) {
      const done = held.done;
      this.#draining.set(id, done);
      void done.then(() => {
        if (this.#draining.get(id) === done) this.#draining.delete(id);
      });
      if (this.runner.running(id)?.attempt === held.claim.attempt) {
        this.runner.abort(id, reason === 'timeout' ? 'the node lost contact with the service: its lease was given to another node' : 'the lease was lost');
      }
    }
    this.#emit({ type: 'lost', rolloutId: id, attempt: held.claim.attempt, reason });
    this.#freeSlot();
  }

  /** Commits what has finished, in batches, until each is answered or its lease is lost. */
  #flush(): void {
    if (this.#committing) return;
    this.#committing = (async () => {
      let failures = 0;
      // set when the service refused a batch sent with each token id once: it goes again whole
      let wholeAgain = false;
      await new Promise((resolve) => setImmediate(resolve)); // what finished together goes together
      // the service caps a request's body (--max-body-mib, 4 times that for results): a batch it
      // refuses as too large goes again in halves
      let batchSize = 256;
      while (this.#pending.length > 0 && !this.#stop.signal.aborted) {
        const batch = this.#pending.slice(0, batchSize);
        const commits: NodeCommit[] = batch.map((held) => ({ rollout_id: held.claim.rollout_id, attempt: held.claim.attempt, result: held.result! }));
        const whole = this.#wholeCommits || wholeAgain;
        try {
          const statuses = await this.#client.commit(this.nodeId, commits, { whole });
          if (whole && !this.#wholeCommits) {
            // a service from before that form (an older rollserve): whole from now on
            this.#wholeCommits = true;
            this.logger.warn({ service: this.#client.serviceUrl }, 'the service does not read results with their token ids sent once (an older rollserve?): sending them whole');
          }
          wholeAgain = false;
          failures = 0;
          batch.forEach((held, i) => this.#committed(held, statuses[i] ?? 'not_found'));
        } catch (error) {
          if (mustRegisterAgain(error)) {
            await this.#reregister().catch(() => undefined);
            continue;
          }
          if (RolloutError.isInstance(error) && error.code === 'UNPROCESSABLE' && !whole) {
            wholeAgain = true;
            continue;
          }
          if (RolloutError.isInstance(error) && error.code === 'PAYLOAD_TOO_LARGE' && batch.length > 1) {
            batchSize = Math.ceil(batch.length / 2);
            continue;
          }
          if (!isRetryable(error)) {
            wholeAgain = false;
            // a commit the service refuses as malformed will not get better: drop it (its lease expires)
            this.logger.error({ err: error, rollouts: commits.map((c) => c.rollout_id) }, 'commit refused');
            for (const held of batch) this.#committed(held, 'not_found');
            continue;
          }
          this.logger.debug({ err: error }, 'commit failed; retrying');
          const wait = Math.min(5_000, 100 * 2 ** Math.min(failures++, 10));
          await sleep(wait, undefined, { signal: this.#stop.signal }).catch(() => undefined);
        }
      }
    })().finally(() => {
      this.#committing = undefined;
      if (this.#pending.length > 0 && !this.#stop.signal.aborted) this.#flush();
    });
  }

  #committed(held: Held, status: NodeCommitStatus): void {
    this.#pending = this.#pending.filter((p) => p !== held);
    const id = held.claim.rollout_id;
    if (this.#held.get(id) === held) this.#held.delete(id);
    if (!held.lost) this.#emit({ type: 'committed', rolloutId: id, attempt: held.claim.attempt, status, state: held.result!.state });
    held.lost = true; // done with
    this.#freeSlot();
  }

  /**
   * Past the node timeout without an answer, the service has declared this node lost and given its
   * work to others: everything held is aborted, and the node leaves and registers again (so that
   * whatever the service still counts as this node's is released at once).
   */
  #checkContact(): void {
    if (this.#closing) return;
    const serviceLostMs = this.#options.serviceLostMs ?? 300_000;
    const silent = performance.now() - this.#client.lastAnswer;
    if (silent > serviceLostMs) {
      this.#orphan(`the service at ${this.#client.serviceUrl} has not answered for ${Math.round(silent / 1000)} s (serviceLostMs ${serviceLostMs} ms)`);
      return;
    }
    if (!this.#registeredOnce || performance.now() - this.#lastContact <= this.#timings.node_timeout_ms) return;
    const held = [...this.#held.values()];
    if (held.length > 0) this.logger.warn({ held: held.length }, 'no answer from the service for longer than the node timeout: aborting every lease');
    for (const lease of held) this.#lose(lease, 'timeout');
    this.#lastContact = performance.now(); // (not again until another timeout has passed)
    void this.#reregister(held.length > 0).catch(() => undefined);
  }

  async #heartbeatLoop(): Promise<void> {
    const signal = this.#stop.signal;
    try {
      while (!signal.aborted) {
        await sleep(this.#timings.heartbeat_ms, undefined, { signal }).catch(() => undefined);
        if (signal.aborted) break;
        this.#checkContact();
        if (this.#registering) continue;
        const leases = this.#leases();
        const sent = performance.now();
        try {
          const answer = await this.#client.heartbeat(this.nodeId, leases, AbortSignal.any([signal, AbortSignal.timeout(this.#timings.node_timeout_ms)]));
          this.#lastContact = Math.max(this.#lastContact, sent);
          for (const id of answer.lost) {
            const held = this.#held.get(id);
            if (held) this.#lose(held, 'service');
          }
          for (const id of answer.cancel) {
            if (this.runner.abort(id, 'cancelled by a client')) this.#emit({ type: 'cancel', rolloutId: id });
          }
        } catch (error) {
          if (signal.aborted) break;
          if (mustRegisterAgain(error)) await this.#reregister().catch(() => undefined);
          else this.logger.debug({ err: error }, 'heartbeat failed');
        }
      }
    } finally {
      this.#stopWatching();
    }
  }

  /**
   * Leaves: stops claiming, aborts what runs here (sandboxes killed, nothing of it committed),
   * commits what had already finished (one try), and deregisters, so the service re-queues the
   * rest at once.
   */
  close(): Promise<void> {
    return this.#close(true);
  }

  /** `leave`: commit what has finished and deregister (not for an orphan: its service is gone). */
  #close(leave: boolean): Promise<void> {
    this.#closing ??= (async () => {
      this.#stopWatching();
      for (const held of this.#held.values()) if (!held.result) held.lost = true;
      this.#stop.abort();
      this.#freeSlot();
      await Promise.all(this.#loops);
      await this.runner.close(leave ? 'the node is leaving' : 'the node is ending: its service or Slurm job is gone');
      await this.#committing;
      if (!leave) {
        this.#held.clear();
        await this.#client.close();
        return;
      }
      const finished = this.#pending.filter((held) => !held.lost);
      if (finished.length > 0) {
        const commits = finished.map((held) => ({ rollout_id: held.claim.rollout_id, attempt: held.claim.attempt, result: held.result! }));
        await this.#client.commit(this.nodeId, commits).then(
          (statuses) => finished.forEach((held, i) => this.#committed(held, statuses[i] ?? 'not_found')),
          (error: unknown) => this.logger.warn({ err: error }, 'finished results not committed on leaving'),
        );
      }
      this.#held.clear();
      try {
        const { released } = await this.#client.deregister(this.nodeId);
        this.#emit({ type: 'left', released });
      } catch (error) {
        this.logger.warn({ err: error }, 'could not deregister (the service re-issues the work after the node timeout)');
      }
      await this.#client.close();
    })();
    return this.#closing;
  }
}

/**
 * An error after which the node registers again: the service does not know it (it restarted, or
 * forgot it), or does not take its credential (another node took its id once it was lost). The
 * registration, with the credential it has, then settles it: taken back, or refused (and it leaves).
 */
function mustRegisterAgain(error: unknown): boolean {
  return RolloutError.isInstance(error) && (error.code === 'NOT_FOUND' || error.code === 'UNAUTHORIZED');
}

/** Starts a rollout node (see RolloutNode). */
export function startRolloutNode(options: RolloutNodeOptions): Promise<RolloutNode> {
  return RolloutNode.start(options);
}
