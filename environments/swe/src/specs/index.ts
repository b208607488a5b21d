export { condaActivateScript, lookupSweBenchSpec, SWE_BENCH_CONDA_ENV, sweBenchRepos } from './swe-bench-specs.ts';
export type { SweBenchSpec } from './swe-bench-specs.ts';
export { NON_TEST_EXTS, testFilesOfPatch } from './test-directives.ts';
