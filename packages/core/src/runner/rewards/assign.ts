import type { CreditRecord, CreditSettings, RolloutResult, TurnRecord, TurnStatus } from '../../protocol/rollout.ts';
import { malformedReason, TURN_REWARD_COMPONENTS, TURN_REWARD_NAMES } from '../../protocol/reward-components.ts';

/** G_t = Σ_{k≥0} γ^k r_{t+k}, computed backwards: G_t = r_t + γ G_{t+1}. */
export function discountedReturns(rewards: readonly number[], gamma: number): number[] {
  const returns = new Array<number>(rewards.length);
  let next = 0;
  for (let t = rewards.length - 1; t >= 0; t--) {
    next = rewards[t]! + gamma * next;
    returns[t] = next;
  }
  return returns;
}

function turnStatus(turn: TurnRecord, malformed: string | null): TurnStatus {
  if (malformed !== null) return 'malformed';
  if (turn.tool_calls.length === 0) return 'none';
  if (turn.tool_calls.some((c) => c.status === 'timeout')) return 'timeout';
  if (turn.tool_calls.some((c) => c.status !== 'ok')) return 'error';
  return 'ok';
}

/**
 * Scores a trajectory's turns in place: status, each component, reward_t = Σ_c w_c · value_c(t)
 * over the known components, and the discounted returns. `shaping` is the trajectory's shaping
 * reward (null: not known yet, or failed).
 */
export function scoreTurns(turns: TurnRecord[], outcome: number, settings: CreditSettings, shaping: number | null): void {
  turns.forEach((turn, i) => {
    const isLast = i === turns.length - 1;
    turn.malformed = malformedReason(turn, isLast);
    turn.status = turnStatus(turn, turn.malformed);
    turn.code ??= joinCode(turn);
    const ctx = { isLast, outcome, shaping, settings };
    let reward = 0;
    const rewards = {} as TurnRecord['rewards'];
    for (const name of TURN_REWARD_NAMES) {
      const value = TURN_REWARD_COMPONENTS[name].value(turn, ctx);
      rewards[name] = value;
      if (value !== null) reward += settings.weights[name] * value;
    }
    turn.rewards = rewards;
    turn.reward = reward;
  });
  const returns = discountedReturns(
    turns.map((t) => t.reward),
    settings.gamma,
  );
  turns.forEach((turn, i) => (turn.return = returns[i]!));
}

function joinCode(turn: TurnRecord): string | null {
  const code = turn.tool_calls.map((c) => c.code).filter((c): c is string => c !== null && c !== undefined);
  return code.length === 0 ? null : code.join('\n');
}

/** A trajectory's code: every turn's executed code, in order, joined by newlines. */
export function trajectoryCode(turns: readonly TurnRecord[]): string {
  return turns
    .map((t) => t.code)
    .filter((c): c is string => typeof c === 'string')
    .join('\n');
}

/** The credit record before the group is known: settings and each component's weight and parameters. */
export function creditRecord(settings: CreditSettings): CreditRecord {
  return {
    gamma: settings.gamma,
    normalize: settings.normalize,
    components: Object.fromEntries(
      TURN_REWARD_NAMES.map((name) => [name, { weight: settings.weights[name], params: TURN_REWARD_COMPONENTS[name].params(settings) }]),
    ),
    shaping: null,
    stats: null,
    error: null,
  };
}

/**
 * Per-sample credit, as soon as a sample finishes: its turns scored with shaping known only where
 * it cannot change (a success, a filtered sample, or a group of one: 0); a failure in a larger
 * group waits for its group (shaping null until then).
 */
export function assignSampleCredit(result: RolloutResult, settings: CreditSettings, groupSize: number): void {
  const success = result.reward >= settings.shaping.success_threshold;
  const final = result.filter || success || groupSize < 2 || settings.shaping.alpha === 0;
  scoreTurns(result.turns, result.reward, settings, final ? 0 : null);
  result.credit = creditRecord(settings);
  // a group of one is whole already: its shaping is the 0 its turns say, not unknown
  if (groupSize < 2) result.credit.shaping = { value: 0, similarity: null, successes: success && !result.filter ? 1 : 0 };
  for (const turn of result.turns) turn.normalized_return = null;
}
