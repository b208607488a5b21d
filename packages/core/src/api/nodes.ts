import { createRoute, OpenAPIHono, z } from '@hono/zod-openapi';
import {
  HeartbeatAnswer,
  NODE_CREDENTIAL_HEADER,
  NODE_FEATURES_HEADER,
  NODE_UPCOMING_MAX,
  NodeClaim,
  NodeClaimRequest,
  NodeClaims,
  NodeCommitAnswer,
  NodeCommits,
  NodeHeartbeat,
  NodeId,
  NodeModelRequest,
  NodeRegistered,
  NodeRegistration,
  NodeUpcoming,
  NodeRoute,
  NodeRouteRequest,
  NodeView,
  nodeFeatures,
  toWireModelTurn,
  WireModelTurn,
  type NodeAuth,
  type NodeCoordinator,
} from '../protocol/nodes.ts';
import type { ApiContext } from './context.ts';
import { errorResponses } from './wire.ts';

// The rollout-node routes; their wire formats are ../protocol/nodes.ts.

const NodeParam = z.object({ node_id: NodeId.openapi({ param: { name: 'node_id', in: 'path' } }) });
/** The node's credential: optional in the schema, so a missing one is the 401 that says what is wrong, not a 422. */
const CredentialHeader = z.object({
  [NODE_CREDENTIAL_HEADER]: z
    .string()
    .optional()
    .openapi({ param: { name: NODE_CREDENTIAL_HEADER, in: 'header' }, description: 'The credential the registration answered (`credential`); required on every call of a registered node (401 without it, or with another node\'s)' }),
});
const json = <T extends z.ZodType>(schema: T) => ({ 'application/json': { schema } });
const NODE_401 = {
  description: 'Missing or wrong bearer token (the service\'s --node-token when it has one), or a missing or wrong node credential (the x-rollserve-node-credential header)',
  content: errorResponses(401)[401].content,
};

const registerRoute = createRoute({
  method: 'post',
  path: '/v1/nodes',
  summary:
    "Register a rollout node (`rollserve node`), or register it again under the same id; answers its credential and the timings it must keep. Registering again under an id in use (a node up, or holding leases) needs that node's credential in the x-rollserve-node-credential header: a 409 without it. The id `service` is reserved (422)",
  request: { headers: CredentialHeader, body: { required: true, content: json(NodeRegistration) } },
  responses: {
    201: { description: 'Registered', content: json(NodeRegistered) },
    ...errorResponses(400, 401, 409, 422, 503),
  },
});

const listRoute = createRoute({
  method: 'get',
  path: '/v1/nodes',
  summary: 'The rollout nodes: registration, last heartbeat, leases held, state (up, lost, left)',
  responses: {
    200: { description: 'Nodes', content: json(z.strictObject({ nodes: z.array(NodeView) }).openapi('NodeList')) },
    ...errorResponses(401),
  },
});

const heartbeatRoute = createRoute({
  method: 'post',
  path: '/v1/nodes/{node_id}/heartbeat',
  summary:
    "A node's heartbeat with every lease it holds (at most its max_rollouts: a 422 naming it otherwise): renews those it holds, names those it lost (a lease held past 3× its task's time_limit_s is not renewed) and those to cancel. 404: unknown node (register again)",
  request: { params: NodeParam, headers: CredentialHeader, body: { required: true, content: json(NodeHeartbeat) } },
  responses: {
    200: { description: 'What the node keeps, loses and cancels', content: json(HeartbeatAnswer) },
    ...errorResponses(400, 404, 422, 503),
    401: NODE_401,
  },
});

const claimRoute = createRoute({
  method: 'post',
  path: '/v1/nodes/{node_id}/claim',
  summary:
    "Lease up to `limit` queued rollouts of the node's environments (`limit` at most its max_rollouts; no more than its free capacity is handed out); with none, a long poll of up to `wait_ms`",
  request: { params: NodeParam, headers: CredentialHeader, body: { required: true, content: json(NodeClaimRequest) } },
  responses: {
    200: { description: 'Leased rollouts (maybe none)', content: json(NodeClaims) },
    ...errorResponses(400, 404, 422, 503),
    401: NODE_401,
  },
});

const resultsRoute = createRoute({
  method: 'post',
  path: '/v1/nodes/{node_id}/results',
  summary:
    "Commit finished rollouts, each with its lease's attempt; each answers committed, duplicate, stale (the lease was re-issued, or is not this node's: nothing changed) or not_found. Only the node holding a rollout's lease at that attempt commits it. The results are RolloutResult as the API shows them (NodeRolloutResult), their token ids sent once (`$tokens`)",
  request: { params: NodeParam, headers: CredentialHeader, body: { required: true, content: json(NodeCommits) } },
  responses: {
    200: { description: 'One status per result, in order', content: json(NodeCommitAnswer) },
    ...errorResponses(400, 404, 422, 503),
    401: NODE_401,
  },
});

