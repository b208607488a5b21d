import { z } from 'zod';
import { getTestParser, testParserNames } from './test-parsers.ts';

/** SWE-bench keeps FAIL_TO_PASS / PASS_TO_PASS as JSON strings; SWE-Gym and R2E-Gym as lists. */
export const TestList = z.preprocess((value) => {
  if (typeof value !== 'string') return value;
  try {
    return JSON.parse(value) as unknown;
  } catch {
    return value; // not JSON: the array schema reports it
  }
}, z.array(z.string()));

/** A test-parser name the registry knows (else the row is a 422, naming the known ones). */
const ParserName = z.string().refine((name) => getTestParser(name) !== undefined, {
  error: (issue) => `unknown test_parser ${JSON.stringify(issue.input)} (known: ${testParserNames().join(', ')})`,
});

/** Environment variables: names as sh takes them. */
const EnvVars = z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string());

/** Where the patch to evaluate comes from: the agent sandbox's working tree, or the diff in the response text. */
export const VerifyFrom = z.enum(['sandbox', 'response']);

/**
 * The row fields the environment reads: SWE-bench's, plus where the repository comes from. Other
 * keys (problem_statement, hints_text, version, ...) pass through untouched.
 */
export const SweRow = z.looseObject({
  instance_id: z.string(),
  /** SWE-bench's `owner/name`: with `version`, it picks SWE-bench's test command and parser. */
  repo: z.string().optional(),
  /** SWE-bench's version of the repository at base_commit (a string; a JSON number is read as SWE-bench writes it). */
  version: z.union([z.string(), z.number()]).optional(),
  base_commit: z.string(),
  /** The gold patch; used when `is_verifying_golden_patch` is set. */
  patch: z.string().optional(),
  test_patch: z.string().default(''),
  FAIL_TO_PASS: TestList.default([]),
  PASS_TO_PASS: TestList.default([]),
  /**
   * The image: `oci:`/`sif:`/`squashfs:`/`docker-archive:`/`oci-archive:` or a bare path (a `.sif`,
   * a layout or, on bwrap, a root directory) under the config's `images_root`, or a registry
   * reference (`docker://…`, Apptainer only). Wins over the config's.
   */
  image: z.string().min(1).optional(),
  /** The image from the instance id, as the config's `image_template` (which it overrides); under `images_root` too. */
  image_template: z.string().min(1).optional(),
  /**
   * SWE-smith's image (`swesmith.x86_64.<owner>__<repo>.<commit>`, or with a namespace and `__` as
   * `_1776_`): read as `image` is (a name under images_root, else a registry name). It marks the
   * row as SWE-smith's: `patch` is the bug (its reverse the fix), base_commit the bug's commit.
   */
  image_name: z.string().min(1).optional(),
  /** A git repository under the config's `repos_root` (bwrap, local): its tree at base_commit is copied into the sandbox. */
  repo_path: z.string().min(1).optional(),
  /** Where the repository lives inside the sandbox. */
  repo_dir: z.string().optional(),
  /** sh run in the repository before the agent starts and before the tests run. */
  setup_script: z.string().optional(),
  /**
   * The test command; `{tests}` is replaced by the shell-quoted test files (from test_patch),
   * else they are appended. Overrides the config's and SWE-bench's.
   */
  test_command: z.string().optional(),
  /** A name in the test-parser registry. Overrides the config's and SWE-bench's. */
  test_parser: ParserName.optional(),
  /** Environment variables of the agent's shell and of the evaluation (over the config's `env`). */
  env: EnvVars.optional(),
  /**
   * Host directories or files under the config's `binds_root`, bound into the agent's sandbox and
   * the eval one; read-only unless the config sets `row_writable_binds`.
   */
  binds: z
    .array(
      z.object({
        host: z.string().startsWith('/', 'an absolute host path'),
        sandbox: z.string().startsWith('/', 'an absolute sandbox path'),
        /** @default true */
        read_only: z.boolean().default(true),
      }),
    )
    .optional(),
  /** Where the patch comes from (overrides the config's). */
  verify_from: VerifyFrom.optional(),
});
export type SweRow = z.output<typeof SweRow>;

