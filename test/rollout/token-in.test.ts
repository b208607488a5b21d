import { startRolloutServer, type RolloutResult, type RolloutServer, type TrainingView } from '@rollserve/core/service';
import { call, counterEnvironment, startFakePolicy, toyTokenizer, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// Token-in generation through the rollout service over HTTP, against the scripted policy: a
// drifting policy corrupts chat-mode training views (sequence_error), never token-mode ones.

const TOKEN = 'token-in-test';
const auth = { authorization: `Bearer ${TOKEN}` };

/** Add 2 to a counter that starts at 3, read it, answer: reward 1 (expected 5). */
const script: FakeReply[] = [
  { content: 'Adding.', toolCalls: [{ name: 'increment_counter', arguments: { count: 2 } }] },
  { toolCalls: [{ name: 'get_counter_value', arguments: {} }] },
  'The counter is 5.',
];
/** A tool call whose JSON the model botched. */
const botched: FakeReply[] = [{ toolCalls: [{ name: 'increment_counter', arguments: '{"count": ' }] }];

let drifting: FakePolicy;
let steady: FakePolicy;
let server: RolloutServer;

const scriptOf = (conversation: string): FakeReply[] => (conversation.startsWith('botched') ? botched : script);

beforeAll(async () => {
  drifting = await startFakePolicy({ drifting: true, script: (_request, ctx) => scriptOf(ctx.conversation)[ctx.turn]! });
  steady = await startFakePolicy({ script: (_request, ctx) => scriptOf(ctx.conversation)[ctx.turn]! });
  server = await startRolloutServer({ environments: [counterEnvironment], token: TOKEN });
});

afterAll(async () => {
  await server?.close();
  await drifting?.close();
  await steady?.close();
});

async function rollout(id: string, policy: FakePolicy, generation: 'chat' | 'tokens'): Promise<{ result: RolloutResult; view: TrainingView }> {
  const task = {
    id,
    env: 'counter',
    row: { responses_create_params: { input: 'Add 2 to the counter.' }, initial_count: 3, expected_count: 5 },
    policy: { model: 'fake-policy', base_url: policy.url, generation },
  };
  const submitted = await call(server.url, 'POST', '/v1/rollouts', task, auth);
  expect(submitted.status).toBe(202);
  const result = await server.service.wait(id);
  const training = await call(server.url, 'GET', `/v1/rollouts/${id}?view=training`, undefined, auth);
  expect(training.status).toBe(200);
  return { result, view: training.json as TrainingView };
}

/** What both modes must agree on: the trajectory and its credit. */
const trajectory = (result: RolloutResult) => ({
  state: result.state,
  reward: result.reward,
  turns: result.turns.map((t) => ({ text: t.text, status: t.status, calls: t.tool_calls.map((c) => [c.name, c.arguments, c.output, c.status]), reward: t.reward, return: t.return })),
});

describe('token-in generation (policy.generation: "tokens")', () => {
  it('a drifting policy breaks the chat-mode training view; token mode extends each prompt exactly and scores the same', async () => {
    const chat = await rollout('drift-chat', drifting, 'chat');
    expect(chat.result.state).toBe('done');
    expect(chat.view.sequence_error).toMatch(/^re-tokenisation drift: turn 1's prompt/);
    expect(chat.view.response_ids).toBeNull();

    const tokens = await rollout('drift-tokens', drifting, 'tokens');
    expect(tokens.view.sequence_error).toBeNull();
    expect(trajectory(tokens.result)).toEqual(trajectory(chat.result));
    expect(tokens.result.reward).toBe(1);
    expect(tokens.result.turns.map((t) => t.status)).toEqual(['ok', 'ok', 'none']);

    // Each prompt is the previous prompt + generation + context: never re-tokenised.
    const turns = tokens.result.turns;
    for (let t = 1; t < turns.length; t++) {
      const previous = [...turns[t - 1]!.prompt_token_ids!, ...turns[t - 1]!.generation_token_ids!];
      expect(turns[t]!.prompt_token_ids!.slice(0, previous.length)).toEqual(previous);
      expect(turns[t]!.prompt_token_ids!.length).toBeGreaterThan(previous.length);
    }
    // The view: response_mask is 1 exactly on the generated tokens, with their logprobs.
    const view = tokens.view;
    expect(view.prompt_ids).toEqual(turns[0]!.prompt_token_ids);
    const last = turns.at(-1)!;
    expect([...view.prompt_ids!, ...view.response_ids!]).toEqual([...last.prompt_token_ids!, ...last.generation_token_ids!]);
    const expectedMask = new Array<number>(view.response_ids!.length).fill(0);
    for (const turn of turns) {
      const [start, end] = view.turns[turn.index]!.generation_span!;
      expect(view.response_ids!.slice(start, end)).toEqual(turn.generation_token_ids);
      expect(view.response_logprobs!.slice(start, end)).toEqual(turn.generation_logprobs);
      expectedMask.fill(1, start, end);
    }
    expect(view.response_mask).toEqual(expectedMask);
    expect(view.turns.map((t) => [t.reward, t.return])).toEqual(chat.view.turns.map((t) => [t.reward, t.return]));
    // The model's own spacing is what the trainer sees for the call it generated.
    expect(turns[0]!.generation_token_ids).toEqual(toyTokenizer.encode('Adding.<tool_call>{"name": "increment_counter", "arguments": {"count": 2}}</tool_call>'));
    const tokenCalls = drifting.calls.filter((c) => c.conversation === 'drift-tokens');
    expect(tokenCalls.map((c) => c.endpoint)).toEqual(['completions', 'completions', 'completions']);
    expect(drifting.tokenizeRequests.length).toBeGreaterThanOrEqual(1 + 2 * 2);
  });

  it('/v1/status counts the samples whose turns drifted (chat mode), not token-mode or drift-free ones', async () => {
    const drifted = async () => ((await call(server.url, 'GET', '/v1/status', undefined, auth)).json as { rollouts: { drifted: number } }).rollouts.drifted;
    const before = await drifted();
    const chat = await rollout('status-drift-chat', drifting, 'chat');
    expect(chat.view.sequence_error).toMatch(/^re-tokenisation drift/);
    expect(await drifted()).toBe(before + 1);
    await rollout('status-drift-tokens', drifting, 'tokens');
    const steadyChat = await rollout('status-steady-chat', steady, 'chat');
    expect(steadyChat.view.sequence_error).toBeNull();
    expect(await drifted()).toBe(before + 1);
  });

  it('without drift, token mode generates from the very ids a chat server renders', async () => {
    const chat = await rollout('steady-chat', steady, 'chat');
    const tokens = await rollout('steady-tokens', steady, 'tokens');
    expect(chat.view.sequence_error).toBeNull();
    expect(tokens.result.turns.map((t) => t.prompt_token_ids)).toEqual(chat.result.turns.map((t) => t.prompt_token_ids));
    expect(tokens.result.turns.map((t) => t.generation_token_ids)).toEqual(chat.result.turns.map((t) => t.generation_token_ids));
    expect(tokens.view.response_mask).toEqual(chat.view.response_mask);
    expect(trajectory(tokens.result)).toEqual(trajectory(chat.result));
  });

  it('makes botched tool-call JSON a malformed turn, not a failure', async () => {
    const { result, view } = await rollout('botched-tokens', steady, 'tokens');
    expect(result.state).toBe('done');
    expect(result.error).toBeNull();
    expect(result.reward).toBe(0);
    expect(result.turns).toHaveLength(1);
    expect(result.turns[0]).toMatchObject({ status: 'malformed', malformed: 'a tool call that is not valid JSON', tool_calls: [] });
    expect(result.turns[0]!.text).toContain('<tool_call>');
    expect(view.sequence_error).toBeNull();
    expect(view.turns[0]!.rewards.format).toBeLessThan(0);
  });

  it('refuses an unknown generation mode with a 4xx naming the field', async () => {
    const response = await call(
      server.url,
      'POST',
      '/v1/rollouts',
      { id: 'bad-mode', env: 'counter', row: { responses_create_params: { input: 'x' }, initial_count: 0, expected_count: 0 }, policy: { model: 'fake-policy', base_url: steady.url, generation: 'tokenz' } },
      auth,
    );
    expect(response.status).toBeGreaterThanOrEqual(400);
    expect(response.status).toBeLessThan(500);
    expect(response.text).toContain('generation');
  });
});
