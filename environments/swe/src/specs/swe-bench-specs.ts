// SWE-bench's per-repository test specs as data: for each repository and version, the test
// command (`test_cmd` of swebench/harness/constants/python.py, MAP_REPO_VERSION_TO_SPECS) and
// the variables its eval script exports (`eval_commands`); for each repository, its log parser
// (MAP_REPO_TO_PARSER). The facts are SWE-bench 4.x's, the harness that produced its datasets'
// FAIL_TO_PASS / PASS_TO_PASS lists. Installation (conda envs, pip pins) is the image's business.

/** What SWE-bench runs for one repository at one version. */
export interface SweBenchSpec {
  repo: string;
  version: string;
  /** The test command; the test directives from test_patch are appended. */
  testCommand: string;
  /** A name in the test-parser registry. */
  parser: string;
  /** Variables the eval script exports before the tests (Django's locale). */
  env: Record<string, string>;
  /** false when the version is not in SWE-bench's table and the repository's newest spec stands in. */
  exact: boolean;
}

const PYTEST = 'pytest -rA';
const SEABORN = 'pytest --no-header -rA';
const ASTROPY_OLD = 'pytest -rA -vv -o console_output_style=classic --tb=no';
const DJANGO = './tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1';
const DJANGO_NO_PARALLEL = './tests/runtests.py --verbosity 2';
const SPHINX = 'tox --current-env -epy39 -v --';
const SYMPY = "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose";

const DJANGO_LOCALE = { LANG: 'en_US.UTF-8', LC_ALL: 'en_US.UTF-8', PYTHONIOENCODING: 'utf8', LANGUAGE: 'en_US:en' };
const DJANGO_3_LOCALE = { LANG: 'en_US.UTF-8', LANGUAGE: 'en_US:en', LC_ALL: 'en_US.UTF-8' };

interface VersionSpec {
  command: string;
  env?: Record<string, string>;
}
interface RepoSpecs {
  parser: string;
  /** Version → spec; the last group listed is the repository's newest. */
  versions: Map<string, VersionSpec>;
}

const group = (versions: readonly string[], command: string, env?: Record<string, string>): Array<[string, VersionSpec]> =>
  versions.map((v) => [v, env === undefined ? { command } : { command, env }]);

const repo = (parser: string, ...groups: Array<Array<[string, VersionSpec]>>): RepoSpecs => ({ parser, versions: new Map(groups.flat()) });

const range = (text: string): string[] => text.split(' ');

