import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { Environment } from '@rollserve/core';
import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { call, cookieHeader } from './http-client.ts';

/** One reference case: a full verify request and what NeMo Gym's Python server answers for it. */
export interface VerifyCase {
  name: string;
  /** The whole `/verify` body: the row plus `response`. */
  request: Record<string, unknown>;
  expectedReward: number;
  /** Extras to compare (a subset of the answer); omitted: only the reward is compared. */
  expectedExtras?: Record<string, unknown>;
}

export interface ContractSuiteOptions {
  /** The environment under test. */
  env: Environment<any, any, any>;
  /** Its config block, as a NeMo Gym YAML would give it. */
  config?: Record<string, unknown>;
  /** The exact key set of a `/verify` answer besides responses_create_params, response and reward. */
  extraKeys: readonly string[];
  /** A row (without `response`) that the environment accepts, used for the generic checks. */
  sampleRow: Record<string, unknown>;
  /** Reference cases re-verified over HTTP (CONTRACT.md §9 item 9). */
  verifyCases?: readonly VerifyCase[];
  /**
   * The environment's package directory, for the launch contract (item 10): the built package is
   * started the way NeMo Gym's app.py shim starts it. Omitted: item 10 is skipped.
   */
  packageDir?: string;
}

const SAFE_COOKIE_VALUE = /^[A-Za-z0-9!#$%&'*+\-.^_`|~:]+$/;

function message(text: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    id: 'msg_test',
    type: 'message',
    role: 'assistant',
    status: 'completed',
    content: [{ type: 'output_text', text, annotations: [] }],
    ...extra,
  };
}

/** A NeMoGymResponse as a model server would send it, with token-id fields on the last item. */
export function makeResponse(output: unknown[], extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    id: 'resp_test',
    created_at: 1756074069.0,
    model: 'policy_model',
    object: 'response',
    output,
    parallel_tool_calls: true,
    tool_choice: 'auto',
    tools: [],
    usage: {
      input_tokens: 60,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: 30,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 90,
    },
    ...extra,
  };
}

/** A row as the collector materialises it: every default and null of responses_create_params. */
function materialised(row: Record<string, unknown>): Record<string, unknown> {
  const params = (row.responses_create_params ?? { input: [{ role: 'user', content: 'hi' }] }) as Record<string, unknown>;
  return {
    ...row,
    responses_create_params: {
      background: null, include: null, instructions: null, max_output_tokens: null, max_tool_calls: null,
      metadata: null, model: null, parallel_tool_calls: true, previous_response_id: null, prompt: null,
      reasoning: null, service_tier: null, store: null, temperature: null, text: null, tool_choice: 'auto',
      tools: [], top_logprobs: null, top_p: null, truncation: null, user: null, stream: null,
      ...params,
    },
    agent_ref: { type: 'responses_api_agents', name: 'test_simple_agent' },
    _ng_task_index: 3,
    _ng_rollout_index: 0,
  };
}

async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address();
  server.close();
  return typeof address === 'object' && address ? address.port : 0;
}

/**
 * Registers the resources-server contract tests of shared/nemo-gym/CONTRACT.md §9 for one
 * environment, against a real HTTP server on 127.0.0.1. Call it at the top level of a test file.
 *
 * @example
 * describeContract({ env: math, extraKeys: ['expected_answer', 'extracted_answer', ...], sampleRow })
 */
