import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The monorepo root (holding pnpm-workspace.yaml). */
export function workspaceRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'pnpm-workspace.yaml'))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error('not inside the rollserve workspace');
    dir = parent;
  }
  return dir;
}

/**
 * The NeMo Gym fixtures folder: `ROLLSERVE_FIXTURES`, or `shared/fixtures/nemo-gym` beside the
 * checkout (where CI puts it).
 */
export function nemoGymFixturesDir(): string {
  const dir = process.env.ROLLSERVE_FIXTURES ?? resolve(workspaceRoot(), '..', 'shared', 'fixtures', 'nemo-gym');
  if (!existsSync(dir)) throw new Error(`NeMo Gym fixtures not found at ${dir} (set ROLLSERVE_FIXTURES)`);
  return dir;
}

export function readJsonl<T = Record<string, unknown>>(file: string): T[] {
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as T);
}

/** A fixture file of one NeMo Gym server, e.g. `nemoGymFixture('mcqa', 'example_rollouts.jsonl')`. */
export function nemoGymFixture(server: string, file: string): string {
  return join(nemoGymFixturesDir(), server, file);
}

/** What NeMo Gym's own Python server answers for a fixture's rollouts (python_reference.json). */
export interface PythonReference {
  rows: Array<{
    recorded_rollout_index: number;
    recorded_reward: number;
    reward: number;
    extras: Record<string, unknown>;
    tool_outputs: string[];
  }>;
  aggregate_metrics: {
    group_level_metrics: Array<Record<string, unknown>>;
    agent_metrics: Record<string, unknown>;
    key_metrics: Record<string, unknown>;
  };
}

export function pythonReference(server: string): PythonReference {
  return JSON.parse(readFileSync(nemoGymFixture(server, 'python_reference.json'), 'utf8')) as PythonReference;
}

/**
 * python_reference.json shows long strings as `sha256:<first 16 hex>:<length>`. Returns the
 * reference extras with each such value replaced by the candidate string it stands for.
 */
export function unhashReference(extras: Record<string, unknown>, candidates: readonly string[]): Record<string, unknown> {
  const hashed = /^sha256:([0-9a-f]{16}):(\d+)$/;
  return Object.fromEntries(
    Object.entries(extras).map(([key, value]) => {
      const match = typeof value === 'string' ? hashed.exec(value) : null;
      if (!match) return [key, value];
      const found = candidates.find(
        (c) => c.length === Number(match[2]) && createHash('sha256').update(c).digest('hex').startsWith(match[1]!),
      );
      if (found === undefined) throw new Error(`no candidate matches ${key}=${String(value)}`);
      return [key, found];
    }),
  );
}

/** A dataset row, its recorded rollout and what NeMo Gym's Python server answers for it today. */
export interface ReferenceCase {
  /** The row of example.jsonl, with the rollout's materialised responses_create_params. */
  row: Record<string, unknown>;
  /** The recorded rollout (example_rollouts.jsonl): its `response` and recorded reward/extras. */
  recorded: Record<string, unknown>;
  reference: PythonReference['rows'][number];
}

function inputTexts(params: unknown): string {
  const input = (params as { input?: unknown } | undefined)?.input;
  if (typeof input === 'string') return input;
  return JSON.stringify((input as Array<{ content?: unknown }> | undefined)?.map((item) => item.content));
}

/**
 * python_reference.json's rows pair example.jsonl row i with the rollout at
 * `recorded_rollout_index` (the rollouts are in another order). Throws if a pair's prompts differ.
 */
export function referenceCases(server: string, files = { rows: 'example.jsonl', rollouts: 'example_rollouts.jsonl' }): ReferenceCase[] {
  const rows = readJsonl(nemoGymFixture(server, files.rows));
  const rollouts = readJsonl(nemoGymFixture(server, files.rollouts));
  return pythonReference(server).rows.map((reference, i) => {
    const row = rows[i];
    const recorded = rollouts[reference.recorded_rollout_index];
    if (!row || !recorded || inputTexts(row.responses_create_params) !== inputTexts(recorded.responses_create_params)) {
      throw new Error(`${server}: reference row ${i} does not pair with rollout ${reference.recorded_rollout_index}`);
    }
    return { row: { ...row, responses_create_params: recorded.responses_create_params }, recorded, reference };
  });
}

/** Which of these commands the host lacks (`command -v`): suites that need them skip, naming them. */
export function missingCommands(commands: readonly string[]): string[] {
  return commands.filter((command) => {
    try {
      execFileSync('sh', ['-c', `command -v ${command}`], { stdio: 'ignore' });
      return false;
    } catch {
      return true;
    }
  });
}
