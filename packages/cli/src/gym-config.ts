import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Environment } from '@rollserve/core';

export interface GymConfigOptions {
  /** Fixed host for every server; omitted: NeMo Gym fills in its default. */
  host?: string;
  /** Port of the first server, the next ones counting up; omitted: NeMo Gym picks free ports. */
  port?: number;
  /** The model server the agents use. @default 'policy_model' */
  modelServer?: string;
}

/**
 * NeMo Gym's YAML (as an object) for the chosen environments: per environment a resources-server
 * instance (entrypoint app.py, domain, description, the config's defaults) and a simple_agent
 * wired to it and to the policy model, with the package's example dataset, so that
 * `gym env start --config <this file> --config <model config>` starts them.
 */
export function nemoGymConfig(
  envs: ReadonlyArray<{ env: Environment<any, any, any>; dir: string }>,
  options: GymConfigOptions = {},
): Record<string, unknown> {
  const config: Record<string, unknown> = {};
  envs.forEach(({ env, dir }, index) => {
    const defaults = env.config ? (env.config.safeParse({}).data as Record<string, unknown> | undefined) ?? {} : {};
    const settings = Object.fromEntries(Object.entries(defaults).filter(([, value]) => value !== undefined));
    config[env.name] = {
      resources_servers: {
        [env.name]: {
          entrypoint: 'app.py',
          domain: env.domain,
          ...(env.description ? { description: env.description } : {}),
          verified: false,
          ...(options.host ? { host: options.host } : {}),
          ...(options.port === undefined ? {} : { port: options.port + index }),
          ...settings,
        },
      },
    };
    const dataset = join(dir, 'data', 'example.jsonl');
    config[`${env.name}_simple_agent`] = {
      responses_api_agents: {
        simple_agent: {
          entrypoint: 'app.py',
          resources_server: { type: 'resources_servers', name: env.name },
          model_server: { type: 'responses_api_models', name: options.modelServer ?? 'policy_model' },
          ...(existsSync(dataset) ? { datasets: [{ name: 'example', type: 'example', jsonl_fpath: dataset }] } : {}),
        },
      },
    };
  });
  return config;
}
