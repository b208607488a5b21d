import { writeFile } from 'node:fs/promises';
import { defineCommand } from 'citty';
import { stringify } from 'yaml';
import { loadEnvironment } from '@rollserve/core/gym';
import { listInstalledEnvironments, resolveEnvironments } from '../discover.ts';
import { nemoGymConfig } from '../gym-config.ts';

export default defineCommand({
  meta: { name: 'gym-config', description: 'Write the NeMo Gym YAML that registers environments (with NEMO_GYM_EXTRA_ROOTS=<repo>/nemo-gym)' },
  args: {
    env: { type: 'positional', description: 'Environment names (default: all installed)', required: false },
    output: { type: 'string', description: 'File to write (default: standard output)' },
    host: { type: 'string', description: 'Fixed host for every server' },
    port: { type: 'string', description: 'Fixed port of the first server; the next ones count up' },
    'model-server': { type: 'string', description: 'The model server instance the agents use', default: 'policy_model' },
  },
  async run({ args }) {
    const installed = args._.length > 0 ? resolveEnvironments(args._) : listInstalledEnvironments();
    const envs = await Promise.all(installed.map(async (found) => ({ env: await loadEnvironment(found.dir), dir: found.dir })));
    const config = nemoGymConfig(envs, {
      ...(args.host ? { host: args.host } : {}),
      ...(args.port ? { port: Number(args.port) } : {}),
      modelServer: args['model-server'],
    });
    const text = `# NeMo Gym config for rollserve environments (rollserve gym-config).\n${stringify(config)}`;
    if (args.output) {
      await writeFile(args.output, text);
      console.error(`wrote ${args.output}: ${envs.map((e) => e.env.name).join(', ')}`);
    } else process.stdout.write(text);
  },
});
