// `rollserve-gym <environment package dir>`: the process NeMo Gym starts for an environment (its
// nemo-gym/app.py execs it), as `rollserve nemo-gym` does but without the CLI: an environment's
// install then needs neither the rollout service nor its store drivers, and loads none of them.
import { RolloutError } from '../errors.ts';
import { loadEnvironment } from '../spec/load-environment.ts';
import { launchFromNemoGym } from './launch.ts';

/** ROLLSERVE_MAX_BODY_MIB (as `rollserve nemo-gym --max-body-mib`), in bytes. */
function maxBodyOf(value: string | undefined): { maxBodyBytes?: number } {
  if (value === undefined || value === '') return {};
  const mib = Number(value);
  if (!Number.isFinite(mib) || mib < 1 / 1024) throw new RolloutError({ code: 'BAD_REQUEST', message: `ROLLSERVE_MAX_BODY_MIB takes a number >= ${1 / 1024}, not "${value}"` });
  return { maxBodyBytes: Math.floor(mib * 1024 * 1024) };
}

const [dir, ...rest] = process.argv.slice(2);
if (dir === undefined || dir.startsWith('-') || rest.length > 0) {
  console.error('usage: rollserve-gym <environment package directory>  (NEMO_GYM_CONFIG_DICT, NEMO_GYM_CONFIG_PATH; ROLLSERVE_MAX_BODY_MIB)');
  process.exit(2);
}
try {
  await launchFromNemoGym(await loadEnvironment(dir), process.env, maxBodyOf(process.env.ROLLSERVE_MAX_BODY_MIB));
} catch (error) {
  if (process.env.ROLLSERVE_DEBUG === '1') console.error(error);
  console.error(`rollserve-gym: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
