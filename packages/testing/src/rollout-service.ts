import { LlmBackendPool, PoolModelProvider, RolloutService, type RolloutServiceOptions } from '@rollserve/core/service';

export interface TestRolloutService {
  service: RolloutService;
  /** Closes the service, then its LLM backend pool (not the policy servers: the caller owns them). */
  close(): Promise<void>;
}

/**
 * A rollout service whose policy is at `backends` (OpenAI base URLs, e.g. fake policies), with
 * the real LLM client and backend pool.
 *
 * @example
 * const { service, close } = await startTestRolloutService({ environments: [math], backends: [fake.url] });
 */
export async function startTestRolloutService(
  options: Omit<RolloutServiceOptions, 'models'> & { backends: readonly string[] },
): Promise<TestRolloutService> {
  const { backends, ...serviceOptions } = options;
  const pool = new LlmBackendPool();
  backends.forEach((url, i) => pool.add({ id: `b${i}`, baseUrl: url }));
  const models = new PoolModelProvider(pool);
  const service = await RolloutService.create({ ...serviceOptions, models });
  return {
    service,
    close: async () => {
      await service.close();
      await models.close();
    },
  };
}
