import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { open, readFile, rename, writeFile } from 'node:fs/promises';
import cliProgress from 'cli-progress';
import { computeAggregateMetrics, RolloutError, type AggregateMetricsHooks, type VerifyEntry } from '@rollserve/core';
import type { RolloutResult, RolloutTaskInput } from '@rollserve/core/service';
import type { RolloutRunner } from './rollout-runner.ts';

export interface CollectOptions {
  /** The environment's name. */
  env: string;
  /** Its aggregate-metrics hooks, when the environment is installed here. */
  metricsHooks?: AggregateMetricsHooks;
  input: string;
  output: string;
  model: string;
  n: number;
  /** `policy.base_url` of every task (else the service's own backends). */
  baseUrl?: string;
  sampling?: Record<string, unknown>;
  /** `policy.generation`: chat completions (default) or token-id prompts. */
  generation?: 'chat' | 'tokens';
  limits?: RolloutTaskInput['limits'];
  /** Only the first `limit` rows. */
  limit?: number;
  /** Rollouts in flight at once (tasks are submitted as earlier ones finish). @default all at once */
  concurrency?: number;
  /** Draw a progress bar (a terminal) or print a line per finished rollout. */
  tty: boolean;
}

export interface CollectSummary {
  total: number;
  /** Results written to the output (reward-bearing, failed verifications included). */
  done: number;
  /** Infrastructure failures (`filter: true`), written to `<stem>_failures.jsonl`. */
  failed: number;
  /** Mean reward over `done`; null when there is none. */
  meanReward: number | null;
  /** Rollouts finished by this run per second (resumed ones excluded). */
  rate: number;
  /** The distinct error messages of the failures, most frequent first, with their counts. */
  errors: Array<{ message: string; count: number }>;
}

/**
 * Paths beside the output: failures and metrics as NeMo Gym's collector names them; the store of
 * an in-process run (a run again resumes from it); the journal of runs before the store (imported).
 */
export function sidecarPaths(output: string): { failures: string; metrics: string; store: string; journal: string } {
  const stem = output.replace(/\.jsonl$/, '');
  return { failures: `${stem}_failures.jsonl`, metrics: `${stem}_aggregate_metrics.json`, store: `${stem}.store.db`, journal: `${stem}.journal.jsonl` };
}

/** One output line: the row and the verify response as NeMo Gym writes them, plus the result in the wire shape. */
function outputLine(row: Record<string, unknown>, taskIndex: number, result: RolloutResult): Record<string, unknown> {
  const { response, reward, verify_extras, ...rest } = result;
  return { ...row, response, reward, ...verify_extras, _ng_task_index: taskIndex, _ng_rollout_index: result.sample_index, rollserve: rest };
}

async function readRows(path: string): Promise<Array<Record<string, unknown>>> {
  if (!existsSync(path)) throw new RolloutError({ code: 'NOT_FOUND', message: `no input file ${path}` });
  const rows: Array<Record<string, unknown>> = [];
  (await readFile(path, 'utf8')).split('\n').forEach((line, i) => {
    if (line.trim() === '') return;
    try {
      rows.push(JSON.parse(line) as Record<string, unknown>);
    } catch (error) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: `${path}:${i + 1} is not JSON: ${(error as Error).message}` });
    }
  });
  return rows;
}

/** Appends lines to a file as results come, one write at a time (so a crash keeps every finished one). */
async function appender(path: string): Promise<{ append(line: unknown): void; close(): Promise<void> }> {
  const handle = await open(path, 'w');
  let chain: Promise<unknown> = Promise.resolve();
  return {
    append(line) {
      chain = chain.then(() => handle.appendFile(`${JSON.stringify(line)}\n`));
    },
    async close() {
      await chain;
      await handle.close();
    },
  };
}

/** Rewrites a JSONL file sorted by (task, rollout), atomically. */
async function writeSorted(path: string, lines: Array<Record<string, unknown>>): Promise<void> {
  lines.sort((a, b) => (a._ng_task_index as number) - (b._ng_task_index as number) || (a._ng_rollout_index as number) - (b._ng_rollout_index as number));
  await writeFile(`${path}.tmp`, lines.map((l) => `${JSON.stringify(l)}\n`).join(''));
  await rename(`${path}.tmp`, path);
}

/**
 * Runs every row of a JSONL file `n` times, like NeMo Gym's ng_collect_rollouts: each result is
 * appended to `output` (or to `<stem>_failures.jsonl` for infrastructure failures) as it finishes;
 * at the end both are rewritten sorted by (task, rollout) and `/aggregate_metrics` goes to
 * `<stem>_aggregate_metrics.json`. Task ids are the row number and a hash of the task, so the same
 * command again finds what a service (or its store) already has.
 */
