import { isAbsolute, relative, resolve } from 'node:path';
import { invalidInputError, type SandboxBind, type SandboxSpec } from '@rollserve/core';
import type { SweConfig, SweRow } from './schema.ts';
import { GIT_ENV } from './scripts.ts';
import { lookupSweBenchSpec, testFilesOfPatch } from './specs/index.ts';
import { getTestParser, pytestParser, testCommandLine, type TestParser } from './test-parsers.ts';

/** A row and the config resolved into what seeding and evaluation need. */
export interface SweInstance {
  instanceId: string;
  baseCommit: string;
  /** The sandbox image, when there is one. */
  image?: string;
  /** Absolute host path of the git repository copied in (bwrap, local). */
  repoPath?: string;
  /** The repository inside the sandbox. */
  repoDir: string;
  workdir: string;
  setupScript?: string;
  /** The test command template (row, config, SWE-bench's spec, or the parser's default). */
  testCommand: string;
  /** Where the command came from. */
  testCommandFrom: 'row' | 'config' | 'swe-bench' | 'default';
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
}

const within = (root: string, path: string): boolean => {
  const inside = relative(resolve(root), path);
  return !inside.startsWith('..') && !isAbsolute(inside);
};

export function resolveInstance(row: SweRow, config: SweConfig): SweInstance {
  const image = row.image ?? imageFromTemplate(row.image_template ?? config.image_template, row.instance_id) ?? config.image;
  let repoPath: string | undefined;
  if (row.repo_path !== undefined) {
    repoPath = config.repos_root === undefined ? resolve(row.repo_path) : resolve(config.repos_root, row.repo_path);
    if (config.repos_root !== undefined && !within(config.repos_root, repoPath)) {
      throw invalidInputError(['repo_path'], `repo_path ${JSON.stringify(row.repo_path)} is outside repos_root`, row.repo_path);
    }
  }
  if (repoPath === undefined && image === undefined) {
    throw invalidInputError([], `instance ${row.instance_id}: a row needs repo_path (a host repository) or an image holding the repository`, null);
  }
  if (row.base_commit.startsWith('-')) throw invalidInputError(['base_commit'], `invalid base_commit ${JSON.stringify(row.base_commit)}`, row.base_commit);
  const binds = (row.binds ?? []).map((bind, i): SandboxBind => {
    if (config.repos_root !== undefined && !within(config.repos_root, resolve(bind.host))) {
      throw invalidInputError(['binds', i, 'host'], `bind ${JSON.stringify(bind.host)} is outside repos_root`, bind.host);
    }
    return { host: resolve(bind.host), sandbox: bind.sandbox, readOnly: bind.read_only };
  });

  // Row, then config, then SWE-bench's spec of the repository and version, then pytest.
  const spec = lookupSweBenchSpec(row.repo, row.version);
  const parserName = row.test_parser ?? config.test_parser ?? spec?.parser ?? 'pytest';
  const parser = getTestParser(parserName) ?? pytestParser; // names were checked by the schemas
  const [testCommand, testCommandFrom] =
    row.test_command !== undefined
      ? [row.test_command, 'row' as const]
      : config.test_command !== undefined
        ? [config.test_command, 'config' as const]
        : spec !== undefined
          ? [spec.testCommand, 'swe-bench' as const]
          : [parser.defaultCommand, 'default' as const];
  const ids = [...row.FAIL_TO_PASS, ...row.PASS_TO_PASS];
  const files = testFilesOfPatch(row.test_patch);
  const testTargets = files.length > 0 ? (parser.directives?.(files) ?? files) : parser.targets(ids);
  const setupScript = row.setup_script ?? config.setup_script;
  return {
    instanceId: row.instance_id,
    baseCommit: row.base_commit,
    ...(image === undefined ? {} : { image }),
    ...(repoPath === undefined ? {} : { repoPath }),
    repoDir: row.repo_dir ?? config.repo_dir ?? (repoPath !== undefined ? config.workdir : '/testbed'),
    workdir: config.workdir,
    ...(setupScript === undefined ? {} : { setupScript }),
    testCommand,
    testCommandFrom,
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
  };
}

/** The full test command line of an instance. */
export function instanceTestCommand(instance: SweInstance): string {
  return testCommandLine(instance.testCommand, instance.testTargets);
}

/** SWE-bench names its images after the instance id with `__` spelled `_1776_`. */
export function imageFromTemplate(template: string | undefined, instanceId: string): string | undefined {
  if (template === undefined) return undefined;
  return template.replaceAll('{instance_id_1776}', instanceId.replaceAll('__', '_1776_')).replaceAll('{instance_id}', instanceId);
}

/** The sandbox an instance runs in (the agent's and the eval one alike): the row's env and binds included. */
export function sandboxSpec(instance: SweInstance, config: SweConfig): SandboxSpec {
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
