import { defineCommand } from 'citty';
import { launchFromNemoGym, loadEnvironment } from '@rollserve/core/gym';
import { bodyArgs, maxBodyOf } from '../flags.ts';

export default defineCommand({
  meta: { name: 'nemo-gym', description: 'Serve one environment package as NeMo Gym launches it (NEMO_GYM_CONFIG_DICT / NEMO_GYM_CONFIG_PATH)' },
  args: {
    dir: { type: 'positional', description: 'The environment package directory', required: true },
    ...bodyArgs,
  },
  async run({ args }) {
    await launchFromNemoGym(await loadEnvironment(args.dir), process.env, maxBodyOf(args['max-body-mib']));
  },
});
