import { resolve } from 'node:path';
import { defineCommand } from 'citty';
import { pino } from 'pino';
import { RolloutError } from '@rollserve/core';
import { loadEnvironment } from '@rollserve/core/gym';
import { LlmBackendPool, PoolModelProvider, RolloutService } from '@rollserve/core/service';
import { collectRollouts, sidecarPaths, type CollectSummary } from '../collect.ts';
import { listInstalledEnvironments, resolveEnvironments } from '../discover.ts';
import { listFlag, numberFlag } from '../flags.ts';
import { httpRunner, inProcessRunner } from '../rollout-runner.ts';
import { sweepStaleSandboxes } from '../sweep.ts';

function generationFlag(value: string): 'chat' | 'tokens' {
  if (value === 'chat' || value === 'tokens') return value;
  throw new RolloutError({ code: 'BAD_REQUEST', message: `--generation is 'chat' or 'tokens', not "${value}"` });
}

export default defineCommand({
  meta: { name: 'rollout', description: 'Collect rollouts for a JSONL of rows (like ng_collect_rollouts): results as they finish, failures, aggregate metrics' },
  args: {
    env: { type: 'string', description: 'Environment name', required: true },
    input: { type: 'string', description: 'Rows (JSONL)', required: true },
    output: { type: 'string', description: 'Results (JSONL, appended as they finish); <stem>_failures.jsonl and <stem>_aggregate_metrics.json go beside it', required: true },
    model: { type: 'string', description: 'Served model name, as the inference servers name it', required: true },
    policy: { type: 'string', description: 'Policy inference servers (OpenAI base URLs, comma-separated); with --service, one base URL for every task (default: the service\'s backends)' },
    service: { type: 'string', description: 'A running rollout service (http://host:8100) to submit to, instead of one in this process' },
    token: { type: 'string', description: 'Bearer token of --service (also ROLLSERVE_TOKEN)' },
    limit: { type: 'string', description: 'Only the first N rows' },
    concurrency: { type: 'string', description: 'Rollouts in flight at once (default: all)' },
    n: { type: 'string', description: 'Samples per row', default: '1' },
    temperature: { type: 'string', description: 'Sampling temperature' },
    'top-p': { type: 'string', description: 'Nucleus sampling top_p' },
    'max-tokens': { type: 'string', description: 'Generation limit per turn' },
    generation: { type: 'string', description: "How the policy is called: 'chat' (/v1/chat/completions) or 'tokens' (token-id prompts on /v1/completions, vLLM: no re-tokenisation drift)", default: 'chat' },
    'max-turns': { type: 'string', description: 'Model calls per rollout', default: '16' },
    'time-limit': { type: 'string', description: 'Stage seconds per rollout', default: '600' },
  },
  async run({ args }) {
    const policies = listFlag(args.policy);
    if (args.service === undefined && policies.length === 0) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: '--policy is required without --service: the policy inference servers (OpenAI base URLs, comma-separated)' });
    }
    if (args.service !== undefined && policies.length > 1) {
      throw new RolloutError({ code: 'BAD_REQUEST', message: 'with --service, --policy takes one base URL (add more backends to the service: POST /v1/llm-backends)' });
    }
    const options = {
      env: args.env,
      input: args.input,
      output: args.output,
      model: args.model,
      generation: generationFlag(args.generation),
      n: numberFlag('n', args.n, { integer: true, min: 1 })!,
      sampling: {
        ...(args.temperature ? { temperature: numberFlag('temperature', args.temperature) } : {}),
        ...(args['top-p'] ? { top_p: numberFlag('top-p', args['top-p']) } : {}),
        ...(args['max-tokens'] ? { max_tokens: numberFlag('max-tokens', args['max-tokens'], { integer: true, min: 1 }) } : {}),
      },
      limits: { max_turns: numberFlag('max-turns', args['max-turns'], { integer: true, min: 1 })!, time_limit_s: numberFlag('time-limit', args['time-limit'])! },
      tty: process.stderr.isTTY === true,
    };
    const limit = numberFlag('limit', args.limit, { integer: true, min: 1 });
    const concurrency = numberFlag('concurrency', args.concurrency, { integer: true, min: 1 });
    const extra = { ...(limit ? { limit } : {}), ...(concurrency ? { concurrency } : {}) };
    let summary: CollectSummary;
    if (args.service !== undefined) {
      // the environment's metric hooks when it is installed here too; NeMo Gym's defaults otherwise
      const installed = listInstalledEnvironments().find((env) => env.name === args.env);
      const hooks = installed ? await loadEnvironment(installed.dir) : undefined;
      const token = (args.token ?? process.env.ROLLSERVE_TOKEN) || undefined;
      summary = await collectRollouts(httpRunner(args.service, token), { ...options, ...extra, ...(hooks ? { metricsHooks: hooks } : {}), ...(policies[0] ? { baseUrl: policies[0] } : {}) });
    } else {
      const [installed] = resolveEnvironments([args.env]);
      const env = await loadEnvironment(installed!.dir);
      await sweepStaleSandboxes();
      const pool = new LlmBackendPool();
      for (const url of policies) pool.add({ baseUrl: url });
      const models = new PoolModelProvider(pool);
      // failures are summed up at the end; the service's own log goes to stderr, errors only
      const logger = pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'error' }, pino.destination(2));
      const sidecars = sidecarPaths(args.output);
      const service = await RolloutService.create({ environments: [env], models, logger, store: `sqlite://${resolve(sidecars.store)}`, importJournal: sidecars.journal });
      try {
        summary = await collectRollouts(inProcessRunner(service), { ...options, ...extra, metricsHooks: env });
      } finally {
        await service.close();
        await models.close();
      }
    }
    const paths = sidecarPaths(args.output);
    const mean = summary.meanReward === null ? 'no reward' : `mean reward ${summary.meanReward.toFixed(3)}`;
    console.log(`${summary.total} rollouts: ${summary.done} written to ${args.output} (${mean}), ${summary.failed} failed (${paths.failures}); ${summary.rate.toFixed(1)} rollouts/s`);
    if (summary.failed > 0) {
      for (const { message, count } of summary.errors.slice(0, 3)) console.error(`  ${count} × ${message}`);
      throw new RolloutError({ code: 'UNAVAILABLE', message: `${summary.failed} of ${summary.total} rollouts failed (infrastructure failures, filter: true; see ${paths.failures})` });
    }
  },
});
