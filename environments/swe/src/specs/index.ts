export { condaActivateScript, lookupSweBenchSpec, SWE_BENCH_CONDA_ENV, sweBenchRepos } from './swe-bench-specs.ts';
export type { SweBenchSpec } from './swe-bench-specs.ts';
export { NON_TEST_EXTS, testFilesOfPatch } from './test-directives.ts';
export { datasetImage, isMultilingualRepo, lookupMultilingualSpec, lookupSweGymSpec, lookupSweSmithSpec, mypyCaseKeys, sweSmithRepo } from './other-datasets.ts';
export type { DatasetSpec } from './other-datasets.ts';
export { MULTILINGUAL_SPECS } from './multilingual-table.ts';
export type { MultilingualRepoSpec, MultilingualVersionSpec } from './multilingual-table.ts';
