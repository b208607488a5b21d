// `@rollserve/core`: what an environment is written with. The spec (defineEnvironment, defineTool,
// the built-in tools), the error type, Responses API helpers, Python-compatible string functions
// and NeMo Gym's metric helpers. Loading it loads neither the service, its store drivers nor a
// server. The other doors: `./sandbox`, `./gym`, `./service`, and `./internal` for the rest.
export { ERROR_CODES, RolloutError, suggest, type RolloutErrorCode, type RolloutErrorOptions } from './errors.ts';
export { invalidInputError } from './server/fastapi-errors.ts';
export type { EnvironmentContext, Session } from './spec/context.ts';
export {
  defineEnvironment,
  sandboxSpecOf,
  type Environment,
  type EnvironmentDefinition,
  type EnvironmentMetrics,
  type NemoGymDomain,
  type ReverifyMode,
  type SandboxRequirement,
  type VerifyEntry,
  type VerifyResult,
} from './spec/environment.ts';
export { defineTool, type ToolDefinition, type ToolExecution } from './spec/tool.ts';
export { bashTool, createBashTool, createEditorTool, createPythonTool, editorTool, pythonTool, type BashToolResult, type ToolFactoryOptions } from './spec/builtin-tools.ts';
export { SessionTools } from './tools/session-tools.ts';
export {
  assistantMessageTexts,
  functionCalls,
  NeMoGymResponse,
  OutputItem,
  outputText,
  ResponseCreateParams,
  type FunctionCall,
} from './protocol/responses.ts';
export { PY_SPACE, PY_SPACE_CHARS, PY_WORD_CHARS, pyIsAlphaChar, pyLen, pySplit, pyStrip } from './protocol/python-text.ts';
export { computeAggregateMetrics, type AggregateMetrics, type AggregateMetricsHooks } from './gym/metrics.ts';
export {
  addAvgSampleStdDev,
  computePassMajorityMetrics,
  computeSubsetMetrics,
  highestKMetrics,
  pickMetrics,
  type HighestKOptions,
  type PassMajorityOptions,
} from './gym/pass-at-k.ts';
