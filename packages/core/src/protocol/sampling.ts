import { z } from 'zod';

/**
 * Dynamic sampling (DAPO, Yu et al. 2025; verl's `algorithm.filter_groups`): a submitted batch is
 * a pool of tasks started in order until `groups` informative groups were kept. A group is
 * informative when the chosen metric is not the same for all its samples that are not filtered
 * (verl keeps `std > 0`; equality is checked exactly here, as numpy's std of equal floats can be
 * 1e-17 instead of 0), or when it is a group of one (verl keeps `len == 1` groups too).
 */
export const DynamicSampling = z
  .strictObject({
    /** Caller-chosen id (as a task's); resubmitting a known id answers that sampling's status and starts nothing. */
    id: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/, 'ids are 1-128 of [A-Za-z0-9._:-], starting alphanumeric')
      .optional(),
    /** Informative groups to deliver (verl's `train_batch_size` in prompts). */
    groups: z.number().int().positive(),
    /**
     * Groups started at most, the cap (verl caps generation batches, `max_num_gen_batches`, and
     * raises when it is reached; here the sampling ends `exhausted` with what it kept).
     * @default every task of the pool
     */
    max_groups: z.number().int().positive().optional(),
    /**
     * Groups running at once: those the target still needs plus `max_in_flight - groups` spare
     * ones, never more than `max_in_flight`. More than `groups` trades surplus work (cancelled once
     * the target is reached) for a shorter wait on the last groups. @default groups
     */
    max_in_flight: z.number().int().positive().optional(),
    /**
     * What must differ within a group: the verify reward ('reward', verl's `acc`/`score`/
     * `seq_reward`) or the first turn's return ('return': per-turn rewards, shaping included,
     * discounted; verl's `seq_final_reward`). @default 'reward'
     */
    metric: z.enum(['reward', 'return']).default('reward'),
  })
  .meta({ id: 'DynamicSampling' });
export type DynamicSampling = z.output<typeof DynamicSampling>;

/**
 * A sampling's request as resolved (defaults filled, the cap bounded by the pool): what its status
 * shows and what the store keeps of it across a restart.
 */
export interface SamplingSettings {
  groups: number;
  maxGroups: number;
  maxInFlight: number;
  metric: DynamicSampling['metric'];
}

/** What became of a group a sampling started. */
export const SampledGroupOutcome = z.enum(['running', 'kept', 'all_equal', 'filtered', 'cancelled']);
export type SampledGroupOutcome = z.infer<typeof SampledGroupOutcome>;

/** A dynamic sampling's progress and counts (`GET /v1/rollouts/sampling/{id}`, the end of its stream). */
export const SamplingStatus = z
  .strictObject({
    id: z.string(),
    /**
     * running; done (`groups` kept); exhausted (`max_groups` or the pool ran out first: fewer
     * kept); stopped (cancelled by the caller, or the service stopped starting work).
     */
    state: z.enum(['running', 'done', 'exhausted', 'stopped']),
    groups: z.number().int(),
    max_groups: z.number().int(),
    max_in_flight: z.number().int(),
    metric: z.enum(['reward', 'return']),
    /** Tasks of the pool. */
    pool: z.number().int(),
    /** Groups started (submitted). */
    tried: z.number().int(),
    /** Informative groups, delivered by the sampling's stream in this order (`kept_task_ids`). */
    kept: z.number().int(),
    /** Groups whose samples all had the same metric. */
    dropped_all_equal: z.number().int(),
    /** Groups with fewer than two samples not filtered (infrastructure failures), a group of one whose sample was: nothing to compare. */
    filtered: z.number().int(),
    /** Groups still running once the target was reached (or the sampling was stopped): cancelled, their samples readable by id. */
    cancelled: z.number().int(),
    running: z.number().int(),
    kept_task_ids: z.array(z.string()),
    /** Every group started, in the order started, and what became of it. */
    tasks: z.array(z.strictObject({ task_id: z.string(), outcome: SampledGroupOutcome })),
    /** Why the sampling stopped early (a task could not be started), else null. */
    error: z.string().nullable(),
  })
  .meta({ id: 'SamplingStatus' });
export type SamplingStatus = z.infer<typeof SamplingStatus>;
export type SamplingState = SamplingStatus['state'];
