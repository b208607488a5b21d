import { OpenAPIHono } from '@hono/zod-openapi';
import { z } from 'zod';
import { RolloutError } from '../../errors.ts';
import { PolicySpec, RolloutLimits, SamplingParams } from '../types.ts';
import type { ApiContext } from './context.ts';
import { body, parse } from './parse.ts';

export const ProcessRequest = z.object({
  /** The task instance: a dataset row in NeMo Gym form, naming its environment in `env`. */
  instance: z.looseObject({ env: z.string().optional(), responses_create_params: z.looseObject({ input: z.unknown() }) }),
  sampling_params: SamplingParams.extend({ model: z.string().optional() }).default({}),
  job_id: z.string().optional(),
  base_url: z.url().optional(),
  limits: RolloutLimits.partial().optional(),
});

/** ProRL Agent's server API (`/process` and the rest). */
export function prorlApi({ service, options }: ApiContext): OpenAPIHono {
  const app = new OpenAPIHono();
  // ProRL Agent-shaped blocking call: one instance in, its finished result out.
  app.post('/process', async (c) => {
    const request = parse(ProcessRequest, await body(c));
    const { env: envName, ...row } = request.instance;
    const env = envName ?? (service.environments.length === 1 ? service.environments[0] : undefined);
    if (!env) throw new RolloutError({ code: 'UNPROCESSABLE', message: `instance.env is required (served: ${service.environments.join(', ')})` });
    const { model, ...sampling } = request.sampling_params;
    const modelName = model ?? options.defaultModel;
    if (!modelName) throw new RolloutError({ code: 'UNPROCESSABLE', message: 'sampling_params.model is required' });
    const policy = parse(PolicySpec, { model: modelName, sampling, ...(request.base_url ? { base_url: request.base_url } : {}) });
    const [submitted] = await service.submit([
      {
        ...(request.job_id ? { id: request.job_id } : {}),
        env,
        row: row as never,
        policy,
        ...(request.limits ? { limits: RolloutLimits.parse(request.limits) } : {}),
      },
    ]);
    return c.json(await service.wait(submitted!.rolloutIds[0]!));
  });
  return app;
}
