export { sweEnvironment as default } from './environment.ts';
export { createSweEnvironment, SWE_EXTRA_KEYS, sweEnvironment } from './environment.ts';
export type { SweEnvironmentOptions, SweResources } from './environment.ts';
export { evaluatePatch } from './evaluate.ts';
export type { EvalOutcome, EvaluateOptions, FailureReason } from './evaluate.ts';
export { imageFromTemplate, instanceTestCommand, recheckInstance, resolveInstance, rowRoots, sandboxSpec, sweDataDir } from './instance.ts';
export type { SweInstance } from './instance.ts';
export { archiveTree, prepareRepository } from './repository.ts';
export { extractDiff, responseDiff } from './response-diff.ts';
export { SweConfig, SweRow, TestList, VerifyFrom } from './schema.ts';
export {
  condaActivateScript,
  datasetImage,
  lookupMultilingualSpec,
  lookupSweBenchSpec,
  lookupSweGymSpec,
  lookupSweSmithSpec,
  MULTILINGUAL_SPECS,
  NON_TEST_EXTS,
  SWE_BENCH_CONDA_ENV,
  sweBenchRepos,
  testFilesOfPatch,
} from './specs/index.ts';
export type { DatasetSpec, MultilingualRepoSpec, SweBenchSpec } from './specs/index.ts';
export { applyScript, checkoutScript, diffScript, extractScript, freshRepoScript, GIT_ENV, patchedFiles, restoreScript, stageScript } from './scripts.ts';
export {
  djangoParser,
  getTestParser,
  grade,
  maintained,
  matplotlibParser,
  passed,
  pytestOptionsParser,
  pytestParser,
  pytestV2Parser,
  registerTestParser,
  seabornParser,
  statusOf,
  sympyParser,
  testCommandLine,
  testParserNames,
  unittestParser,
} from './test-parsers.ts';
export type { Grade, TestParser, TestStatus } from './test-parsers.ts';
