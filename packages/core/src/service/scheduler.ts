import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { z } from 'zod';
import { RolloutError } from '../errors.ts';
import { RolloutTask, type RolloutTaskInput } from '../protocol/rollout.ts';
import type { RolloutRunner } from '../runner/runner.ts';
import type { Environment } from '../spec/environment.ts';
import type { RolloutStore } from '../store/types.ts';
import type { Commits } from './commits.ts';
import { LOCAL, unavailable } from './lifecycle.ts';
import type { NodeRegistry } from './node-registry.ts';

export interface SubmittedTask {
  taskId: string;
  rolloutIds: string[];
  /** True when the id was known: nothing new was started. */
  existing: boolean;
}

export interface SchedulerOptions {
  store: RolloutStore;
  logger: Logger;
  closed: () => boolean;
  /** The served environments by name (a row is checked against its environment at submit). */
  envs: ReadonlyMap<string, Environment<any, any, any>>;
  runner: Pick<RolloutRunner, 'run' | 'abort' | 'rowSandboxSpec'>;
  commits: Pick<Commits, 'commitOwn' | 'withinAttempts'>;
  nodes: Pick<NodeRegistry, 'anyTakesWork'>;
  /** Wakes the node claims waiting for work. */
  wakeClaims: () => void;
  /** New rollouts were stored (the service's counts). */
  added: (rollouts: number) => void;
  runLocally: 'auto' | 'always' | 'never' | undefined;
  /** Rollouts the service's own pools hold at most. */
  localLimit: number;
  leaseMs: number;
}

/**
 * Runs an environment's per-row sandbox spec at submit: what it refuses is the rollout API's 422,
 * its `details` naming the row's field (`path`, as a schema failure's).
 */
function rowSandboxCheck(spec: () => unknown, envName: string): void {
  try {
    spec();
  } catch (error) {
    // whatever the environment cannot make a sandbox of is a bad row: a 4xx, never a 500
    const failure = RolloutError.from(error);
    const items = Array.isArray(failure.details) ? (failure.details as Array<{ loc?: unknown[]; msg?: string }>) : [];
    const details = items.map((item) => ({
      code: 'custom',
      path: ['row', ...(Array.isArray(item.loc) ? item.loc.filter((_, i) => i > 0 || item.loc![0] !== 'body') : [])],
      message: (item.msg ?? failure.message).replace(/^Value error, /, ''),
    }));
    throw new RolloutError({ code: 'UNPROCESSABLE', message: `row does not fit environment "${envName}": ${failure.message}`, details: details.length > 0 ? details : undefined });
  }
}

/**
 * Where work goes: tasks are accepted into the store, and the service's own INIT/RUN/EVAL pools
 * lease queued work while no rollout node takes it (or always, or never: `runLocally`), run it
 * and keep its leases; nodes pull the rest (see Coordinator).
 */
export class Scheduler {
  readonly #store: RolloutStore;
  readonly #logger: Logger;
  readonly #closed: () => boolean;
  readonly #envs: ReadonlyMap<string, Environment<any, any, any>>;
  readonly #runner: SchedulerOptions['runner'];
  readonly #commits: SchedulerOptions['commits'];
  readonly #nodes: SchedulerOptions['nodes'];
  readonly #wakeClaims: () => void;
  readonly #added: (rollouts: number) => void;
  readonly #runLocally: SchedulerOptions['runLocally'];
  readonly #localLimit: number;
  readonly #leaseMs: number;
  /** Rollouts the service's own pools run, by id: their lease's attempt. */
  readonly #local = new Map<string, number>();
  #pumping = false;
  /** After a restart with nodes holding work, the service waits for them before running anything itself. */
  #localHoldUntil = 0;
  #pumpAgain = false;
  #submitting: Promise<unknown> = Promise.resolve();

  constructor(options: SchedulerOptions) {
    this.#store = options.store;
    this.#logger = options.logger;
    this.#closed = options.closed;
    this.#envs = options.envs;
    this.#runner = options.runner;
    this.#commits = options.commits;
    this.#nodes = options.nodes;
    this.#wakeClaims = options.wakeClaims;
    this.#added = options.added;
    this.#runLocally = options.runLocally;
    this.#localLimit = options.localLimit;
    this.#leaseMs = options.leaseMs;
  }

  /** Rollouts the service's own pools run now. */
  get running(): number {
    return this.#local.size;
  }

  /** The service runs nothing itself before `until` (epoch ms): nodes holding work come back first. */
  holdUntil(until: number): void {
    this.#localHoldUntil = until;
  }

  /** Once the batch being accepted is stored (or refused). */
  async submitted(): Promise<void> {
    await this.#submitting;
  }

