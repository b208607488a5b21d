import { defineCommand } from 'citty';
import { pino } from 'pino';
import { RolloutError } from '@rollserve/core';
import { exitOnSignals } from '@rollserve/core/gym';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { DEMO_MODEL, prepareDemo, resultLine, summaryTable } from '../demo.ts';
import { listInstalledEnvironments } from '../discover.ts';
import { hostArg, numberFlag, serveAccess, tokenArgs } from '../flags.ts';
import { sweepStaleSandboxes } from '../sweep.ts';

export default defineCommand({
  meta: { name: 'demo', description: 'A first run without a GPU: the rollout service with a scripted policy that answers every environment\'s example rows' },
  args: {
    host: hostArg,
    port: { type: 'string', description: 'Port of the rollout service (0: any free port)', default: '8100' },
    serve: { type: 'boolean', description: 'Keep serving after the demo rollouts (try the README\'s curl examples), until Ctrl-C', default: false },
    ...tokenArgs,
  },
  async run({ args }) {
    const access = serveAccess(args);
    const installed = listInstalledEnvironments();
    if (installed.length === 0) throw new Error('no environments installed');
    await sweepStaleSandboxes();
    const prepared = await prepareDemo(installed, '127.0.0.1');
    let server: RolloutServer | undefined;
    const close = async () => {
      await server?.close();
      await prepared.close();
    };
    try {
      const logger = pino({ name: 'rollserve', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'error' }, pino.destination(2));
      server = await startRolloutServer({
        environments: prepared.environments,
        environmentConfigs: prepared.environmentConfigs,
        host: access.host,
        port: numberFlag('port', args.port, { integer: true })!,
        llmBackends: [prepared.policyUrl],
        defaultModel: DEMO_MODEL,
        allowNoToken: access.allowNoToken,
        logger,
        ...(access.token ? { token: access.token } : {}),
      });
      console.log(`${'policy'.padEnd(8)} ${prepared.policyUrl}   (scripted: answers the example rows; model "${DEMO_MODEL}")`);
      console.log(`${'service'.padEnd(8)} ${server.url}   (rollout service: POST /v1/rollouts, GET /v1/status)`);
      if (prepared.skipped.length > 0) console.log(`no scripted answers for ${prepared.skipped.join(', ')}: skipped`);
      const service = server.service;
      await service.submit(prepared.cases.map((c) => c.task));
      const results = await Promise.all(
        prepared.cases.map(async ({ task }) => {
          const result = await service.wait(task.id);
          console.log(resultLine(result));
          return result;
        }),
      );
      const { lines, failed } = summaryTable(results);
      console.log('');
      for (const line of lines) console.log(line);
      const envs = new Set(results.map((r) => r.env)).size;
      console.log(`${results.length} rollouts of ${envs} environments: ${failed === 0 ? 'all done' : `${failed} failed`}`);
      if (failed > 0) throw new RolloutError({ code: 'UNAVAILABLE', message: `${failed} of ${results.length} demo rollouts failed (see above)` });
      if (args.serve) {
        console.log(`serving ${server.url} until Ctrl-C; try the README's curl examples (model "${DEMO_MODEL}")`);
        exitOnSignals(close);
        return;
      }
    } catch (error) {
      await close();
      throw error;
    }
    await close();
  },
});
