// The test specs and image names of the datasets besides SWE-bench (Lite, Verified, full), as
// their own harnesses have them:
// - SWE-Gym (SWE-Gym/SWE-Bench-Fork, swebench/harness/constants.py and test_spec.py): SWE-bench's
//   row fields, FAIL_TO_PASS / PASS_TO_PASS as lists, its own repositories (moto, mypy, pandas, ...)
//   with their test commands, images `xingyaoww/sweb.eval.x86_64.<id, __ as _s_>`.
// - SWE-smith (SWE-bench/SWE-smith, swesmith/constants.py and harness/): `image_name`, no
//   test_patch nor version, `patch` the bug (its reverse the fix), base_commit the bug's commit,
//   `pytest --disable-warnings --color=no --tb=no --verbose` on the FAIL_TO_PASS files.
// - SWE-bench Multilingual (SWE-bench 4.1.0's constants/{c,go,...}.py, multilingual-table.ts): per
//   version test commands run as they are (no directives), after the spec's build commands.

import { MULTILINGUAL_SPECS, type MultilingualRepoSpec } from './multilingual-table.ts';

const SWE_GYM_PYTEST = 'pytest -n0 -rA';

/** SWE-Gym's repositories besides SWE-bench's: one test command for every version (mypy aside). */
const SWE_GYM: Record<string, { command: string; parser: string }> = {
  'getmoto/moto': { command: SWE_GYM_PYTEST, parser: 'pytest' },
  'conan-io/conan': { command: SWE_GYM_PYTEST, parser: 'pytest' },
  'dask/dask': { command: 'pytest -n0 -rA  --color=no', parser: 'pytest' },
  'project-monai/monai': { command: 'pytest -rA ', parser: 'pytest' },
  'iterative/dvc': { command: 'pytest -rA', parser: 'pytest' },
  'bokeh/bokeh': { command: 'pytest -rA -n0', parser: 'pytest' },
  'modin-project/modin': { command: SWE_GYM_PYTEST, parser: 'pytest' },
  'hypothesisworks/hypothesis': { command: 'pytest -n0 -rA --tb=no --no-header', parser: 'pytest' },
  'pydantic/pydantic': { command: 'pytest -rA --tb=short -vv -o console_output_style=classic --no-header', parser: 'pytest_pydantic' },
  'pandas-dev/pandas': { command: 'pytest -rA --tb=long', parser: 'pytest' },
  'facebookresearch/hydra': { command: 'pytest -rA --tb=long', parser: 'pytest' },
  'python/mypy': { command: 'pytest -n0 -rA -k', parser: 'pytest' },
};
/** mypy's newest versions run without -n0. */
const SWE_GYM_MYPY_NEW = new Set(['1.7', '1.8', '1.9', '1.10', '1.11']);

/** What a dataset's harness runs for one row, when it is not SWE-bench's table. */
export interface DatasetSpec {
  dataset: 'swe-gym' | 'swe-smith' | 'swe-bench-multilingual';
  repo: string;
  /** The test command, complete (`targets: 'none'`) or to be given the targets. */
  testCommand: string;
  parser: string;
  /**
   * What the command is given: SWE-bench's directives of test_patch (SWE-Gym), the files of
   * the FAIL_TO_PASS ids (SWE-smith's pytest commands), or nothing.
   */
  targets: 'test-patch' | 'fail-to-pass-files' | 'none';
  /** Multilingual's: run with sh's `-x` trace, as SWE-bench's eval script (some parsers read it). */
  script: boolean;
  /** Its language (Multilingual), for the record. */
  language?: string;
}

const sq = (text: string): string => `'${text.replaceAll("'", "'\\''")}'`;

/** mypy's test keys (`-k "a or b"`): the `[case X]` names of test_patch, as SWE-Gym's make_test_command. */
export function mypyCaseKeys(testPatch: string): string {
  return [...testPatch.matchAll(/\[case ([^\]]+)\]/g)].map((m) => m[1]!).join(' or ');
}

/** SWE-Gym's spec of `repo` (any case), or undefined for a repository SWE-Gym did not add. */
export function lookupSweGymSpec(repo: string | undefined, version: string | undefined, testPatch: string): DatasetSpec | undefined {
  if (repo === undefined) return undefined;
  const key = repo.toLowerCase();
  const spec = Object.hasOwn(SWE_GYM, key) ? SWE_GYM[key] : undefined;
  if (spec === undefined) return undefined;
  if (key === 'python/mypy') {
    const command = version !== undefined && SWE_GYM_MYPY_NEW.has(version) ? 'pytest -rA -k' : spec.command;
    return { dataset: 'swe-gym', repo, testCommand: `${command} "${mypyCaseKeys(testPatch)}"`, parser: spec.parser, targets: 'none', script: false };
  }
  return { dataset: 'swe-gym', repo, testCommand: spec.command, parser: spec.parser, targets: 'test-patch', script: false };
}

