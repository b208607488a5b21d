import { RolloutError } from '../errors.ts';
import type { Job } from './job.ts';
import { assignSampleCredit } from './rewards/assign.ts';
import { resolveCredit } from './rewards/settings.ts';
import type { CriticalError, RolloutResult, StageName, TurnRecord } from '../protocol/rollout.ts';

/** What RUN produced (or, cut short, had produced): the trajectory a result carries however it ends. */
export type Trajectory = Pick<RolloutResult, 'response' | 'messages' | 'turns'>;

/**
 * What a finished rollout's stages produced. `policyTimeout`: a time-out that is the policy's
 * doing (see `timeoutIsPolicys`), scored as reward 0 and not filtered.
 */
export type Outcome = Pick<RolloutResult, 'state' | 'reward' | 'reward_components' | 'verify_extras' | 'critical_error' | 'error' | 'response' | 'messages' | 'turns'> & {
  policyTimeout?: boolean;
};

/** The outcome of a rollout that did not get through its stages, failing in `stage`. */
export function failedOutcome(error: unknown, stage: StageName, { response, messages, turns }: Trajectory): Outcome {
  const wrapped = RolloutError.from(error);
  // INIT's time-out is its own limit (init_timeout_s): start-up that did not finish, an
  // infrastructure failure like any other of INIT, not the rollout's time limit.
  const criticalError: CriticalError =
    wrapped.code === 'CANCELLED' ? 'cancelled' : wrapped.code === 'TIMEOUT' && stage !== 'init' ? 'timeout' : stage;
  return {
    state: criticalError === 'cancelled' ? 'cancelled' : 'failed',
    reward: 0,
    reward_components: null,
    verify_extras: {},
    critical_error: criticalError,
    error: { code: wrapped.code, message: wrapped.message },
    response,
    messages,
    turns,
  };
}

/** The outcome of a rollout that got through EVAL: scored by what verify returned, unless verify says it could not score it. */
export function verifiedOutcome(verified: unknown, { response, messages, turns }: Trajectory): Outcome {
  const { reward, reward_components, ...extras } = verified as { reward: number; reward_components?: Record<string, number> };
  const unscored = verifyFailure(extras);
  if (unscored !== undefined) {
    // verify could not score it (NeMo Gym's `_ng_failure_class`: a judge outage, say): an
    // infrastructure failure of EVAL, filtered, never a reward 0 to train on
    return { state: 'failed', reward: 0, reward_components: null, verify_extras: extras, critical_error: 'eval', error: unscored, response, messages, turns };
  }
  const score = typeof reward === 'number' && Number.isFinite(reward) ? reward : 0;
  return { state: 'done', reward: score, reward_components: reward_components ?? null, verify_extras: extras, critical_error: null, error: null, response, messages, turns };
}

/**
 * The error of a verify result that says it could not score the rollout: NeMo Gym's failure
 * convention (CONTRACT.md §1.6), `_ng_failure_class` with its `_ng_failure_*` details, which its
 * collection sends to the failures file instead of training on it.
 */
function verifyFailure(extras: Record<string, unknown>): { code: string; message: string } | undefined {
  const failure = extras._ng_failure_class;
  if (failure === undefined || failure === null || failure === false) return undefined;
  const details = Object.entries(extras)
    .filter(([key, value]) => key.startsWith('_ng_failure_') && key !== '_ng_failure_class' && typeof value === 'string' && value !== '')
    .map(([, value]) => value as string);
  return { code: 'UNAVAILABLE', message: `verify could not score the rollout (${String(failure)})${details.length > 0 ? `: ${details.join('; ')}` : ''}` };
}

/**
 * Whether a rollout's time-out (in RUN, or in EVAL, or before EVAL for want of time) is the
 * policy's doing: its own time in RUN (the stage's charged time less the time spent waiting for
 * model calls, i.e. its tool calls and the starts it caused after it acted) reached half of
 * `time_limit_s`. Model calls are never its time: how long a backend takes (its load, retries,
 * failover) is the infrastructure's, and a generation's length is bounded by `max_tokens` and
 * `max_turns`. Half, not all, because a policy that sleeps in its tools until the limit passes
 * still spends some of it waiting for its own generations; and a slow backend alone never gets
 * the policy's share there.
 */
export function timeoutIsPolicys(policyRunMs: number, timeLimitS: number): boolean {
  return policyRunMs >= (timeLimitS * 1000) / 2;
}

/**
 * A failed outcome whose time-out was the policy's (see `timeoutIsPolicys`; `policyRunMs`, its own
 * time in RUN): the policy spent the time itself (sleeping in its tools, say), and filtering that
 * would let it turn a sample it fails into one never trained on. Reward 0 like an unfinished
 * answer; EVAL is not run, as the time limit that also covers it is spent.
 */
export function policyTimedOut(outcome: Outcome, policyRunMs: number): Outcome {
  return {
    ...outcome,
    policyTimeout: true,
    error: {
      code: 'TIMEOUT',
      message: `${outcome.error!.message}; the policy's own time in RUN (its tool calls) was ${(policyRunMs / 1000).toFixed(1)} s, at least half the limit: scored as reward 0`,
    },
  };
}

/** The job's result from its outcome, with the sample's own credit. */
export function rolloutResult(job: Job, { policyTimeout, ...outcome }: Outcome): RolloutResult {
  // (the keys in the schema's order, the order the API sends them in)
  const result: RolloutResult = {
    id: job.id,
    task_id: job.taskId,
    sample_index: job.sampleIndex,
    env: job.task.env,
    state: outcome.state,
    reward: outcome.reward,
    reward_components: outcome.reward_components,
    verify_extras: outcome.verify_extras,
    critical_error: outcome.critical_error,
    // a sandbox limit the policy ran into, or a time limit it spent itself, is the policy's
    // doing: a real 0, to train on
    filter: outcome.critical_error !== null && outcome.error?.code !== 'RESOURCE_LIMIT' && policyTimeout !== true,
    error: outcome.error,
    advantage: null,
    credit: null,
    timing: { ...job.timing, total_ms: performance.now() - job.startedAt },
    response: outcome.response,
    messages: outcome.messages,
    turns: outcome.turns,
    ...weightVersionRange(outcome.turns),
    stale: false,
    ...(job.task.metadata ? { metadata: job.task.metadata } : {}),
    finished_at: new Date().toISOString(),
  };
  // Turn credit (rewards/), scored once here for every way a rollout ends: the sample's own now;
  // shaping and advantages need every sample of the task, so they are done by whoever sees the
  // group whole (the service's commit).
  assignSampleCredit(result, resolveCredit(job.task), job.task.n);
  return result;
}


/** The oldest and newest weight version of a rollout's turns (null without any). */
export function weightVersionRange(turns: readonly TurnRecord[]): { weight_version_min: number | null; weight_version_max: number | null } {
  let min: number | null = null;
  let max: number | null = null;
  for (const { weight_version: version } of turns) {
    if (version === null || version === undefined) continue;
    if (min === null || version < min) min = version;
    if (max === null || version > max) max = version;
  }
  return { weight_version_min: min, weight_version_max: max };
}
