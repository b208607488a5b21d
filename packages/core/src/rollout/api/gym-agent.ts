import { OpenAPIHono } from '@hono/zod-openapi';
import type { ApiContext } from './context.ts';

/** The rollout service as a NeMo Gym responses_api_agents server (POST /run, /aggregate_metrics). */
export function gymAgentApi(_ctx: ApiContext): OpenAPIHono {
  return new OpenAPIHono();
}
