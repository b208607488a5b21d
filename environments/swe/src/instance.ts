import { existsSync, realpathSync, statSync, type Stats } from 'node:fs';
import { isAbsolute, join, normalize, relative, resolve, sep } from 'node:path';
import { invalidInputError } from '@rollserve/core';
import type { SandboxBind, SandboxSpec } from '@rollserve/core/sandbox';
import type { SweConfig, SweRow } from './schema.ts';
import { GIT_ENV } from './scripts.ts';
import { datasetImage, lookupMultilingualSpec, lookupSweBenchSpec, lookupSweGymSpec, lookupSweSmithSpec, testFilesOfPatch, type DatasetSpec } from './specs/index.ts';
import { getTestParser, pytestParser, testCommandLine, type TestParser } from './test-parsers.ts';

/** A row and the config resolved into what seeding and evaluation need. */
export interface SweInstance {
  instanceId: string;
  baseCommit: string;
  /** The sandbox image, when there is one. */
  image?: string;
  /** Whether `image` is the row's (so under images_root, checked again at use). */
  imageFromRow: boolean;
  /** Real host path of the git repository copied in (bwrap, local), under repos_root. */
  repoPath?: string;
  /** The repository inside the sandbox. */
  repoDir: string;
  workdir: string;
  setupScript?: string;
  /** The test command template (row, config, the dataset's spec, or the parser's default). */
  testCommand: string;
  /** Where the command came from: the row, the config, a dataset's harness, or the parser's default. */
  testCommandFrom: 'row' | 'config' | 'swe-bench' | DatasetSpec['dataset'] | 'default';
  /** A script (SWE-bench Multilingual's build and test commands) run under `set -x`, never given targets. */
  testScript: boolean;
  parserName: string;
  parser: TestParser;
  /** What the command runs: SWE-bench's directives from test_patch, else the parser's targets of the ids. */
  testTargets: string[];
  /** Variables of the test run: SWE-bench's eval_commands exports (Django's locale) under the config's and row's. */
  testEnv: Record<string, string>;
  /** The row's own environment variables (over the config's), in both sandboxes. */
  env: Record<string, string>;
  binds: SandboxBind[];
  verifyFrom: 'sandbox' | 'response';
  failToPass: string[];
  passToPass: string[];
  testPatch: string;
  goldPatch: string;
  /** The gold patch is the bug, its reverse the fix (SWE-smith's). */
  goldReversed: boolean;
  /**
   * Where the image's repository is put before seeding (SWE-smith's: base_commit, the bug's commit,
   * else, when the image lacks that commit, the bug `patch` applied to what it has).
   */
  checkout?: { commit: string; patch: string };
}

/**
 * Where the SWE environment keeps what rows may name when the config gives no root:
 * `$ROLLSERVE_DATA_DIR`, else `.rollserve` in the service's working directory (beside the default
 * store, `sqlite://.rollserve/store.db`). Repositories go in `repos/`, images in `images/`, bind
 * sources in `binds/`.
 */
export function sweDataDir(): string {
  const fromEnv = process.env.ROLLSERVE_DATA_DIR;
  return resolve(fromEnv !== undefined && fromEnv !== '' ? fromEnv : '.rollserve');
}

/** The roots a row's paths must lie in (the operator's config, else under sweDataDir()). */
export function rowRoots(config: SweConfig): { repos: string; images: string; binds: string } {
  const data = sweDataDir();
  return {
    repos: resolve(config.repos_root ?? join(data, 'repos')),
    images: resolve(config.images_root ?? join(data, 'images')),
    binds: resolve(config.binds_root ?? join(data, 'binds')),
  };
}

const within = (root: string, path: string): boolean => {
  const inside = relative(root, path);
  return inside === '' || (inside !== '..' && !inside.startsWith(`..${sep}`) && !isAbsolute(inside));
};

type RootName = 'repos_root' | 'images_root' | 'binds_root';

/**
 * A path a row gives, resolved as the host will use it: relative to `root`, symlinks and `..`
 * followed (realpath), and refused (a 422 at `loc`) unless it lies under the root's own realpath
 * and is a directory or a regular file (`want`). Returns the real path, which is what is used.
 */
