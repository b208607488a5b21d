import { z } from 'zod';
import { GradingMode } from './mcqa.ts';
import { parseQuantity } from './numeric.ts';

/**
 * A stem dataset row: NeMo Gym mcqa's fields, plus opt-in numeric answers with units.
 *
 * Multiple choice (the default, exactly as mcqa):
 * - `options`: `[{"A": "text"}, {"B": "text"}, ...]`; a letter whose text is null is not an option.
 * - `expected_answer`: the gold letter, e.g. `"B"` (trimmed and upper-cased before comparing).
 * - `grading_mode`: see {@link GradingMode}; default `strict_single_letter_boxed`. The server
 *   config's `grading_mode` overrides it.
 * - `template_metadata.output_regex`: a Python regex (or a list, tried in order) whose last match,
 *   case-insensitive, is the answer; it goes before the grading mode. `template_metadata.answer_prefix`
 *   is an extra answer marker for `lenient_answer_colon_md`.
 *
 * Numeric (`answer_type: "numeric"`):
 * - `expected_answer`: a quantity, e.g. `"9.81 m/s^2"`, `"3.0 \\times 10^{8} m/s"`, `"2.5e-3 mol/L"`,
 *   `"25 °C"`, or a bare number for a dimensionless answer.
 * - The model's answer is the last `\boxed{}` (else the last `Answer:` line). Units are converted to
 *   SI (prefixes, N, J, eV, Pa, atm, L, min, h, ...); a different dimension scores 0.
 * - `rel_tol` (default 0.01): |answer − expected| ≤ rel_tol·|expected| scores 1; `abs_tol` (default 0,
 *   in SI units) also passes, for expected values near zero.
 * - `require_unit` (default false): when false, a bare number is read in the expected unit.
 *
 * Verify extras are mcqa's for both kinds: `expected_answer` and `extracted_answer` (for numeric
 * rows, the model's answer in SI, e.g. `"9.81 m s^-2"`, or null).
 *
 * @example
 * { "options": [{"A": "2"}, {"B": "4"}], "expected_answer": "B", "grading_mode": "lenient_boxed" }
 * { "answer_type": "numeric", "expected_answer": "9.81 m/s^2", "rel_tol": 0.005 }
 */
export const StemRow = z
  .object({
    options: z.array(z.record(z.string(), z.string().nullable())).nullish(),
    expected_answer: z.string().nullish(),
    grading_mode: GradingMode.optional(),
    template_metadata: z
      .looseObject({
        output_regex: z.union([z.string(), z.array(z.string())]).optional(),
        answer_prefix: z.string().nullish(),
      })
      .nullish(),
    answer_type: z.enum(['multiple_choice', 'numeric']).optional(),
    rel_tol: z.number().nonnegative().optional(),
    abs_tol: z.number().nonnegative().optional(),
    require_unit: z.boolean().optional(),
  })
  .superRefine((row, ctx) => {
    if (row.answer_type !== 'numeric') return;
    if (typeof row.expected_answer !== 'string' || parseQuantity(row.expected_answer) === null) {
      ctx.addIssue({
        code: 'custom',
        path: ['expected_answer'],
        message: 'a numeric row needs an expected_answer that reads as a quantity, e.g. "9.81 m/s^2"',
      });
    }
  });

export type StemRow = z.output<typeof StemRow>;

/** The server config (NeMo Gym YAML block): `grading_mode` overrides every row's. */
export const StemConfig = z.object({
  grading_mode: GradingMode.nullish(),
});

export type StemConfig = z.output<typeof StemConfig>;