const SWE_SMITH_PYTEST = 'pytest --disable-warnings --color=no --tb=no --verbose';
/** SWE-smith's repositories whose command or parser is not the default (keys as its image names have them, lower case). */
const SWE_SMITH: Record<string, { command?: string; parser?: string }> = {
  'gin-gonic/gin': { command: 'go test -v ./...', parser: 'gotest' },
  'jax-ml/jax': { command: `${SWE_SMITH_PYTEST} -n auto` },
  'mido/mido': { command: `${SWE_SMITH_PYTEST} -rs -c /dev/null` },
  'paramiko/paramiko': { command: 'pytest -rA --color=no --disable-warnings', parser: 'paramiko' },
  'pydantic/pydantic': { command: `/root/.local/bin/uv run ${SWE_SMITH_PYTEST}` },
  'python/mypy': { command: 'pytest --color=no -rA -k', parser: 'mypy' },
  'tkrajina/gpxpy': { command: 'pytest test.py --verbose --color=no --tb=no --disable-warnings' },
  'tornadoweb/tornado': { command: 'python -m tornado.test --verbose', parser: 'tornado' },
  'un33k/python-slugify': { command: 'python test.py --verbose', parser: 'python_slugify' },
  'hips/autograd': { parser: 'autograd' },
};

/**
 * SWE-smith's repository of a row (`owner/name`, lower case): from `repo`
 * (`swesmith/<owner>__<name>.<commit>`) or `image_name` (`[ns/]swesmith.x86_64.<owner>__<name>.<commit>`,
 * `__` also spelled `_1776_`), as its `get_repo_commit_from_image_name` reads them.
 */
export function sweSmithRepo(row: { repo?: string | undefined; image_name?: string | undefined }): string | undefined {
  const fromRepo = row.repo?.startsWith('swesmith/') === true ? row.repo.slice('swesmith/'.length) : undefined;
  const fromImage = row.image_name?.split('/').pop()?.split('.').slice(2).join('.');
  const name = fromRepo ?? fromImage;
  if (name === undefined || !name.includes('.')) return undefined;
  return name.slice(0, name.lastIndexOf('.')).replaceAll('_1776_', '__').replace('__', '/').toLowerCase();
}

/** SWE-smith's spec of a row that has an `image_name`. */
export function lookupSweSmithSpec(row: { repo?: string | undefined; image_name?: string | undefined }, failToPass: readonly string[]): DatasetSpec | undefined {
  if (row.image_name === undefined) return undefined;
  const repo = sweSmithRepo(row) ?? '';
  const own = Object.hasOwn(SWE_SMITH, repo) ? SWE_SMITH[repo] : undefined;
  const command = own?.command ?? SWE_SMITH_PYTEST;
  const parser = own?.parser ?? 'swesmith_pytest';
  if (repo === 'python/mypy') {
    // its F2P ids' last `::` parts, as SWE-smith's get_test_command_mypy
    const keys = failToPass.map((id) => id.split('::').pop()!).join(' or ');
    return { dataset: 'swe-smith', repo, testCommand: `${command} "${keys}"`, parser, targets: 'none', script: false };
  }
  // SWE-smith gives a pytest command the FAIL_TO_PASS files, any other command nothing
  return { dataset: 'swe-smith', repo, testCommand: command, parser, targets: command.includes('pytest') ? 'fail-to-pass-files' : 'none', script: false };
}

const multilingualRepo = (repo: string): [string, MultilingualRepoSpec] | undefined => {
  const key = Object.keys(MULTILINGUAL_SPECS).find((name) => name.toLowerCase() === repo.toLowerCase());
  return key === undefined ? undefined : [key, MULTILINGUAL_SPECS[key]!];
};

/** Whether SWE-bench Multilingual knows `repo` (any case). */
export const isMultilingualRepo = (repo: string | undefined): boolean => repo !== undefined && multilingualRepo(repo) !== undefined;

/**
 * SWE-bench Multilingual's spec of `repo` at `version` (its newest when the version is not
 * listed): the build commands then the test commands, between SWE-bench's output markers, as one
 * script run under `set -ux` as its eval script is (a failing build does not stop the tests).
 */
export function lookupMultilingualSpec(repo: string | undefined, version: string | undefined): (DatasetSpec & { exact: boolean }) | undefined {
  if (repo === undefined) return undefined;
  const found = multilingualRepo(repo);
  if (found === undefined) return undefined;
  const [name, spec] = found;
  const exact = version !== undefined && Object.hasOwn(spec.versions, version) ? spec.versions[version] : undefined;
  const chosen = exact ?? Object.values(spec.versions).at(-1)!;
  const script = [...(chosen.build ?? []), `: ${sq('>>>>> Start Test Output')}`, ...chosen.test, `: ${sq('>>>>> End Test Output')}`].join('\n');
  return { dataset: 'swe-bench-multilingual', repo: name, testCommand: script, parser: chosen.parser ?? spec.parser, targets: 'none', script: true, language: spec.language, exact: exact !== undefined };
}

/**
 * The image a row's own dataset names for it (the `{instance_image}` of an image template):
 * SWE-smith's `image_name`; SWE-Gym's `xingyaoww/sweb.eval.x86_64.<id>:latest` with `__` as
 * `_s_`; else SWE-bench's `swebench/sweb.eval.x86_64.<id>:latest` with `__` as `_1776_`
 * (Verified, Multilingual and NeMo Gym's rows alike), lower case as Docker names are.
 */
export function datasetImage(row: { instance_id: string; repo?: string | undefined; image_name?: string | undefined }): string {
  if (row.image_name !== undefined) return row.image_name;
  if (row.repo !== undefined && Object.hasOwn(SWE_GYM, row.repo.toLowerCase())) return `xingyaoww/sweb.eval.x86_64.${row.instance_id.replaceAll('__', '_s_').toLowerCase()}:latest`;
  return `swebench/sweb.eval.x86_64.${row.instance_id.replaceAll('__', '_1776_').toLowerCase()}:latest`;
}