export function describeContract(options: ContractSuiteOptions): void {
  const { env, extraKeys, sampleRow } = options;
  describe(`NeMo Gym contract: ${env.name}`, () => {
    let app: ResourcesServer;
    let running: RunningServer;
    let url: string;
    const verifyBody = (text: string, extra: Record<string, unknown> = {}) => ({
      ...materialised(sampleRow),
      response: makeResponse([message(text)]),
      ...extra,
    });

    beforeAll(async () => {
      app = createResourcesServer(env, { ...(options.config ? { config: options.config } : {}) });
      running = await serveFetch(app);
      url = running.url;
    });
    afterAll(async () => {
      await running?.close();
      await app?.close();
    });

    it('1. answers liveness, reverify mode, 404 and 405 as FastAPI does', async () => {
      const root = await call(url, 'GET', '/');
      expect(root.status).toBe(200);
      expect(root.json).toEqual({ status: 'ok' });
      const mode = await call(url, 'GET', '/reverify_mode');
      expect(mode.status).toBe(200);
      expect(['stateless', 'unsupported', 'unknown']).toContain(mode.json);
      expect(mode.json).toBe(env.reverifyMode);
      const missing = await call(url, 'POST', '/no_such_route', {});
      expect(missing.status).toBe(404);
      expect(missing.text).toBe('{"detail":"Not Found"}');
      expect(missing.headers['content-type']).toMatch(/^application\/json/);
      expect(missing.setCookies.some((c) => c.startsWith(`${app.cookieName}=`))).toBe(true);
      const wrongMethod = await call(url, 'GET', '/verify');
      expect(wrongMethod.status).toBe(405);
      expect(wrongMethod.json).toEqual({ detail: 'Method Not Allowed' });
    });

    it('2. strips a valid /ng-rollout/<id> prefix and only a valid one', async () => {
      const body = verifyBody('no answer here');
      const plain = await call(url, 'POST', '/verify', body);
      const prefixed = await call(url, 'POST', '/ng-rollout/3-0/verify', body);
      expect(prefixed.status).toBe(200);
      expect((prefixed.json as { reward: number }).reward).toBe((plain.json as { reward: number }).reward);
      expect((await call(url, 'GET', '/ng-rollout/task_1.r-2/')).json).toEqual({ status: 'ok' });
      expect((await call(url, 'POST', '/ng-rollout/.x/verify', body)).status).toBe(404);
      expect((await call(url, 'POST', '/ng-rollout/3-0', body)).status).toBe(404);
    });

    it('3. sets a safe session cookie on every response and keeps one session per cookie', async () => {
      const seed = await call(url, 'POST', '/seed_session', materialised(sampleRow));
      expect(seed.status).toBe(200);
      const line = seed.setCookies.find((c) => c.startsWith(`${app.cookieName}=`));
      expect(line).toBeDefined();
      const [pair, ...attributes] = line!.split(';').map((part) => part.trim());
      const value = pair!.slice(app.cookieName.length + 1);
      expect(value).toMatch(SAFE_COOKIE_VALUE);
      const attrs = attributes.map((a) => a.toLowerCase());
      expect(attrs).toContain('path=/');
      expect(attrs.some((a) => a.startsWith('domain'))).toBe(false);
      expect(attrs).not.toContain('secure');
      const maxAge = Number(attrs.find((a) => a.startsWith('max-age='))?.slice(8));
      expect(maxAge).toBeGreaterThan(0);
      // The same cookie comes back unchanged, alongside foreign cookies and when quoted.
      const again = await call(url, 'GET', '/', undefined, { cookie: `SimpleAgent___x=abc; ${pair}; other=1` });
      expect(again.setCookies[0]).toBe(line);
      const quoted = await call(url, 'GET', '/', undefined, { cookie: `${app.cookieName}="${value}"` });
      expect(quoted.setCookies[0]).toContain(`${app.cookieName}=${value};`);
      // A forged value starts a new session.
      // (the last character changed to another, so the forgery never equals the real value)
      const forgedValue = `${value.slice(0, -1)}${value.endsWith('0') ? '1' : '0'}`;
      const forged = await call(url, 'GET', '/', undefined, { cookie: `${app.cookieName}=${forgedValue}` });
      expect(forged.setCookies[0]).not.toContain(value);
      // 422s carry it too.
      const invalid = await call(url, 'POST', '/verify', '{not json', { cookie: cookieHeader(seed.setCookies) });
      expect(invalid.status).toBe(422);
      expect(invalid.setCookies[0]).toBe(line);
    });

    it('4. accepts a fully materialised row at /seed_session', async () => {
      const seed = await call(url, 'POST', '/seed_session', { ...materialised(sampleRow), skills_ref: null, _ng_attempt_index: 1 });
      expect(seed.status).toBe(200);
      expect(typeof seed.json).toBe('object');
      if (!env.seedSession) expect(seed.json).toEqual({});
    });

    it('5. echoes responses_create_params and response verbatim, with the reference key set', async () => {
      const response = makeResponse(
        [
          { id: 'rs_1', type: 'reasoning', summary: [{ type: 'summary_text', text: 'thinking' }], unknown_key: [1, { a: null }] },
          message('The answer is 42.', {
            prompt_token_ids: [1, 2, 3],
            generation_token_ids: [4, 5],
            generation_log_probs: [-0.5, -0.25],
            routed_experts: 'nrlre1:abc',
          }),
        ],
        { incomplete_details: null, custom_field: { nested: [1.5, 'x'] } },
      );
      const body: Record<string, unknown> = { ...materialised(sampleRow), response };
      const verify = await call(url, 'POST', '/verify', body);
      expect(verify.status).toBe(200);
      const answer = verify.json as Record<string, unknown>;
      expect(answer.responses_create_params).toEqual(body.responses_create_params);
      expect(Object.keys(answer.responses_create_params as object)).toEqual(Object.keys(body.responses_create_params as object));
      expect(answer.response).toEqual(response);
      expect(typeof answer.reward).toBe('number');
      expect(Number.isFinite(answer.reward)).toBe(true);
      expect(verify.text).not.toMatch(/"reward":(true|false)/);
      const keys = Object.keys(answer).filter((k) => !['responses_create_params', 'response', 'reward'].includes(k));
      expect(keys.sort()).toEqual([...extraKeys].sort());
    });

    it('6. gives reward 0 with 200 for anything the model did wrong', async () => {
      const bodies = [
        { ...materialised(sampleRow), response: makeResponse([]) },
        { ...materialised(sampleRow), response: makeResponse([{ id: 'rs', type: 'reasoning', summary: [] }]) },
        {
          ...materialised(sampleRow),
          response: makeResponse([{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'refusal', refusal: 'no' }] }]),
        },
        verifyBody('}}}{{{ \\boxed{ unparseable \\frac{'),
        verifyBody('x'.repeat(200_000)),
      ];
      for (const body of bodies) {
        const verify = await call(url, 'POST', '/verify', body);
        expect(verify.status).toBe(200);
        expect((verify.json as { reward: number }).reward).toBe(0);
      }
    });

    it('7. answers bad tool arguments with FastAPI 422 bodies', async () => {
      for (const [name, tool] of Object.entries(env.tools)) {
        const bad = await call(url, 'POST', `/${name}`, [1, 2]);
        expect(bad.status).toBe(422);
        const detail = (bad.json as { detail: Array<{ loc: unknown[]; msg: string; type: string }> }).detail;
        expect(Array.isArray(detail)).toBe(true);
        expect(detail[0]!.loc[0]).toBe('body');
        const acceptsEmpty = tool.parameters.safeParse({}).success;
        const empty = await call(url, 'POST', `/${name}`, {});
        if (acceptsEmpty) expect(empty.status).toBe(200);
        else expect(empty.status).toBe(422);
      }
      const malformed = await call(url, 'POST', '/verify', '{"responses_create_params": ');
      expect(malformed.status).toBe(422);
      expect((malformed.json as { detail: Array<{ type: string }> }).detail[0]!.type).toBe('json_invalid');
      const missing = await call(url, 'POST', '/verify', { ...materialised(sampleRow) });
      expect(missing.status).toBe(422);
      expect((missing.json as { detail: unknown[] }).detail).toContainEqual(
        expect.objectContaining({ type: 'missing', loc: ['body', 'response'], msg: 'Field required' }),
      );
    });

    it('8. aggregates metrics in the RewardProfiler shape', async () => {
      const empty = await call(url, 'POST', '/aggregate_metrics', { verify_responses: [] });
      expect(empty.json).toEqual({ group_level_metrics: [], agent_metrics: {}, key_metrics: {} });
      const entries = [];
      for (let t = 0; t < 2; t++) {
        for (let r = 0; r < 4; r++) {
          entries.push({
            ...sampleRow,
            _ng_task_index: t,
            _ng_rollout_index: r,
            reward: (t + r) % 2,
            response: { usage: { input_tokens: 10 * (t + 1), output_tokens: 5, total_tokens: 10 * (t + 1) + 5 } },
          });
        }
      }
      const metrics = await call(url, 'POST', '/aggregate_metrics', { verify_responses: entries });
      expect(metrics.status).toBe(200);
      const answer = metrics.json as { group_level_metrics: Array<Record<string, unknown>>; agent_metrics: Record<string, number> };
      expect(answer.group_level_metrics).toHaveLength(2);
      expect(answer.group_level_metrics[0]!['mean/reward']).toBe(0.5);
      expect(answer.agent_metrics['mean/reward']).toBe(0.5);
      expect(answer.agent_metrics['mean/input_tokens']).toBe(15);
      expect(metrics.text).not.toMatch(/NaN|histogram/);
      const bad = await call(url, 'POST', '/aggregate_metrics', { verify_responses: 'x' });
      expect(bad.status).toBe(422);
    });

    it('8b. answers every malformed body on every route with FastAPI\'s 4xx, never a 500', async () => {
      const parseError = { detail: 'There was an error parsing the body' };
      const deep = (depth: number) => '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
      const routes = ['/seed_session', '/verify', '/aggregate_metrics', ...Object.keys(env.tools).map((name) => `/${name}`)];
      const send = async (path: string, body: string | Buffer, contentType?: string) => {
        const response = await request(new URL(path, url), {
          method: 'POST',
          body,
          headers: contentType === undefined ? {} : { 'content-type': contentType },
        });
        const text = await response.body.text();
        return { status: response.statusCode, json: JSON.parse(text) as unknown };
      };
      for (const route of routes) {
        // json.loads gives up (RecursionError, the 4300-digit int limit, bad UTF-8): FastAPI's 400.
        for (const body of ['['.repeat(100_000), deep(100_000), `{"a":${deep(5_000)}}`, `{"a":${'7'.repeat(5_000)}}`, Buffer.from([0x7b, 0xff, 0x7d])]) {
          expect(await send(route, body, 'application/json'), route).toEqual({ status: 400, json: parseError });
        }
        expect((await send(route, '{"a":1,}', 'application/json')).json).toMatchObject({ detail: [{ type: 'json_invalid', loc: ['body', 7] }] });
        // JSON null is no body; a body declared as something else is validated as text.
        expect(await send(route, 'null', 'application/json'), route).toEqual({
          status: 422,
          json: { detail: [{ type: 'missing', loc: ['body'], msg: 'Field required', input: null }] },
        });
        for (const contentType of ['text/plain', 'application/x-www-form-urlencoded']) {
          expect(await send(route, '{}', contentType), route).toEqual({
            status: 422,
            json: { detail: [{ type: 'model_attributes_type', loc: ['body'], msg: 'Input should be a valid dictionary or object to extract fields from', input: '{}' }] },
          });
        }
        for (const body of ['[1,2]', '"x"', '1e999']) {
          expect((await send(route, body, 'application/json')).status, `${route} ${body}`).toBe(422);
        }
      }
      const wrongTypes = JSON.stringify({ ...materialised(sampleRow), responses_create_params: null, response: 7, verify_responses: {} });
      for (const route of ['/verify', '/aggregate_metrics']) expect((await send(route, wrongTypes, 'application/json')).status).toBe(422);
      // The rollout indices are pydantic ints; a duplicate pair is the ValueError pydantic reports.
      const aggregate = (entries: unknown[]) => send('/aggregate_metrics', JSON.stringify({ verify_responses: entries }), 'application/json');
      expect(await aggregate([{ _ng_task_index: 'a', reward: 1 }])).toEqual({
        status: 422,
        json: {
          detail: [{
            type: 'int_parsing',
            loc: ['body', 'verify_responses', 0, '_ng_task_index'],
            msg: 'Input should be a valid integer, unable to parse string as an integer',
            input: 'a',
          }],
        },
      });
      expect((await aggregate([{ _ng_rollout_index: 1.5 }])).json).toMatchObject({ detail: [{ type: 'int_from_float', loc: ['body', 'verify_responses', 0, '_ng_rollout_index'] }] });
      expect((await aggregate([{ _ng_task_index: null }])).json).toMatchObject({ detail: [{ type: 'int_type', msg: 'Input should be a valid integer' }] });
      expect((await aggregate([{ _ng_task_index: '2', reward: 1 }])).json).toMatchObject({ group_level_metrics: [{ _ng_task_index: 2 }] });
      expect(await aggregate([{ reward: 1 }, { _ng_task_index: 0, _ng_rollout_index: 0, reward: 0 }])).toEqual({
        status: 422,
        json: {
          detail: [{
            type: 'value_error',
            loc: ['body', 'verify_responses'],
            msg: 'Value error, Duplicate materialized input row for rollout key (0, 0)',
            input: [{ reward: 1 }, { _ng_task_index: 0, _ng_rollout_index: 0, reward: 0 }],
            ctx: { error: {} },
          }],
        },
      });
      expect((await call(url, 'GET', '/')).json).toEqual({ status: 'ok' });
    });

    it.skipIf(!options.verifyCases?.length)('9. re-verifies the reference cases with the reference rewards', async () => {
      for (const testCase of options.verifyCases ?? []) {
        const verify = await call(url, 'POST', '/verify', testCase.request);
        expect(verify.status, testCase.name).toBe(200);
        const answer = verify.json as Record<string, unknown>;
        expect(answer.reward, testCase.name).toBe(testCase.expectedReward);
        for (const [key, value] of Object.entries(testCase.expectedExtras ?? {})) {
          expect(answer[key], `${testCase.name}: ${key}`).toEqual(value);
        }
      }
    });

    describe.skipIf(!options.packageDir)('10. launch contract (the built package, as NeMo Gym starts it)', () => {
      // what the package's nemo-gym/app.py execs: core's launcher, found from the package itself
      const bin = () => join(options.packageDir!, 'node_modules', '@rollserve', 'core', 'bin', 'rollserve-gym.js');
      const start = (config: Record<string, unknown>, instance: string, extraEnv: Record<string, string> = {}) =>
        spawn(process.execPath, [bin(), options.packageDir!], {
          env: { ...process.env, ...extraEnv, NEMO_GYM_CONFIG_DICT: stringify(config), NEMO_GYM_CONFIG_PATH: instance },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
      const globalConfig = (port: number, extra: Record<string, unknown> = {}) => ({
        default_host: '127.0.0.1',
        test_port: port,
        head_server: { host: '127.0.0.1', port: 11000 },
        [`${env.name}_instance`]: {
          resources_servers: {
            [env.name]: {
              entrypoint: 'app.py',
              domain: env.domain,
              host: '${default_host}',
              port: '${test_port}',
              description: '${oc.env:ROLLSERVE_TEST_DESCRIPTION,a description}',
              ...options.config,
            },
          },
        },
        ...extra,
      });

      it('binds the configured host:port, keeps connections alive past 15 s of Node defaults, and exits within 1 s of SIGINT', async () => {
        const port = await freePort();
        const child = start(globalConfig(port), `${env.name}_instance`, { ROLLSERVE_TEST_DESCRIPTION: 'from env' });
        let output = '';
        child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
        child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
        try {
          const deadline = Date.now() + 15_000;
          while (!output.includes(`http://127.0.0.1:${port}`)) {
            if (Date.now() > deadline || child.exitCode !== null) throw new Error(`server did not start: ${output}`);
            await new Promise((r) => setTimeout(r, 50));
          }
          // One keep-alive connection, idle longer than Node's default 5 s keepAliveTimeout.
          const agent = new Agent({ connections: 1, keepAliveTimeout: 60_000 });
          const sockets = new Set<unknown>();
          const first = await request(`http://127.0.0.1:${port}/`, { dispatcher: agent });
          await first.body.text();
          expect(first.statusCode).toBe(200);
          agent.on('connect', (_origin, targets) => sockets.add(targets));
          await new Promise((r) => setTimeout(r, 6_000));
          const second = await request(`http://127.0.0.1:${port}/`, { dispatcher: agent });
          await second.body.text();
          expect(second.statusCode).toBe(200);
          expect(sockets.size).toBe(0); // no reconnect: the server kept the connection open
          await agent.close();
          const started = Date.now();
          child.kill('SIGINT');
          const [code] = (await once(child, 'exit')) as [number | null];
          expect(Date.now() - started).toBeLessThan(1_000);
          expect(code).toBe(0);
        } finally {
          if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
        }
      }, 30_000);

      it('exits 0 without binding on dry_run', async () => {
        const port = await freePort();
        const child = start(globalConfig(port, { dry_run: true }), `${env.name}_instance`);
        const [code] = (await once(child, 'exit')) as [number | null];
        expect(code).toBe(0);
        const probe = createServer();
        probe.listen(port, '127.0.0.1');
        await once(probe, 'listening'); // the port was never taken
        probe.close();
      });

      it('fails clearly on a config that names no such instance', async () => {
        const child = start(globalConfig(await freePort()), 'nope');
        let stderr = '';
        child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
        const [code] = (await once(child, 'exit')) as [number | null];
        expect(code).not.toBe(0);
        expect(stderr).toContain('no instance "nope"');
      });
    });
  });
}