function rowPath(root: string, rootName: RootName, given: string, loc: Array<string | number>, want: 'dir' | 'file' | 'dir-or-file'): string {
  const field = loc.join('.');
  const refuse = (why: string): never => {
    throw invalidInputError(loc, `${field} ${JSON.stringify(given)} ${why}`, given);
  };
  if (given.includes('\0')) refuse('holds a NUL byte');
  let realRoot: string;
  try {
    realRoot = realpathSync(root);
  } catch {
    return refuse(`is refused: ${rootName} (${root}) does not exist on this host; rows may only name paths under it`);
  }
  const path = isAbsolute(given) ? normalize(given) : resolve(root, given);
  let real: string;
  try {
    real = realpathSync(path);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // an escape is named as one even when its target is missing or unreadable
    if (!within(root, path) && !within(realRoot, path)) refuse(`is outside ${rootName} (${root})`);
    return refuse(code === 'ENOENT' || code === 'ENOTDIR' ? 'does not exist' : `cannot be read (${code ?? 'error'})`);
  }
  if (!within(realRoot, real)) refuse(`is outside ${rootName} (${root})${real !== path ? `: it resolves to ${real}` : ''}`);
  let stat: Stats;
  try {
    stat = statSync(real);
  } catch (error) {
    return refuse(`cannot be read (${(error as NodeJS.ErrnoException).code ?? 'error'})`);
  }
  const kind = stat.isDirectory() ? 'dir' : stat.isFile() ? 'file' : undefined;
  if (kind === undefined) refuse('is neither a directory nor a regular file (sockets, devices and fifos are refused)');
  if (want !== 'dir-or-file' && kind !== want) refuse(want === 'dir' ? 'is not a directory' : 'is not a regular file');
  return real;
}