/** The environment's config: the NeMo Gym YAML block of the server instance. */
export const SweConfig = z.object({
  /**
   * The sandbox provider: a name ('bwrap', 'apptainer', 'local') or a single-key config such as
   * `{ apptainer: { binDir: /opt/apptainer/bin } }`. Omitted: bwrap on Linux, else apptainer.
   */
  sandbox_provider: z.union([z.string(), z.record(z.string(), z.unknown())]).optional(),
  /** The image of rows that name none. */
  image: z.string().optional(),
  /**
   * The image of rows that name none, from the instance id: `{instance_id}` as is,
   * `{instance_id_1776}` with `__` as `_1776_` and in lower case (SWE-bench's image names),
   * `{instance_id_s}` with `__` as `_s_` in lower case (SWE-Gym's), and `{instance_image}` the
   * row's own dataset's registry name (SWE-smith's `image_name`, SWE-Gym's or SWE-bench's name).
   * Wins over `image`.
   * @example 'docker://swebench/sweb.eval.x86_64.{instance_id_1776}:latest'
   */
  image_template: z.string().optional(),
  /** Environment variables of every command in the sandboxes (the agent's shell included). */
  env: EnvVars.default({}),
  /*
   * A row names host paths only under these roots (the operator's; the config's own `image` and
   * `image_template` may name anything). Relative row paths resolve in them; symlinks and `..`
   * are followed first, so a path that leads out is refused (a 422 naming the field), as is
   * anything that is not a directory or a regular file. Defaults: `repos/`, `images/` and
   * `binds/` in the data dir (`$ROLLSERVE_DATA_DIR`, else `.rollserve` in the working directory).
   */
  /** Where rows' `repo_path`s lie. @default <data dir>/repos */
  repos_root: z.string().min(1).optional(),
  /** Where rows' `image`s and `image_template`s lie. @default <data dir>/images */
  images_root: z.string().min(1).optional(),
  /** Where rows' `binds` come from. @default <data dir>/binds */
  binds_root: z.string().min(1).optional(),
  /** Whether a row's bind may be writable (`read_only: false`); refused otherwise. */
  row_writable_binds: z.boolean().default(false),
  /** Where the repository lives in the sandbox. @default workdir with repo_path, else /testbed (SWE-bench images) */
  repo_dir: z.string().optional(),
  /** The sandbox's working directory (its writable workspace). */
  workdir: z.string().default('/workspace'),
  setup_script: z.string().optional(),
  /** The test command of every row that names none (over SWE-bench's per-repository one). */
  test_command: z.string().optional(),
  /** The parser of every row that names none (over SWE-bench's); unknown repositories get `pytest`. */
  test_parser: ParserName.optional(),
  /** Where the patch comes from: the agent sandbox's `git diff` or the diff in the response text. */
  verify_from: VerifyFrom.default('sandbox'),
  network: z.boolean().default(false),
  resources: z
    .object({
      memoryMib: z.number().int().positive().optional(),
      maxProcesses: z.number().int().positive().optional(),
      maxFileSizeMib: z.number().int().positive().optional(),
      cpuSeconds: z.number().int().positive().optional(),
      cpus: z.number().positive().optional(),
    })
    .optional(),
  /** Time limit of setup and of the repository preparation, each. */
  setup_timeout_s: z.number().positive().default(600),
  /** Time limit of the test run (NeMo Gym's swebench `evaluation_timeout`). */
  evaluation_timeout: z.number().positive().default(1800),
  /** Verify the row's gold `patch` instead of the agent's diff (NeMo Gym's name). */
  is_verifying_golden_patch: z.boolean().default(false),
  /** How much of the test output goes into `test_output` (its tail). */
  max_test_output_chars: z.number().int().nonnegative().default(20_000),
});
export type SweConfig = z.output<typeof SweConfig>;