  /**
   * Accepts tasks: the new ones are stored in one transaction, then answered with their rollout
   * ids; their work starts in the background. A batch is accepted whole or not at all.
   */
  async submit(inputs: readonly RolloutTaskInput[]): Promise<SubmittedTask[]> {
    if (this.#closed()) throw unavailable();
    const tasks = this.validate(inputs);
    const withIds = tasks.map((task) => (task.id ? task : { ...task, id: randomUUID() }));
    // One batch at a time, so a task id is known to the next batch once stored.
    const accepted = this.#submitting.then(async () => {
      if (this.#closed()) throw unavailable();
      // While the service runs its own work and no lease is being taken already, the batch is
      // stored and leased to its pools in one transaction (claim's order: older work first).
      const room = this.#pumping || !this.runsLocally() ? 0 : Math.min(this.#localLimit - this.#local.size, 1_000);
      const { outcomes, claimed } =
        room > 0
          ? await this.#store.putTasksAndClaim(withIds, { workerId: LOCAL, limit: room, leaseMs: this.#leaseMs })
          : { outcomes: await this.#store.putTasks(withIds), claimed: undefined };
      // an id repeated in the batch is new once, then known
      const seen = new Set<string>();
      const submitted = outcomes.map(({ taskId, rolloutIds, existing }) => {
        const repeated = seen.has(taskId);
        seen.add(taskId);
        return { taskId, rolloutIds, existing: existing || repeated };
      });
      for (const task of submitted) if (!task.existing) this.#added(task.rolloutIds.length);
      if (claimed !== undefined) {
        try {
          for (const work of await this.#commits.withinAttempts(LOCAL, claimed)) this.#runLocal(work);
        } catch (error) {
          // the batch is stored: its 202 stands; what was leased here lapses and runs again
          this.#logger.error({ err: error }, 'starting leased work failed; its leases lapse and it runs again');
        }
        // the pools took all there was: no one else need look
        if (claimed.length < room) return submitted;
      }
      if (submitted.some((task) => !task.existing)) this.workArrived();
      return submitted;
    });
    this.#submitting = accepted.catch(() => undefined);
    return accepted;
  }

  /**
   * Parses tasks and checks each against its environment (the environment is served, the row
   * fits, its sandbox can be made), as submit does: what it refuses is a 404 or 422.
   */
  validate(inputs: readonly RolloutTaskInput[]): RolloutTask[] {
    const tasks = inputs.map((input) => RolloutTask.parse(input));
    for (const task of tasks) {
      const env = this.#envs.get(task.env);
      if (!env) throw new RolloutError({ code: 'NOT_FOUND', message: `unknown environment "${task.env}" (served: ${[...this.#envs.keys()].join(', ') || 'none'})` });
      const fit = (schema: z.ZodType): object => {
        const parsed = schema.safeParse(task.row);
        if (!parsed.success) {
          throw new RolloutError({ code: 'UNPROCESSABLE', message: `row does not fit environment "${task.env}": ${z.prettifyError(parsed.error)}`, details: parsed.error.issues });
        }
        return parsed.data as object;
      };
      const fitted = fit(env.row);
      if (env.seedRow) fit(env.seedRow);
      // the row's sandbox (the host paths, images and binds it names) is checked now, not at INIT
      rowSandboxCheck(() => this.#runner.rowSandboxSpec(task.env, { ...task.row, ...fitted }), task.env);
    }
    return tasks;
  }

  /** New or re-queued work: the service's own pools and waiting node claims take it. */
  workArrived(): void {
    this.#wakeClaims();
    this.pump();
  }

  runsLocally(): boolean {
    const mode = this.#runLocally ?? 'auto';
    if (mode !== 'auto') return mode === 'always';
    const now = Date.now();
    if (now < this.#localHoldUntil) return false;
    return !this.#nodes.anyTakesWork(now);
  }

  /** Leases queued work to the service's own pools while they have room. */
  pump(): void {
    if (this.#pumping) {
      this.#pumpAgain = true;
      return;
    }
    this.#pumping = true;
    void (async () => {
      try {
        do {
          this.#pumpAgain = false;
          while (!this.#closed() && this.runsLocally()) {
            const room = this.#localLimit - this.#local.size;
            if (room <= 0) break;
            const claimed = await this.#store.claim({ workerId: LOCAL, limit: Math.min(room, 1_000), leaseMs: this.#leaseMs });
            for (const work of await this.#commits.withinAttempts(LOCAL, claimed)) this.#runLocal(work);
            if (claimed.length < room) break;
          }
        } while (this.#pumpAgain && !this.#closed());
      } catch (error) {
        if (!this.#closed()) this.#logger.error({ err: error }, 'leasing work failed; trying again at the next sweep');
      } finally {
        this.#pumping = false;
      }
    })();
  }

  #runLocal(work: { id: string; taskId: string; sampleIndex: number; attempt: number; task: RolloutTask }): void {
    if (this.#closed()) return;
    this.#local.set(work.id, work.attempt);
    void this.#runner
      .run({ id: work.id, taskId: work.taskId, sampleIndex: work.sampleIndex, attempt: work.attempt, task: work.task })
      .then(async (result) => {
        // a lease lost (or a shutdown) while it ran: someone else has, or will have, its result
        if (this.#local.get(work.id) !== work.attempt || this.#closed()) return;
        await this.#commits.commitOwn(LOCAL, work.attempt, result, work.task.n);
      })
      .catch((error: unknown) => this.#logger.error({ err: error, rollout: work.id }, 'rollout bookkeeping failed'))
      .finally(() => {
        if (this.#local.get(work.id) === work.attempt) this.#local.delete(work.id);
        this.pump();
      });
  }

  /** Keeps the leases of what the service's own pools run; a lease found lost ends its rollout here. */
  async renewLocal(): Promise<void> {
    if (this.#closed() || this.#local.size === 0) return;
    try {
      const leases = [...this.#local].map(([rolloutId, attempt]) => ({ rolloutId, attempt }));
      const { lost } = await this.#store.renewLeases(LOCAL, leases, this.#leaseMs);
      for (const id of lost) {
        this.#local.delete(id);
        this.#runner.abort(id, 'lease lost');
      }
    } catch (error) {
      this.#logger.warn({ err: error }, 'renewing leases failed');
    }
  }
}
