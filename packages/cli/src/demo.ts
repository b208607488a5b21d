import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { RolloutError, type Environment } from '@rollserve/core';
import type { RolloutResult, RolloutTaskInput } from '@rollserve/core/service';
import type { InstalledEnvironment } from './discover.ts';
import { loadEnvironment } from '@rollserve/core/gym';
import { findWorkspaceRoot } from './discover.ts';

// `rollserve demo`: the rollout service with a scripted policy (packages/testing's fake
// OpenAI-compatible server) that knows the answers to the environments' example rows, so a first
// run shows rollouts of every environment end to end without a GPU.

/** The model name the scripted policy serves (name it in requests: `"policy": {"model": "scripted-policy"}`). */
export const DEMO_MODEL = 'scripted-policy';

/** What the demo needs of @rollserve/testing (core cannot depend on it: it depends on core). */
type Reply = string | { content?: string | null; toolCalls?: Array<{ name: string; arguments: Record<string, unknown> }> };
interface TestingKit {
  startFakePolicy(options: {
    script: (request: { messages: unknown[] }, ctx: { turn: number }) => Reply;
    model?: string;
    host?: string;
  }): Promise<{ url: string; close(): Promise<void> }>;
}

async function loadTestingKit(): Promise<TestingKit> {
  const root = findWorkspaceRoot(dirname(fileURLToPath(import.meta.url)));
  const entry = root && join(root, 'packages', 'testing', 'dist', 'index.js');
  if (!entry || !existsSync(entry)) {
    throw new RolloutError({
      code: 'NOT_FOUND',
      message: 'rollserve demo runs in a checkout of the rollserve repository after `pnpm build`: its scripted policy is packages/testing\'s',
    });
  }
  return (await import(pathToFileURL(entry).href)) as TestingKit;
}

/** The text of a prompt's first user message, from a row's `input` or a chat request's `messages`. */
function firstUserText(input: unknown): string {
  if (typeof input === 'string') return input;
  if (!Array.isArray(input)) return '';
  const user = input.find((m) => (m as { role?: unknown })?.role === 'user') as { content?: unknown } | undefined;
  const content = user?.content;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((part) => String((part as { text?: unknown }).text ?? '')).join('');
  return '';
}

/** How the scripted policy answers one prompt: a reply, or one per turn (a tool-using agent). */
type Answer = (turn: number) => Reply;

interface DemoCase {
  task: RolloutTaskInput & { id: string };
  answer: Answer;
}