const SPECS: Record<string, RepoSpecs> = {
  'astropy/astropy': repo(
    'pytest_v2',
    group(range('0.1 0.2 0.3 0.4 1.1 1.2 1.3'), ASTROPY_OLD),
    group(range('3.0 3.1 3.2 4.1 4.2 4.3 5.0 5.1 5.2 v5.3'), PYTEST),
  ),
  'django/django': repo(
    'django',
    group(range('1.4 1.5 1.6'), DJANGO),
    group(range('1.7 1.8'), DJANGO, DJANGO_LOCALE),
    group(['1.9'], DJANGO_NO_PARALLEL, DJANGO_LOCALE),
    group(range('1.10 1.11 2.0 2.1 2.2'), DJANGO, DJANGO_LOCALE),
    group(range('3.0 3.1 3.2'), DJANGO, DJANGO_3_LOCALE),
    group(range('4.0 4.1 4.2 5.0 5.1 5.2'), DJANGO),
  ),
  'marshmallow-code/marshmallow': repo('pytest', group(range('2.18 2.19 2.20 3.0 3.1 3.2 3.4 3.8 3.9 3.10 3.11 3.12 3.13 3.15 3.16 3.19'), PYTEST)),
  'matplotlib/matplotlib': repo('matplotlib', group(range('1.0 1.1 1.2 1.3 1.4 1.5 2.0 2.1 2.2 3.0 3.1 3.2 3.3 3.4 3.5 3.6 3.7 3.8 3.9'), PYTEST)),
  'mwaskom/seaborn': repo('seaborn', group(range('0.11 0.12 0.13 0.14'), SEABORN)),
  'pallets/flask': repo('pytest', group(range('2.0 2.1 2.2 2.3 3.0 3.1'), PYTEST)),
  'psf/requests': repo(
    'pytest_options',
    group(range('0.7 0.8 0.9 0.11 0.13 0.14 1.1 1.2 2.0 2.2 2.3 2.4 2.5 2.7 2.8 2.9 2.10 2.11 2.12 2.17 2.18 2.19 2.22 2.25 2.26 2.27 2.31 3.0'), PYTEST),
  ),
  'pvlib/pvlib-python': repo('pytest', group(range('0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9'), PYTEST)),
  'pydata/xarray': repo('pytest', group(range('0.12 0.18 0.19 0.20 2022.03 2022.06 2022.09 2023.07 2024.05'), PYTEST)),
  'pydicom/pydicom': repo('pytest_options', group(range('1.0 1.1 1.2 1.3 1.4 2.0 2.1 2.2 2.3 2.4 3.0'), PYTEST)),
  'pylint-dev/astroid': repo('pytest', group(range('2.5 2.6 2.7 2.8 2.9 2.10 2.12 2.13 2.14 2.15 2.16 3.0'), PYTEST)),
  'pylint-dev/pylint': repo('pytest_options', group(range('2.8 2.9 2.10 2.11 2.13 2.14 2.15 2.16 2.17 3.0 3.1 3.2 3.3 4.0'), PYTEST)),
  'pytest-dev/pytest': repo('pytest', group(range('4.4 4.5 4.6 5.0 5.1 5.2 5.3 5.4 6.0 6.2 6.3 7.0 7.1 7.2 7.4 8.0 8.1 8.2 8.3 8.4'), PYTEST)),
  'pyvista/pyvista': repo(
    'pytest',
    group(range('0.20 0.21 0.22 0.23 0.24 0.25 0.26 0.27 0.28 0.29 0.30 0.31 0.32 0.33 0.34 0.35 0.36 0.37 0.38 0.39 0.40 0.41 0.42 0.43'), PYTEST),
  ),
  'scikit-learn/scikit-learn': repo('pytest_v2', group(range('0.20 0.21 0.22 1.3 1.4 1.5 1.6'), PYTEST)),
  'sphinx-doc/sphinx': repo(
    'pytest_v2',
    group(range('1.5 1.6 1.7 1.8 2.0 2.1 2.2 2.3 2.4 3.0 3.1 3.2 3.3 3.4 3.5 4.0 4.1 4.2 4.3 4.4 4.5 5.0 5.1 5.2 5.3 6.0 6.2 7.0 7.1 7.2 7.3 7.4 8.0 8.1'), SPHINX),
  ),
  'sqlfluff/sqlfluff': repo('pytest', group(range('0.4 0.5 0.6 0.8 0.9 0.10 0.11 0.12 0.13 1.0 1.1 1.2 1.3 1.4 2.0 2.1 2.2'), PYTEST)),
  'sympy/sympy': repo('sympy', group(range('0.7 1.0 1.1 1.2 1.4 1.5 1.6 1.7 1.8 1.9 1.10 1.11 1.12 1.13 1.14'), SYMPY)),
};

/** The repositories SWE-bench's table knows. */
export function sweBenchRepos(): string[] {
  return Object.keys(SPECS);
}

/**
 * SWE-bench's spec of `repo` at `version`, or undefined for a repository it does not know. A
 * version it does not list gets the repository's newest spec (`exact: false`).
 */
export function lookupSweBenchSpec(repoName: string | undefined, version: string | number | undefined): SweBenchSpec | undefined {
  if (repoName === undefined) return undefined;
  const specs = Object.hasOwn(SPECS, repoName) ? SPECS[repoName] : undefined;
  if (specs === undefined) return undefined;
  // A version read from JSON as a number (3.0 → 3) is SWE-bench's "3.0".
  const key = typeof version === 'number' ? (Number.isInteger(version) ? version.toFixed(1) : String(version)) : version;
  const exact = key === undefined ? undefined : specs.versions.get(key);
  const chosen = exact ?? [...specs.versions.values()].at(-1)!;
  return { repo: repoName, version: key ?? '', testCommand: chosen.command, parser: specs.parser, env: { ...chosen.env }, exact: exact !== undefined };
}

/** Where SWE-bench's images install the repository's environment (`conda activate testbed`). */
export const SWE_BENCH_CONDA_ENV = '/opt/miniconda3/envs/testbed';

/**
 * sh that puts a conda env's `bin` first on PATH when the sandbox has it: what SWE-bench's eval
 * script gets from `conda activate testbed`, whose images do not put it in their own PATH.
 */
export function condaActivateScript(prefix: string = SWE_BENCH_CONDA_ENV): string {
  const bin = `${prefix}/bin`;
  return `if [ -d '${bin}' ]; then PATH='${bin}':"$PATH"; CONDA_PREFIX='${prefix}'; export PATH CONDA_PREFIX; fi`;
}
