import { z } from 'zod';
import { ERROR_CODES } from '../errors.ts';
import { RolloutResult, RolloutTask, RolloutView, SubmitRequest } from './types.ts';

function schema(type: z.ZodType, io: 'input' | 'output'): Record<string, unknown> {
  const json = z.toJSONSchema(type, { io, unrepresentable: 'any', target: 'draft-2020-12' }) as Record<string, unknown>;
  delete json.$schema;
  return json;
}

const ErrorBody = z.object({
  error: z.object({
    code: z.enum(Object.keys(ERROR_CODES) as [string, ...string[]]),
    message: z.string(),
    retryable: z.boolean(),
    details: z.unknown().optional(),
  }),
});

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const json = (s: unknown) => ({ 'application/json': { schema: s } });
const errors = {
  '400': { description: 'Malformed request', content: json(ref('Error')) },
  '401': { description: 'Missing or wrong bearer token', content: json(ref('Error')) },
  '404': { description: 'Unknown rollout, task, environment or backend', content: json(ref('Error')) },
  '422': { description: 'The body does not fit the schema', content: json(ref('Error')) },
};

/**
 * The rollout service's OpenAPI 3.1 document, built from the same zod schemas that validate
 * requests, so it cannot drift from what the service accepts.
 */
export function rolloutOpenApi(extra: { addBackend: z.ZodType; process: z.ZodType }): Record<string, unknown> {
  return {
    openapi: '3.1.0',
    info: {
      title: 'rollserve rollout service',
      version: '0.1.0',
      description:
        'Rollout-as-a-service for RL of multi-turn LLM agents: submit tasks, get trajectories with token ids, logprobs, rewards and per-turn records. Every route but /health and /openapi.json takes `Authorization: Bearer <token>` when the service has a token.',
    },
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      schemas: {
        SubmitRequest: schema(SubmitRequest, 'input'),
        RolloutTask: schema(RolloutTask, 'input'),
        RolloutResult: schema(RolloutResult, 'output'),
        RolloutView: schema(RolloutView, 'output'),
        AddBackend: schema(extra.addBackend, 'input'),
        ProcessRequest: schema(extra.process, 'input'),
        Error: schema(ErrorBody, 'output'),
      },
    },
    security: [{ bearer: [] }],
    paths: {
      '/v1/rollouts': {
        post: {
          summary: 'Submit one task or a batch; answers at once with the rollout ids (n per task). A known task id returns what it has.',
          requestBody: { required: true, content: json(ref('SubmitRequest')) },
          responses: {
            '202': {
              description: 'Accepted',
              content: json({
                type: 'object',
                properties: {
                  tasks: {
                    type: 'array',
                    items: { type: 'object', properties: { task_id: { type: 'string' }, rollout_ids: { type: 'array', items: { type: 'string' } }, existing: { type: 'boolean' } } },
                  },
                },
              }),
            },
            '409': { description: 'A task id submitted before with another body', content: json(ref('Error')) },
            ...errors,
          },
        },
        get: {
          summary: 'List rollouts in submission order, a page at a time',
          parameters: [
            { name: 'cursor', in: 'query', schema: { type: 'string' } },
            { name: 'limit', in: 'query', schema: { type: 'integer', minimum: 1, maximum: 1000, default: 100 } },
            { name: 'state', in: 'query', schema: { type: 'string', enum: ['queued', 'init', 'run', 'eval', 'done', 'failed', 'cancelled'] } },
            { name: 'task_id', in: 'query', schema: { type: 'string' } },
          ],
          responses: {
            '200': { description: 'A page', content: json({ type: 'object', properties: { items: { type: 'array', items: ref('RolloutView') }, next_cursor: { type: ['string', 'null'] } } }) },
            ...errors,
          },
        },
      },
      '/v1/rollouts/stream': {
        get: {
          summary: 'Results as they complete: NDJSON (default) or SSE (`format=sse` or Accept: text/event-stream). With `ids`, the stream includes those already finished and ends when all are.',
          parameters: [
            { name: 'ids', in: 'query', description: 'Comma-separated rollout or task ids', schema: { type: 'string' } },
            { name: 'format', in: 'query', schema: { type: 'string', enum: ['ndjson', 'sse'] } },
          ],
          responses: {
            '200': {
              description: 'One RolloutResult per line (NDJSON) or per `result` event (SSE)',
              content: { 'application/x-ndjson': { schema: ref('RolloutResult') }, 'text/event-stream': { schema: { type: 'string' } } },
            },
            ...errors,
          },
        },
      },
      '/v1/rollouts/groups/stream': {
        get: {
          summary: 'Whole groups as they complete: each task once all its samples have finished, advantages and credit filled. NDJSON (default) or SSE; ends when every task named was sent.',
          parameters: [
            { name: 'ids', in: 'query', required: true, description: 'Comma-separated task ids', schema: { type: 'string' } },
            { name: 'format', in: 'query', schema: { type: 'string', enum: ['ndjson', 'sse'] } },
          ],
          responses: {
            '200': {
              description: 'One {taskId, results: RolloutResult[]} per line (NDJSON) or per `group` event (SSE)',
              content: {
                'application/x-ndjson': { schema: { type: 'object', properties: { taskId: { type: 'string' }, results: { type: 'array', items: ref('RolloutResult') } } } },
                'text/event-stream': { schema: { type: 'string' } },
              },
            },
            ...errors,
          },
        },
      },
      '/v1/rollouts/{id}': {
        parameters: [{ name: 'id', in: 'path', required: true, schema: { type: 'string' } }],
        get: {
          summary: 'One rollout (or, for a task id, its group)',
          responses: { '200': { description: 'The rollout', content: json(ref('RolloutView')) }, ...errors },
        },
        delete: {
          summary: 'Cancel: the rollout leaves its queue or stage and its sandbox is freed; answers once it has ended (`wait=false`: at once)',
          parameters: [{ name: 'wait', in: 'query', schema: { type: 'boolean', default: true } }],
          responses: { '200': { description: 'The cancelled rollout', content: json(ref('RolloutView')) }, ...errors },
        },
      },
      '/v1/status': {
        get: { summary: 'Per stage: queued, active, pool size; rollout counts; live sessions and sandboxes; LLM backends', responses: { '200': { description: 'Status' } } },
      },
      '/metrics': { get: { summary: 'Prometheus metrics', responses: { '200': { description: 'Text exposition format', content: { 'text/plain': { schema: { type: 'string' } } } } } } },
      '/v1/llm-backends': {
        get: { summary: 'The policy inference servers and their health', responses: { '200': { description: 'Backends' } } },
        post: {
          summary: 'Add an OpenAI-compatible inference server (a vLLM replica)',
          requestBody: { required: true, content: json(ref('AddBackend')) },
          responses: { '201': { description: 'Added', content: json({ type: 'object', properties: { id: { type: 'string' } } }) }, ...errors },
        },
      },
      '/v1/llm-backends/{id}': {
        parameters: [{ name: 'id', in: 'path', required: true, schema: { type: 'string' } }],
        delete: { summary: 'Remove a backend; its rollouts move on their next turn', responses: { '200': { description: 'Removed' }, ...errors } },
      },
      '/process': {
        post: {
          summary: 'ProRL Agent-shaped blocking call: one instance in, its finished result out',
          requestBody: { required: true, content: json(ref('ProcessRequest')) },
          responses: { '200': { description: 'The finished rollout', content: json(ref('RolloutResult')) }, ...errors },
        },
      },
      '/health': { get: { summary: 'Liveness', security: [], responses: { '200': { description: 'ok' } } } },
      '/openapi.json': { get: { summary: 'This document', security: [], responses: { '200': { description: 'OpenAPI 3.1' } } } },
    },
  };
}
