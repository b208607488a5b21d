export { mathEnvironment as default } from './environment.ts';
export {
  lastBoxedAnswer,
  MathConfig,
  mathEnvironment,
  mathKeyMetrics,
  mathMetrics,
  MathRow,
} from './environment.ts';
export type { MathResources } from './environment.ts';
export type { ExtractionTarget } from './extract.ts';
export { extractionMatchGroups, stripGold } from './extract.ts';
export type { GradeOptions, GradeResult } from './grade.ts';
export { extractAnswers, gradeAnswer, parseAnswer } from './grade.ts';
export type { GradeOutcome, Grader, GraderOptions } from './grader.ts';
export { createGrader, createInlineGrader } from './grader.ts';
export type { JudgeEvaluation, JudgeOptions } from './judge.ts';
export { JudgeError, judgeEquivalence, judgeSaysEqual } from './judge.ts';
export { extractBoxedContent, normalizeAnswerLatex } from './latex-normalize.ts';
export { print as sympyStr } from './sympy/index.ts';
export type { CodeToolsConfig, ExecutePythonResponse } from './code-tools.ts';
export { codeKernelStart, createEndSessionTool, createExecutePythonTool, executePython, resultLine } from './code-tools.ts';
export type { MathWithCodeVerdict, MathWithCodeVerifier } from './math-with-code.ts';
export {
  codeAnswersMatch,
  firstRegexBoxed,
  lastBalancedBoxed,
  normalizeCodeAnswer,
  pythonFloat,
  verifyMathWithCode,
} from './math-with-code.ts';
