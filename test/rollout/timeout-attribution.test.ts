import { bashTool, defineEnvironment } from '@rollserve/core';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { startFakePolicy, type FakePolicy, type FakeReply } from '@rollserve/testing';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { liveSandboxes, submitAndWait, type HttpService } from './http-rollout.ts';

// A rollout that runs out of `time_limit_s` is filtered only when the time went to the
// infrastructure (waiting for model calls, a slow verify). When the policy spent it itself, in its
// own tool calls (each within `tool_timeout_s`), the sample is scored as reward 0: otherwise a
// policy could learn to sleep until the limit passes and turn a sample it would fail into one that
// is never trained on. Everything here is real (service over HTTP, bwrap sandbox, PTY shell, the
// commands' sleeps); only the policy is scripted.

/** The bash tool in a sandbox; verify waits `verify_ms` (a slow verifier) and gives reward 1. */
const shell = defineEnvironment({
  name: 'timed_shell',
  domain: 'agent',
  row: z.object({ verify_ms: z.number().default(0) }),
  tools: { bash: bashTool },
  sandbox: {},
  verify: async (row, _response, ctx) => {
    if (row.verify_ms > 0) await sleep(row.verify_ms, undefined, { signal: ctx.signal });
    return { reward: 1 };
  },
});

/**
 * The policy: the task's first message is `<plan>`; each turn answers per the plan's mode:
 * `sleep:<s>`: one bash `sleep <s>` per turn, forever; `slow:<ms>`: a quick bash command per turn,
 * each answer `<ms>` late; `once:<s>`: one `sleep <s>` then an answer; `half:<s>`: one `sleep <s>`,
 * then a backend that never answers; `answer`: an answer at once.
 */
function script(req: { messages: unknown[] }, ctx: { turn: number }): FakeReply {
  const user = req.messages.find((m) => (m as { role?: string }).role === 'user') as { content: string };
  const [mode, arg] = user.content.split(':') as [string, string | undefined];
  const bash = (command: string) => ({ toolCalls: [{ name: 'bash', arguments: { command } }] });
  switch (mode) {
    case 'sleep':
      return bash(`sleep ${arg}`);
    case 'slow':
      return { ...bash('true'), latencyMs: Number(arg) };
    case 'once':
      return ctx.turn === 0 ? bash(`sleep ${arg}`) : 'done';
    case 'half':
      return ctx.turn === 0 ? bash(`sleep ${arg}`) : { content: 'never', hang: true };
    default:
      return 'done';
  }
}

let fake: FakePolicy;
let server: RolloutServer;
const TOKEN = 'timeout-token';

beforeAll(async () => {
  fake = await startFakePolicy({ script: script as never });
  server = await startRolloutServer({ environments: [shell], token: TOKEN, llmBackends: [fake.url] });
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

interface WireResult {
  state: string;
  reward: number;
  filter: boolean;
  critical_error: string | null;
  error: { code: string; message: string } | null;
  turns: Array<{ tool_calls: Array<{ status: string }>; generation_token_ids: number[] | null; prompt_token_ids: number[] | null }>;
  response: { output: unknown[] } | null;
}

/** Submits one task over HTTP and waits for its result. */
const rollout = (id: string, plan: string, limits: Record<string, unknown>, verifyMs = 0) =>
  submitAndWait<WireResult>(service(), { id, env: 'timed_shell', row: { responses_create_params: { input: plan }, verify_ms: verifyMs }, policy: { model: 'fake-policy' }, limits });

const service = (): HttpService => ({ url: server.url, token: TOKEN });

describe('a time-out is attributed: the policy\'s is scored, the infrastructure\'s filtered', { timeout: 120_000 }, () => {
  it('scores a policy that sleeps in its tool calls until the time limit passes (reward 0, not filtered)', async () => {
    const result = await rollout('sleeper', 'sleep:1', { time_limit_s: 4, tool_timeout_s: 30, max_turns: 100 });
    expect(result.critical_error).toBe('timeout');
    expect(result.filter).toBe(false);
    expect(result.reward).toBe(0);
    expect(result.state).toBe('failed');
    expect(result.error?.code).toBe('TIMEOUT');
    expect(result.error?.message).toMatch(/policy's own time/);
    // every call it made was within tool_timeout_s: the time went in many calls, not one cut off
    expect(result.turns.length).toBeGreaterThan(1);
    expect(result.turns.flatMap((t) => t.tool_calls).filter((c) => c.status !== 'ok')).toEqual([]);
    // the trajectory it produced is kept, to train on: every turn's prompt and generation
    for (const turn of result.turns) {
      expect(turn.prompt_token_ids?.length).toBeGreaterThan(0);
      expect(turn.generation_token_ids?.length).toBeGreaterThan(0);
    }
    expect(result.response?.output.length).toBeGreaterThan(0);
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('scores a policy whose sleep leaves no time for EVAL (verify cut short by the policy\'s time)', async () => {
    const result = await rollout('eval-squeeze', 'once:3', { time_limit_s: 4, tool_timeout_s: 30 }, 3_000);
    expect(result.critical_error).toBe('timeout');
    expect(result.filter).toBe(false);
    expect(result.reward).toBe(0);
  });

  it('filters a time-out spent waiting for a slow policy backend while the tools are quick', async () => {
    const result = await rollout('slow-backend', 'slow:1500', { time_limit_s: 4, tool_timeout_s: 30, max_turns: 100 });
    expect(result.critical_error).toBe('timeout');
    expect(result.filter).toBe(true);
    expect(result.turns.length).toBeGreaterThan(0);
    expect(result.turns.flatMap((t) => t.tool_calls).every((c) => c.status === 'ok')).toBe(true);
    expect(await liveSandboxes(service())).toBe(0);
  });

  it('filters a time-out in a backend that stopped answering after the policy slept less than half the limit', async () => {
    const result = await rollout('half-outage', 'half:1', { time_limit_s: 4, tool_timeout_s: 30 });
    expect(result.critical_error).toBe('timeout');
    expect(result.filter).toBe(true);
    expect(result.turns[0]!.tool_calls[0]!.status).toBe('ok');
  });

  it('filters a time-out in a slow verify when the policy was quick', async () => {
    const result = await rollout('slow-verify', 'answer', { time_limit_s: 2 }, 10_000);
    expect(result.critical_error).toBe('timeout');
    expect(result.error?.message).toMatch(/in eval/);
    expect(result.filter).toBe(true);
  });

  it('scores a policy that slept and answered within the limit as usual', async () => {
    const result = await rollout('in-time', 'once:1', { time_limit_s: 30, tool_timeout_s: 30 });
    expect(result.critical_error).toBeNull();
    expect(result.filter).toBe(false);
    expect(result.reward).toBe(1);
  });
});