/** Registry references name no host resource: Apptainer pulls them (bwrap refuses them: no network). */
const REMOTE_IMAGE = /^(docker|library|oras|shub):\/\//i;
const IMAGE_TRANSPORT = /^(oci|docker-archive|oci-archive|sif|squashfs):/;
/** A bare registry name (`[host[:port]/]path[:tag][@digest]`), as Docker and NeMo Gym's swebench take it. */
const REGISTRY_NAME = /^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?::\d+)?(?:\/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$/;
/** What reads as a path, never as a registry name (Apptainer's rule, and image files by their suffix). */
const PATH_LIKE = /^(\/|\.\/|\.\.\/)|\.(sif|sqfs|squashfs|img|tar)$/i;

/**
 * An image a row names, in the form the provider then uses: a registry reference as it is (a bare
 * registry name as `docker://<name>`, so that no provider reads it as a path of its working
 * directory), else its file or directory resolved under images_root (see rowPath), the transport
 * and tag kept. A bare name is a path when it reads as one or names something under images_root.
 */
function rowImage(given: string, images: string, loc: Array<string | number>): string {
  if (REMOTE_IMAGE.test(given)) return given;
  if (!IMAGE_TRANSPORT.test(given) && !PATH_LIKE.test(given) && REGISTRY_NAME.test(given) && !existsSync(join(images, given))) return `docker://${given}`;
  const transport = IMAGE_TRANSPORT.exec(given)?.[1];
  let rest = transport === undefined ? given : given.slice(transport.length + 1);
  let tag = '';
  if (transport === 'oci') {
    // oci:<dir>[:<tag>]: a tag has no "/" (skopeo's rule)
    const last = rest.lastIndexOf(':');
    if (last > 0 && rest.slice(last + 1) !== '' && !rest.slice(last + 1).includes('/')) {
      tag = rest.slice(last);
      rest = rest.slice(0, last);
    }
  }
  if (transport === undefined && given.includes(':')) {
    throw invalidInputError(loc, `${loc.join('.')} ${JSON.stringify(given)}: unknown image transport (a row may name oci:, docker-archive:, oci-archive:, sif:, squashfs:, a path under images_root, or a docker:// / library:// / oras:// / shub:// reference)`, given);
  }
  if (rest === '') throw invalidInputError(loc, `${loc.join('.')} ${JSON.stringify(given)}: no path`, given);
  const want = transport === undefined ? 'dir-or-file' : transport === 'oci' ? 'dir' : 'file';
  const path = rowPath(images, 'images_root', rest, loc, want);
  return transport === undefined ? path : `${transport}:${path}${tag}`;
}

/** Sandbox paths a bind may not cover: the sandbox's own mounts and the service's channels. */
const RESERVED_SANDBOX_DIRS = ['/proc', '/dev', '/sys', '/run'];

/**
 * Checks again, at use, what resolveInstance resolved when the row was accepted: the paths still
 * resolve to themselves under their roots (a symlink swapped in since is refused), with the same
 * 422 as then. Called before each sandbox is made and before the repository is read.
 */
export function recheckInstance(instance: SweInstance, config: SweConfig): void {
  const roots = rowRoots(config);
  const same = (real: string, loc: Array<string | number>, check: () => string): void => {
    const again = check();
    if (again !== real) throw invalidInputError(loc, `${loc.join('.')} changed since the row was accepted: ${real} now resolves to ${again}`, real);
  };
  if (instance.repoPath !== undefined) same(instance.repoPath, ['repo_path'], () => rowPath(roots.repos, 'repos_root', instance.repoPath!, ['repo_path'], 'dir'));
  if (instance.image !== undefined && instance.imageFromRow) same(instance.image, ['image'], () => rowImage(instance.image!, roots.images, ['image']));
  instance.binds.forEach((bind, i) => same(bind.host, ['binds', i, 'host'], () => rowPath(roots.binds, 'binds_root', bind.host, ['binds', i, 'host'], 'dir-or-file')));
}

/** Instance ids put into image templates: a name, never a path. */
const TEMPLATE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

export function resolveInstance(row: SweRow, config: SweConfig): SweInstance {
  const roots = rowRoots(config);
  // The row's image (or image_template) is a row's path: under images_root. The config's are the
  // operator's, but the instance id filled into its template is the row's: a name, not a path.
  const template = row.image_template ?? (row.image_name === undefined ? config.image_template : undefined);
  if (row.image === undefined && template !== undefined && template.includes('{instance_') && !TEMPLATE_ID.test(row.instance_id)) {
    throw invalidInputError(['instance_id'], `instance_id ${JSON.stringify(row.instance_id)} cannot name an image: it may hold only letters, digits, ".", "_" and "-"`, row.instance_id);
  }
  let image: string | undefined;
  let imageFromRow = false;
  if (row.image !== undefined) {
    image = rowImage(row.image, roots.images, ['image']);
    imageFromRow = true;
  } else if (row.image_template !== undefined) {
    image = rowImage(imageFromTemplate(row.image_template, row.instance_id, datasetImage(row))!, roots.images, ['image_template']);
    imageFromRow = true;
  } else if (row.image_name !== undefined) {
    image = rowImage(row.image_name, roots.images, ['image_name']);
    imageFromRow = true;
  } else image = imageFromTemplate(config.image_template, row.instance_id, datasetImage(row)) ?? config.image;
  const repoPath = row.repo_path === undefined ? undefined : rowPath(roots.repos, 'repos_root', row.repo_path, ['repo_path'], 'dir');
  if (repoPath === undefined && image === undefined) {
    throw invalidInputError([], `instance ${row.instance_id}: a row needs repo_path (a host repository) or an image holding the repository`, null);
  }
  if (row.base_commit.startsWith('-')) throw invalidInputError(['base_commit'], `invalid base_commit ${JSON.stringify(row.base_commit)}`, row.base_commit);
  const binds = (row.binds ?? []).map((bind, i): SandboxBind => {
    if (!bind.read_only && !config.row_writable_binds) {
      throw invalidInputError(['binds', i, 'read_only'], `binds.${i}: a row's bind is read-only unless the config sets row_writable_binds`, bind.read_only);
    }
    const target = normalize(bind.sandbox);
    if (target === '/' || RESERVED_SANDBOX_DIRS.some((dir) => within(dir, target))) {
      throw invalidInputError(['binds', i, 'sandbox'], `binds.${i}.sandbox ${JSON.stringify(bind.sandbox)} may not cover / or ${RESERVED_SANDBOX_DIRS.join(', ')}`, bind.sandbox);
    }
    return { host: rowPath(roots.binds, 'binds_root', bind.host, ['binds', i, 'host'], 'dir-or-file'), sandbox: target, readOnly: bind.read_only };
  });

  // Row, then config, then the spec of the row's dataset (SWE-smith's when it names image_name,
  // SWE-bench's, SWE-Gym's or Multilingual's for its repository and version), then pytest.
  const version = versionKey(row.version);
  const smith = lookupSweSmithSpec(row, row.FAIL_TO_PASS);
  const spec = smith === undefined ? lookupSweBenchSpec(row.repo, row.version) : undefined;
  const other = smith ?? (spec === undefined ? (lookupSweGymSpec(row.repo, version, row.test_patch) ?? lookupMultilingualSpec(row.repo, version)) : undefined);
  const parserName = row.test_parser ?? config.test_parser ?? spec?.parser ?? other?.parser ?? 'pytest';
  const parser = getTestParser(parserName);
  if (parser === undefined) {
    // only a dataset's parser can be missing (the row's and config's names were checked by the schemas)
    throw invalidInputError(['repo'], `${other?.dataset ?? 'the dataset'}'s log parser of ${row.repo ?? 'this repository'} (${parserName}) is not built in: give the row (or the config) a test_parser`, row.repo ?? null);
  }
  const [testCommand, testCommandFrom] =
    row.test_command !== undefined
      ? [row.test_command, 'row' as const]
      : config.test_command !== undefined
        ? [config.test_command, 'config' as const]
        : spec !== undefined
          ? [spec.testCommand, 'swe-bench' as const]
          : other !== undefined
            ? [other.testCommand, other.dataset]
            : [parser.defaultCommand, 'default' as const];
  const ids = [...row.FAIL_TO_PASS, ...row.PASS_TO_PASS];
  const files = testFilesOfPatch(row.test_patch);
  const ownTargets = testCommandFrom === other?.dataset ? other.targets : undefined;
  const testTargets =
    ownTargets === 'none'
      ? []
      : ownTargets === 'fail-to-pass-files'
        ? [...new Set(row.FAIL_TO_PASS.map((id) => id.split('::')[0]!))]
        : files.length > 0
          ? (parser.directives?.(files) ?? files)
          : parser.targets(ids);
  const isSmith = smith !== undefined;
  const setupScript = row.setup_script ?? config.setup_script;
  return {
    instanceId: row.instance_id,
    baseCommit: row.base_commit,
    ...(image === undefined ? {} : { image }),
    imageFromRow,
    ...(repoPath === undefined ? {} : { repoPath }),
    repoDir: row.repo_dir ?? config.repo_dir ?? (repoPath !== undefined ? config.workdir : '/testbed'),
    workdir: config.workdir,
    ...(setupScript === undefined ? {} : { setupScript }),
    testCommand,
    testCommandFrom,
    testScript: testCommandFrom === other?.dataset && other.script,
    parserName,
    parser,
    testTargets,
    testEnv: { ...spec?.env, ...config.env, ...row.env },
    env: row.env ?? {},
    binds,
    verifyFrom: row.verify_from ?? config.verify_from,
    failToPass: row.FAIL_TO_PASS,
    passToPass: row.PASS_TO_PASS,
    testPatch: row.test_patch,
    goldPatch: row.patch ?? '',
    goldReversed: isSmith,
    ...(isSmith && image !== undefined && repoPath === undefined ? { checkout: { commit: row.base_commit, patch: row.patch ?? '' } } : {}),
  };
}

/** A version as SWE-bench's tables key it (a JSON number 3.0, read as 3, is "3.0"). */
const versionKey = (version: string | number | undefined): string | undefined =>
  typeof version === 'number' ? (Number.isInteger(version) ? version.toFixed(1) : String(version)) : version;

/**
 * The full test command line of an instance; a script (Multilingual's) runs in a subshell under
 * `set -ux`, as SWE-bench's eval script (its trace is part of the output some parsers read).
 */
export function instanceTestCommand(instance: SweInstance): string {
  if (instance.testScript) return `(\nset -ux\n${instance.testCommand}\n)`;
  return testCommandLine(instance.testCommand, instance.testTargets);
}

/**
 * An image template filled in: SWE-bench names its images after the instance id in lower case
 * with `__` spelled `_1776_` (`{instance_id_1776}`), SWE-Gym with `_s_` (`{instance_id_s}`);
 * `{instance_image}` is the row's own dataset's name for it (see datasetImage).
 */
export function imageFromTemplate(template: string | undefined, instanceId: string, instanceImage?: string): string | undefined {
  if (template === undefined) return undefined;
  return template
    .replaceAll('{instance_id_1776}', instanceId.replaceAll('__', '_1776_').toLowerCase())
    .replaceAll('{instance_id_s}', instanceId.replaceAll('__', '_s_').toLowerCase())
    .replaceAll('{instance_image}', instanceImage ?? `swebench/sweb.eval.x86_64.${instanceId.replaceAll('__', '_1776_').toLowerCase()}:latest`)
    .replaceAll('{instance_id}', instanceId);
}

/** The sandbox an instance runs in (the agent's and the eval one alike): the row's env and binds included. */
export function sandboxSpec(instance: SweInstance, config: SweConfig): SandboxSpec {
  recheckInstance(instance, config);
  return {
    ...(instance.image === undefined ? {} : { image: instance.image }),
    workdir: instance.workdir,
    network: config.network,
    env: { PYTHONDONTWRITEBYTECODE: '1', ...GIT_ENV, ...config.env, ...instance.env },
    ...(instance.binds.length === 0 ? {} : { binds: instance.binds.map((b) => ({ ...b })) }),
    ...(config.resources === undefined ? {} : { resources: stripUndefined(config.resources) }),
  };
}

function stripUndefined<T extends object>(value: T): { [K in keyof T]: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as never;
}
