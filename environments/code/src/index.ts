export { codeEnvironment as default } from './environment.ts';
export { CodeConfig, codeEnvironment, codeKeyMetrics, codeMetrics, CodeRow } from './environment.ts';
export type { CodeResources } from './environment.ts';
export { extractCode, hasReasoningFormatViolation, isBlank } from './extract.ts';
export type { CodeRunner, CodeRunnerOptions, RunOutcome, Submission, TestResult } from './runner.ts';
export { createCodeRunner, globalTimeoutSecs } from './runner.ts';
