// Structural types of what components read, so that the schemas in types.ts can be derived from
// this table without a cycle.

/** What a component reads of a turn. */
export interface TurnView {
  text: string | null;
  tool_calls: ReadonlyArray<{ name: string; status: string }>;
}

/** What components read of the credit settings (CreditSettings). */
export interface ComponentSettings {
  format_penalty: number;
  format_bonus: number;
  shaping: { alpha: number; success_threshold: number; similarity: 'lexical' | { url: string; model: string }; clamp: boolean };
}

/** What a component sees of the turn's trajectory besides the turn. */
export interface TurnRewardContext {
  /** The turn is the trajectory's last. */
  isLast: boolean;
  /** The verify reward of the trajectory. */
  outcome: number;
  /** The trajectory's shaping reward (α × mean similarity); null while not known or when it failed. */
  shaping: number | null;
  settings: ComponentSettings;
}

/** One named per-turn reward component: its value, the parameters it used, its default weight. */
export interface TurnRewardComponent {
  description: string;
  /** The default of `credit.weights.<name>`. */
  defaultWeight: number;
  params(settings: ComponentSettings): Record<string, unknown>;
  /** null: not known (see the result's `credit.error`). */
  value(turn: TurnView, ctx: TurnRewardContext): number | null;
}

/**
 * Why a turn is malformed, or null: a tool call to an unknown tool or with arguments that are not
 * JSON or do not fit the tool's schema, a tool call the model wrote that was not parsed as one,
 * or a turn before the last that neither called a tool nor answered.
 */
export function malformedReason(turn: TurnView, isLast: boolean): string | null {
  for (const call of turn.tool_calls) {
    if (call.status === 'unknown_tool') return `unknown tool "${call.name}"`;
    if (call.status === 'invalid_arguments') return `invalid arguments for "${call.name}"`;
  }
  if (turn.tool_calls.length === 0) {
    if (turn.text?.includes('<tool_call>')) return 'a tool call that is not valid JSON';
    if (!isLast) return 'no tool call and no answer';
  }
  return null;
}

/**
 * The per-turn reward components, one table: the weights, the turn record's `rewards`, the
 * recorded parameters and the README's list all come from its keys. reward_t = Σ_c weight_c ·
 * value_c(t).
 */
export const TURN_REWARD_COMPONENTS = {
  format: {
    description: 'GTPO format term: -format_penalty on a malformed turn, else format_bonus (0 by default)',
    defaultWeight: 1,
    params: (s) => ({ penalty: s.format_penalty, bonus: s.format_bonus }),
    value: (turn, ctx) => (malformedReason(turn, ctx.isLast) === null ? ctx.settings.format_bonus : 0 - ctx.settings.format_penalty),
  },
  tool: {
    description: 'share of the turn\'s tool calls that ran cleanly (status ok), 1 with none',
    defaultWeight: 0,
    params: () => ({}),
    value: (turn) => (turn.tool_calls.length === 0 ? 1 : turn.tool_calls.filter((c) => c.status === 'ok').length / turn.tool_calls.length),
  },
  outcome: {
    description: 'the verify reward, on the last turn only',
    defaultWeight: 1,
    params: () => ({}),
    value: (_turn, ctx) => (ctx.isLast ? ctx.outcome : 0),
  },
  shaping: {
    description: 'self-supervised shaping on the last turn of a failed trajectory: α × mean cosine similarity of its code to the successful ones (at least 0 with clamp)',
    defaultWeight: 1,
    params: (s) => {
      const similarity = s.shaping.similarity;
      // the endpoint's key stays out of results
      return { alpha: s.shaping.alpha, similarity: similarity === 'lexical' ? similarity : { url: similarity.url, model: similarity.model }, success_threshold: s.shaping.success_threshold, clamp: s.shaping.clamp };
    },
    value: (_turn, ctx) => (ctx.isLast ? ctx.shaping : 0),
  },
} as const satisfies Record<string, TurnRewardComponent>;

export type TurnRewardName = keyof typeof TURN_REWARD_COMPONENTS;
export const TURN_REWARD_NAMES = Object.keys(TURN_REWARD_COMPONENTS) as TurnRewardName[];
