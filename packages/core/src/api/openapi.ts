import type { OpenAPIHono } from '@hono/zod-openapi';

const INFO = {
  title: 'rollserve rollout service',
  version: '0.1.0',
  description:
    'Rollout-as-a-service for RL of multi-turn LLM agents: submit tasks, get trajectories with token ids, logprobs, rewards and per-turn records. ' +
    'Requests and results use snake_case keys. Every route but /health, /openapi.json and /docs takes `Authorization: Bearer <token>` when the service has a token. ' +
    'Every error body is `{"error": {code, message, retryable, details?}}` (the ProRL Agent and NeMo Gym faces answer as their FastAPI servers do).',
};

/** Who each group of routes is for: a generated client can keep only the trainer's. */
const TAGS = [
  { name: 'Rollouts', description: "A trainer's routes: submit tasks, read, list, cancel and stream their results" },
  { name: 'LLM backends', description: "The policy's inference servers, added and removed at run time (a checkpoint swap)" },
  { name: 'Weights', description: "A trainer's routes for asynchronous RL: weight versions announced after a weight sync, pauses of generation for a weight update" },
  { name: 'Service', description: 'Status, metrics, liveness and this document' },
  { name: 'Rollout nodes', description: 'What `rollserve node` calls (with the node token when the service has one); not for trainers' },
  { name: 'ProRL Agent', description: "ProRL Agent Server's API, for ProRL's own clients (FastAPI's error shapes)" },
  { name: 'NeMo Gym agent', description: "A NeMo Gym agent server's /run and /aggregate_metrics, for NeMo Gym's rollout collection (FastAPI's error shapes)" },
] as const;
type Tag = (typeof TAGS)[number]['name'];

/**
 * Every operation's stable name and tag, by `METHOD /path`: what a generated client calls its
 * functions. A route missing here fails the document (and its test), so none goes out unnamed; a
 * name, once published, is kept.
 */
const OPERATIONS: Record<string, [operationId: string, tag: Tag]> = {
  'POST /v1/rollouts': ['submitRollouts', 'Rollouts'],
  'GET /v1/rollouts': ['listRollouts', 'Rollouts'],
  'GET /v1/rollouts/{id}': ['getRollout', 'Rollouts'],
  'DELETE /v1/rollouts/{id}': ['cancelRollout', 'Rollouts'],
  'GET /v1/rollouts/stream': ['streamResults', 'Rollouts'],
  'POST /v1/rollouts/stream': ['streamResultsOf', 'Rollouts'],
  'GET /v1/rollouts/groups/stream': ['streamGroups', 'Rollouts'],
  'POST /v1/rollouts/groups/stream': ['streamGroupsOf', 'Rollouts'],
  'GET /v1/rollouts/sampling/{id}': ['getSampling', 'Rollouts'],
  'DELETE /v1/rollouts/sampling/{id}': ['stopSampling', 'Rollouts'],
  'GET /v1/rollouts/sampling/{id}/stream': ['streamSampledGroups', 'Rollouts'],
  'GET /v1/llm-backends': ['listLlmBackends', 'LLM backends'],
  'POST /v1/llm-backends': ['addLlmBackend', 'LLM backends'],
  'DELETE /v1/llm-backends/{id}': ['removeLlmBackend', 'LLM backends'],
  'GET /v1/weights': ['getWeights', 'Weights'],
  'POST /v1/weights': ['announceWeights', 'Weights'],
  'POST /v1/weights/pause': ['pauseGeneration', 'Weights'],
  'POST /v1/weights/resume': ['resumeGeneration', 'Weights'],
  'GET /v1/status': ['getStatus', 'Service'],
  'GET /metrics': ['getMetrics', 'Service'],
  'GET /health': ['getHealth', 'Service'],
  'GET /openapi.json': ['getOpenApiDocument', 'Service'],
  'GET /docs': ['getDocs', 'Service'],
  'GET /docs/': ['redirectDocs', 'Service'],
  'GET /docs/{asset}': ['getDocsAsset', 'Service'],
  'POST /v1/nodes': ['registerNode', 'Rollout nodes'],
  'GET /v1/nodes': ['listNodes', 'Rollout nodes'],
  'POST /v1/nodes/{node_id}/heartbeat': ['nodeHeartbeat', 'Rollout nodes'],
  'POST /v1/nodes/{node_id}/claim': ['nodeClaim', 'Rollout nodes'],
  'POST /v1/nodes/{node_id}/results': ['nodeResults', 'Rollout nodes'],
  'POST /v1/nodes/{node_id}/model': ['nodeModel', 'Rollout nodes'],
  'POST /v1/nodes/{node_id}/route': ['nodeRoute', 'Rollout nodes'],
  'DELETE /v1/nodes/{node_id}': ['deregisterNode', 'Rollout nodes'],
  'POST /start': ['prorlStart', 'ProRL Agent'],
  'POST /stop': ['prorlStop', 'ProRL Agent'],
  'GET /status': ['prorlStatus', 'ProRL Agent'],
  'POST /process': ['prorlProcess', 'ProRL Agent'],
  'POST /cancel': ['prorlCancel', 'ProRL Agent'],
  'POST /add_llm_server': ['prorlAddLlmServer', 'ProRL Agent'],
  'POST /clear_llm_server': ['prorlClearLlmServer', 'ProRL Agent'],
  'POST /run': ['gymRun', 'NeMo Gym agent'],
  'POST /aggregate_metrics': ['gymAggregateMetrics', 'NeMo Gym agent'],
  'POST /ng-rollout/{rollout_id}/run': ['gymRunOfRollout', 'NeMo Gym agent'],
  'POST /ng-rollout/{rollout_id}/aggregate_metrics': ['gymAggregateMetricsOfRollout', 'NeMo Gym agent'],
};

/** A route's operationId and tags, from OPERATIONS. */
export function operationOf(method: string, path: string): { operationId: string; tags: string[] } {
  const known = OPERATIONS[`${method.toUpperCase()} ${path.replace(/:(\w+)/g, '{$1}')}`];
  if (!known) throw new Error(`${method.toUpperCase()} ${path} has no operationId: name it in api/openapi.ts's OPERATIONS`);
  return { operationId: known[0], tags: [known[1]] };
}

/**
 * The rollout service's OpenAPI 3.1 document, generated from the routes the app declares
 * (`createRoute` + `app.openapi`), so it cannot drift from what the service accepts and answers.
 * `servers` is the service itself, relative to where the document is served (so also under a
 * prefix or behind a proxy).
 */
export function rolloutOpenApi(app: OpenAPIHono): Record<string, unknown> {
  app.openAPIRegistry.registerComponent('securitySchemes', 'bearer', { type: 'http', scheme: 'bearer' });
  return app.getOpenAPI31Document({
    openapi: '3.1.0',
    info: INFO,
    servers: [{ url: './', description: 'This service (relative to the document)' }],
    tags: [...TAGS],
    security: [{ bearer: [] }],
  }) as unknown as Record<string, unknown>;
}