function readRows(file: string): Array<Record<string, unknown>> {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

const unwrapLatex = (answer: string) => answer.replace(/^\\\(/, '').replace(/\\\)$/, '').trim();

/** A program that prints each test's expected output for its input: right by construction. */
function lookupProgram(tests: { inputs: string[]; outputs: string[] }): string {
  const cases: Record<string, string> = {};
  tests.inputs.forEach((input, i) => {
    cases[input] = tests.outputs[i] ?? '';
    cases[input.trim()] ??= tests.outputs[i] ?? '';
  });
  return [
    'import json, sys',
    `CASES = json.loads(${JSON.stringify(JSON.stringify(cases))})`,
    'data = sys.stdin.read()',
    "sys.stdout.write(CASES.get(data, CASES.get(data.strip(), '')))",
  ].join('\n');
}

/** Answers for the example rows of math, stem and code (`data/example.jsonl` of each package). */
function exampleCases(env: InstalledEnvironment): DemoCase[] {
  const rows = readRows(join(env.dir, 'data', 'example.jsonl'));
  const answerOf = (row: Record<string, unknown>): Answer | undefined => {
    const expected = typeof row.expected_answer === 'string' ? row.expected_answer : undefined;
    if (env.name === 'math' && expected) return () => `The answer is \\boxed{${unwrapLatex(expected)}}.`;
    if (env.name === 'stem' && expected) return () => `\\boxed{${expected}}`;
    const tests = (row.verifier_metadata as { unit_tests?: { inputs?: string[]; outputs?: string[] } } | undefined)?.unit_tests;
    if (env.name === 'code' && tests?.inputs && tests.outputs) {
      const program = lookupProgram({ inputs: tests.inputs, outputs: tests.outputs });
      return () => `\`\`\`python\n${program}\n\`\`\``;
    }
    return undefined;
  };
  return rows.flatMap((row, i) => {
    const answer = answerOf(row);
    if (!answer) return [];
    return [{ task: { id: `demo-${env.name}-${i}`, env: env.name, row: row as RolloutTaskInput['row'], policy: { model: DEMO_MODEL } }, answer }];
  });
}

const STATS_BUGGY = `def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    s = sorted(xs)
    return s[len(s) // 2]
`;
const MEDIAN_BUG = '    return s[len(s) // 2]\n';
const MEDIAN_FIX = '    mid = len(s) // 2\n    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2\n';
const TESTS = `from calc.stats import mean, median


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_odd():
    assert median([3, 1, 2]) == 2
`;
const TEST_EVEN = `

def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5
`;

/**
 * A SWE-bench-form task on a small git repository built here (the example rows need the
 * SWE-bench images): the policy fixes the bug with str_replace_editor and submits.
 */
function sweCase(root: string): DemoCase {
  const repo = join(root, 'calc');
  const env = { ...process.env, GIT_CONFIG_NOSYSTEM: '1', HOME: root, GIT_AUTHOR_NAME: 'demo', GIT_AUTHOR_EMAIL: 'demo@localhost', GIT_COMMITTER_NAME: 'demo', GIT_COMMITTER_EMAIL: 'demo@localhost' };
  const git = (...args: string[]) => execFileSync('git', args, { cwd: repo, env, encoding: 'utf8' });
  mkdirSync(join(repo, 'calc'), { recursive: true });
  mkdirSync(join(repo, 'tests'));
  writeFileSync(join(repo, 'calc', '__init__.py'), '');
  writeFileSync(join(repo, 'calc', 'stats.py'), STATS_BUGGY);
  writeFileSync(join(repo, 'tests', 'test_stats.py'), TESTS);
  git('init', '-q', '-b', 'main');
  git('add', '-A');
  git('commit', '-q', '-m', 'calc: mean and median');
  const base = git('rev-parse', 'HEAD').trim();
  writeFileSync(join(repo, 'calc', 'stats.py'), STATS_BUGGY.replace(MEDIAN_BUG, MEDIAN_FIX));
  const patch = git('diff');
  writeFileSync(join(repo, 'tests', 'test_stats.py'), TESTS + TEST_EVEN);
  const testPatch = git('diff', '--', 'tests');
  git('checkout', '-q', '--', '.');
  const problem = 'median() returns the upper middle element for lists of even length: median([4, 1, 3, 2]) gives 3, it should give 2.5.';
  const row = {
    repo: 'demo/calc',
    instance_id: 'demo__calc-1',
    base_commit: base,
    patch,
    test_patch: testPatch,
    problem_statement: problem,
    version: '1.0',
    FAIL_TO_PASS: JSON.stringify(['tests/test_stats.py::test_median_even']),
    PASS_TO_PASS: JSON.stringify(['tests/test_stats.py::test_mean', 'tests/test_stats.py::test_median_odd']),
    repo_path: repo,
    responses_create_params: { input: [{ role: 'user', content: `The repository is at /workspace. ${problem}\nFix it with the tools you have, then call submit.` }] },
  };
  const answer: Answer = (turn) =>
    turn === 0
      ? { toolCalls: [{ name: 'str_replace_editor', arguments: { command: 'str_replace', path: '/workspace/calc/stats.py', old_str: MEDIAN_BUG, new_str: MEDIAN_FIX } }] }
      : turn === 1
        ? { toolCalls: [{ name: 'submit', arguments: {} }] }
        : 'Fixed median() for even lengths and submitted.';
  return { task: { id: 'demo-swe-0', env: 'swe', row: row as RolloutTaskInput['row'], policy: { model: DEMO_MODEL } }, answer };
}

export interface Demo {
  /** The scripted policy's OpenAI base URL. */
  policyUrl: string;
  /** The demo tasks, each with how the policy answers it. */
  cases: DemoCase[];
  /** The environments that have demo tasks, loaded. */
  environments: Environment<any, any, any>[];
  /** Installed environments the scripted policy has no answers for. */
  skipped: string[];
  /** The environments' configs: the SWE task's repository is under its `repos_root` (rows name host paths only there). */
  environmentConfigs: Record<string, Record<string, unknown>>;
  /** Stops the scripted policy and removes the demo's repository. */
  close(): Promise<void>;
}

/**
 * Starts the scripted policy and builds the demo tasks for the installed environments. The policy
 * answers the tasks' prompts right, and any other prompt with a sum in it (`What is 3+5?`) with
 * the sum boxed.
 */
export async function prepareDemo(installed: readonly InstalledEnvironment[], host: string): Promise<Demo> {
  const kit = await loadTestingKit();
  const scratch = mkdtempSync(join(tmpdir(), 'rollserve-demo-'));
  // git reads a row's repository as the sandbox user under a root service
  chmodSync(scratch, 0o755);
  try {
    const cases: DemoCase[] = [];
    const skipped: string[] = [];
    const environments: Environment<any, any, any>[] = [];
    for (const env of installed) {
      const found = env.name === 'swe' ? [sweCase(scratch)] : exampleCases(env);
      if (found.length === 0) {
        skipped.push(env.name);
        continue;
      }
      environments.push(await loadEnvironment(env.dir));
      cases.push(...found);
    }
    const answers = new Map(cases.map((c) => [firstUserText(c.task.row.responses_create_params.input), c.answer]));
    const policy = await kit.startFakePolicy({
      model: DEMO_MODEL,
      host,
      script: (request, ctx) => {
        const prompt = firstUserText(request.messages);
        const known = answers.get(prompt);
        if (known) return known(ctx.turn);
        const sum = /(-?\d+)\s*\+\s*(-?\d+)/.exec(prompt);
        return sum ? `${sum[1]} + ${sum[2]} = \\boxed{${Number(sum[1]) + Number(sum[2])}}` : 'I only know the example rows and sums.';
      },
    });
    return {
      policyUrl: policy.url,
      cases,
      environments,
      skipped,
      environmentConfigs: { swe: { repos_root: scratch } },
      close: async () => {
        await policy.close();
        rmSync(scratch, { recursive: true, force: true });
      },
    };
  } catch (error) {
    rmSync(scratch, { recursive: true, force: true });
    throw error;
  }
}

/** One line per finished rollout. */
export function resultLine(result: RolloutResult): string {
  const turns = `${result.turns.length} turn${result.turns.length === 1 ? '' : 's'}`;
  const outcome = result.filter ? `FAILED ${result.critical_error}: ${result.error?.message ?? ''}` : `reward ${result.reward}`;
  return `${result.env.padEnd(6)} ${result.id.padEnd(14)} ${outcome}  (${turns}, ${(result.timing.total_ms / 1000).toFixed(1)} s)`;
}

/** The per-environment table: rollouts done, failed, and mean reward. */
export function summaryTable(results: readonly RolloutResult[]): { lines: string[]; failed: number } {
  const lines = [`${'env'.padEnd(6)} ${'done'.padEnd(6)} ${'failed'.padEnd(6)} mean reward`];
  let failed = 0;
  for (const env of [...new Set(results.map((r) => r.env))]) {
    const mine = results.filter((r) => r.env === env);
    const good = mine.filter((r) => !r.filter);
    failed += mine.length - good.length;
    const mean = good.length === 0 ? '-' : (good.reduce((sum, r) => sum + r.reward, 0) / good.length).toFixed(3);
    lines.push(`${env.padEnd(6)} ${`${good.length}/${mine.length}`.padEnd(6)} ${String(mine.length - good.length).padEnd(6)} ${mean}`);
  }
  return { lines, failed };
}
