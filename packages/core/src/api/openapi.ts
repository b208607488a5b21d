import type { OpenAPIHono } from '@hono/zod-openapi';

const INFO = {
  title: 'rollserve rollout service',
  version: '0.1.0',
  description:
    'Rollout-as-a-service for RL of multi-turn LLM agents: submit tasks, get trajectories with token ids, logprobs, rewards and per-turn records. ' +
    'Requests and results use snake_case keys. Every route but /health, /openapi.json and /docs takes `Authorization: Bearer <token>` when the service has a token. ' +
    'Every error body is `{"error": {code, message, retryable, details?}}`.',
};

/**
 * The rollout service's OpenAPI 3.1 document, generated from the routes the app declares
 * (`createRoute` + `app.openapi`), so it cannot drift from what the service accepts and answers.
 */
export function rolloutOpenApi(app: OpenAPIHono): Record<string, unknown> {
  app.openAPIRegistry.registerComponent('securitySchemes', 'bearer', { type: 'http', scheme: 'bearer' });
  return app.getOpenAPI31Document({ openapi: '3.1.0', info: INFO, security: [{ bearer: [] }] }) as unknown as Record<string, unknown>;
}