export async function collectRollouts(runner: RolloutRunner, options: CollectOptions): Promise<CollectSummary> {
  const rows = (await readRows(options.input)).slice(0, options.limit ?? undefined);
  const tasks = rows.map((row, index): RolloutTaskInput => {
    const task = {
      env: options.env,
      row: row as RolloutTaskInput['row'],
      policy: {
        model: options.model,
        ...(options.baseUrl ? { base_url: options.baseUrl } : {}),
        sampling: options.sampling ?? {},
        ...(options.generation && options.generation !== 'chat' ? { generation: options.generation } : {}),
      },
      n: options.n,
      ...(options.limits ? { limits: options.limits } : {}),
    };
    const hash = createHash('sha256').update(JSON.stringify(task)).digest('hex').slice(0, 10);
    return { id: `task-${index}-${hash}`, ...task };
  });
  const taskIndex = new Map(tasks.map((task, index) => [task.id!, index]));
  const total = tasks.length * options.n;
  const paths = sidecarPaths(options.output);
  const good = await appender(options.output);
  const bad = await appender(paths.failures);
  const goodLines: Array<Record<string, unknown>> = [];
  const badLines: Array<Record<string, unknown>> = [];
  const errors = new Map<string, number>();
  let finished = 0;
  let fresh = 0;
  let rewardSum = 0;
  const started = performance.now();
  const rate = () => fresh / Math.max((performance.now() - started) / 1000, 1e-3);
  const bar = options.tty
    ? new cliProgress.SingleBar({ hideCursor: true, format: ' {bar} {value}/{total} rollouts | {failed} failed | {rate}/s | mean reward {mean}' }, cliProgress.Presets.shades_classic)
    : undefined;
  const mean = () => (goodLines.length === 0 ? null : rewardSum / goodLines.length);
  bar?.start(total, 0, { failed: 0, rate: '0.0', mean: '-' });

  const onResult = (result: RolloutResult, resumed: boolean) => {
    finished++;
    if (!resumed) fresh++;
    const index = taskIndex.get(result.task_id)!;
    const line = outputLine(rows[index]!, index, result);
    if (result.filter) {
      badLines.push(line);
      bad.append(line);
      const message = `${result.critical_error ?? 'failed'}: ${result.error?.message ?? 'no error message'}`;
      errors.set(message, (errors.get(message) ?? 0) + 1);
    } else {
      goodLines.push(line);
      good.append(line);
      rewardSum += result.reward;
    }
    if (bar) bar.update(finished, { failed: badLines.length, rate: rate().toFixed(1), mean: mean()?.toFixed(3) ?? '-' });
    else if (!resumed) {
      const outcome = result.filter ? `FAILED ${result.critical_error}: ${result.error?.message ?? ''}` : `reward=${result.reward}`;
      console.log(`[${finished}/${total}] ${result.id} ${outcome} (${badLines.length} failed, ${rate().toFixed(1)} rollouts/s)`);
    }
  };

  try {
    // Tasks go in as rollouts finish, keeping at most `concurrency` in flight (at least one task).
    const limit = options.concurrency ?? Number.POSITIVE_INFINITY;
    let next = 0;
    let inFlight = 0;
    await new Promise<void>((resolve, reject) => {
      const launch = () => {
        const chunk: RolloutTaskInput[] = [];
        while (next < tasks.length && (inFlight === 0 || inFlight + options.n <= limit)) {
          chunk.push(tasks[next++]!);
          inFlight += options.n;
        }
        if (chunk.length > 0) {
          runner
            .run(chunk, (result, resumed) => {
              inFlight--;
              onResult(result, resumed);
              launch();
            })
            .catch(reject);
        }
        if (finished === total) resolve();
      };
      launch();
    });
  } finally {
    bar?.stop();
    await good.close();
    await bad.close();
  }
  const resumed = finished - fresh;
  if (!options.tty && resumed > 0) console.log(`resumed: ${resumed}/${total} rollouts were already finished`);

  await writeSorted(options.output, goodLines);
  await writeSorted(paths.failures, badLines);
  const entries: VerifyEntry[] = goodLines.map(({ responses_create_params: _p, response, rollserve: _r, ...rest }) => ({
    ...rest,
    response: { usage: (response as { usage?: unknown } | null)?.usage ?? {} },
  }));
  const metrics = computeAggregateMetrics(entries, options.metricsHooks);
  await writeFile(paths.metrics, `${JSON.stringify([{ agent_ref: { name: `${options.env}_rollserve_agent` }, ...metrics }], null, 2)}\n`);
  return {
    total,
    done: goodLines.length,
    failed: badLines.length,
    meanReward: mean(),
    rate: rate(),
    errors: [...errors].map(([message, count]) => ({ message, count })).sort((a, b) => b.count - a.count),
  };
}