const modelRoute = createRoute({
  method: 'post',
  path: '/v1/nodes/{node_id}/model',
  summary: "One policy turn of a rollout the node holds, through the service's LLM backends (least in flight, sticky per rollout); closing the request aborts it",
  request: { params: NodeParam, headers: CredentialHeader, body: { required: true, content: json(NodeModelRequest) } },
  responses: {
    200: { description: 'The turn', content: json(WireModelTurn) },
    ...errorResponses(400, 404, 409, 422, 503),
    401: NODE_401,
    502: { description: 'Every LLM backend failed the turn', content: errorResponses(400)[400].content },
    504: { description: 'The turn timed out', content: errorResponses(400)[400].content },
  },
});

const routeRoute = createRoute({
  method: 'post',
  path: '/v1/nodes/{node_id}/route',
  summary:
    "The route of a rollout the node holds, for a node that sends its policy turns to the backends itself (it registered saying `direct-backends` in x-rollserve-node-features): the backend the service chose (least in flight across the service and every node, sticky for the rollout, counted as that backend's load until the lease ends), what to send it, and its weight version. `failed`: a backend that gave the node no response (taken out of rotation and probed). Waits for a healthy backend; closing the request stops the wait. 409: the node does not hold the rollout at that attempt, or did not register so",
  request: { params: NodeParam, headers: CredentialHeader, body: { required: true, content: json(NodeRouteRequest) } },
  responses: {
    200: { description: 'The route', content: json(NodeRoute) },
    ...errorResponses(400, 404, 409, 422, 503),
    401: NODE_401,
    502: { description: 'No policy backend can be reached', content: errorResponses(400)[400].content },
  },
});

const deregisterRoute = createRoute({
  method: 'delete',
  path: '/v1/nodes/{node_id}',
  summary: 'A node leaving: what it still holds is re-queued at once',
  request: { params: NodeParam, headers: CredentialHeader },
  responses: {
    200: { description: 'Left', content: json(z.strictObject({ released: z.number().int() }).openapi('NodeLeft')) },
    ...errorResponses(404, 422),
    401: NODE_401,
  },
});

/** /v1/nodes: the rollout-node protocol (register, heartbeat, claim, commit, model turns, leave). */
export function nodesApi({ service }: ApiContext): OpenAPIHono {
  const nodes: NodeCoordinator = service;
  const app = new OpenAPIHono();

  const auth = (c: { req: { valid(target: 'param'): { node_id: string }; header(name: string): string | undefined } }): NodeAuth => ({
    node_id: c.req.valid('param').node_id,
    credential: c.req.header(NODE_CREDENTIAL_HEADER),
  });

  app.openapi(registerRoute, async (c) =>
    c.json(await nodes.registerNode(c.req.valid('json'), c.req.header(NODE_CREDENTIAL_HEADER), nodeFeatures(c.req.header(NODE_FEATURES_HEADER))), 201),
  );

  app.openapi(listRoute, (c) => c.json({ nodes: nodes.nodes() }, 200));

  // what a node reads beyond the first form of the protocol (an older node's schemas are strict)
  const reads = (c: { req: { header(name: string): string | undefined } }, feature: string) => nodeFeatures(c.req.header(NODE_FEATURES_HEADER)).includes(feature);
  const readsWeights = (c: { req: { header(name: string): string | undefined } }) => reads(c, 'weights');

  app.openapi(heartbeatRoute, async (c) => {
    const { leases, generation } = c.req.valid('json');
    const answer = await nodes.heartbeat(auth(c), leases, generation);
    return c.json(readsWeights(c) ? { ...answer, generation_paused: service.generationPaused } : answer, 200);
  });

  app.openapi(claimRoute, async (c) => {
    const { limit, wait_ms } = c.req.valid('json');
    const who = auth(c);
    const claims = await nodes.claimForNode(who, limit, wait_ms, c.req.raw.signal);
    // a node calling backends itself hears the weight state with its routes
    const weights = claims.length > 0 ? nodes.weightsFor(who.node_id) : undefined;
    // (each task goes out as the RolloutTask it is; the document calls it an object)
    const answer = { claims: claims as Array<z.infer<typeof NodeClaim>>, ...(weights ? { weights } : {}) };
    // the work queued next, to a node that readies images ahead: only with work handed out (a
    // node with room that got none has nothing queued behind it), and a hint that may be missing
    if (claims.length === 0 || !reads(c, 'prefetch')) return c.json(answer, 200);
    const upcoming = await nodes.upcomingForNode(who, NODE_UPCOMING_MAX).catch(() => []);
    return c.json({ ...answer, upcoming: upcoming as Array<z.infer<typeof NodeUpcoming>> }, 200);
  });

  app.openapi(resultsRoute, async (c) => {
    const commits = c.req.valid('json').results;
    const statuses = await nodes.commitFromNode(auth(c), commits);
    return c.json({ results: commits.map((commit, i) => ({ rollout_id: commit.rollout_id, status: statuses[i]! })) }, 200);
  });

  // (the messages and tools are the agent loop's; the schema checks only their shape)
  app.openapi(modelRoute, async (c) =>
    c.json(toWireModelTurn(await nodes.modelTurn(auth(c), c.req.valid('json') as unknown as NodeModelRequest, c.req.raw.signal), readsWeights(c)), 200),
  );

  app.openapi(routeRoute, async (c) => c.json(await nodes.route(auth(c), c.req.valid('json'), c.req.raw.signal), 200));

  app.openapi(deregisterRoute, async (c) => c.json(await nodes.deregisterNode(auth(c)), 200));

  return app;
}
