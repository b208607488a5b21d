import { CreditConfig, TurnRewardWeights, type CreditSettings, type RolloutTask } from '../../protocol/rollout.ts';

const DEFAULTS: CreditSettings = CreditConfig.parse({});

/**
 * A task's credit settings. `credit` wins when given (its omitted fields take the defaults).
 * Without it, the legacy fields map as: `gamma` → `credit.gamma` (1 when only `turn_rewards` is
 * given); `turn_rewards.format` w → `format_bonus: w`, `format_penalty: 0` (w on a well-formed
 * turn, as before); `turn_rewards.tool` / `.outcome` → `weights.tool` / `.outcome`; shaping off
 * (`alpha: 0`). So legacy tasks get the rewards and returns they got before. With neither, GTPO's
 * defaults.
 */
export function resolveCredit(task: Partial<Pick<RolloutTask, 'credit' | 'gamma' | 'turn_rewards'>>): CreditSettings {
  if (task.credit) return task.credit;
  if (task.gamma === undefined && task.turn_rewards === undefined) return DEFAULTS;
  const legacy = task.turn_rewards ?? TurnRewardWeights.parse({});
  return {
    ...DEFAULTS,
    gamma: task.gamma ?? 1,
    format_penalty: 0,
    format_bonus: legacy.format,
    weights: { ...DEFAULTS.weights, tool: legacy.tool, outcome: legacy.outcome },
    shaping: { ...DEFAULTS.shaping, alpha: 0 },
  };
}
