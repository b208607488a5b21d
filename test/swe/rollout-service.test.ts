import swe from '@rollserve/env-swe';
import type { RolloutService, RolloutTaskInput } from '@rollserve/core/service';
import { type ChatCompletionBody, type FakePolicy, type FakeReply, startFakePolicy, startTestRolloutService } from '@rollserve/testing';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { buildSweFixtures, type SweFixture } from './fixtures.ts';

// The SWE environment inside the rollout service, on bwrap: INIT creates the agent sandbox and
// seeds the repository, a scripted policy edits it through str_replace_editor and submits, EVAL
// verifies in a fresh sandbox.

const built = buildSweFixtures();
afterAll(() => built.close());

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

async function setup(script: (request: ChatCompletionBody, turn: number) => FakeReply): Promise<{ svc: RolloutService; fake: FakePolicy }> {
  const fake = await startFakePolicy({ script: (request, ctx) => script(request, ctx.turn) });
  const { service: svc, close } = await startTestRolloutService({ environments: [swe], backends: [fake.url], environmentConfigs: { swe: { repos_root: built.root } } });
  cleanups.push(async () => {
    await close();
    await fake.close();
  });
  return { svc, fake };
}

const task = (fixture: SweFixture, id: string): RolloutTaskInput => ({ id, env: 'swe', row: fixture.row, policy: { model: 'fake-policy' } });

/** Which fixture a conversation is about: its problem statement is in the first user message. */
function fixtureOf(request: ChatCompletionBody): SweFixture {
  const first = JSON.stringify((request.messages as Array<{ role: string; content: unknown }>).find((m) => m.role === 'user')?.content);
  return built.fixtures.find((f) => first.includes(String(f.row.problem_statement).slice(0, 40)))!;
}

describe('swe inside the rollout service (bwrap)', () => {
  it('a policy that applies the gold fix with str_replace_editor and submits reaches reward 1, for each fixture', async () => {
    const { svc, fake } = await setup((request, turn) => {
      const fixture = fixtureOf(request);
      const path = `/workspace/${fixture.goldEdit.path}`;
      switch (turn) {
        case 0:
          return { toolCalls: [{ name: 'bash', arguments: { command: `git status --short && grep -c . ${fixture.goldEdit.path}` } }] };
        case 1:
          return { toolCalls: [{ name: 'str_replace_editor', arguments: { command: 'str_replace', path, old_str: fixture.goldEdit.old_str, new_str: fixture.goldEdit.new_str } }] };
        case 2:
          return { toolCalls: [{ name: 'submit', arguments: {} }] };
        default:
          return 'I fixed the bug and submitted.';
      }
    });
    const tasks = built.fixtures.map((f, i) => task(f, `gold-${i}`));
    await svc.submit(tasks);
    const results = await Promise.all(tasks.map((t) => svc.wait(t.id!)));
    for (const [i, result] of results.entries()) {
      const fixture = built.fixtures[i]!;
      expect(result.error?.message ?? null, fixture.name).toBeNull();
      expect(result.critical_error).toBeNull();
      const calls = result.turns.flatMap((t) => t.tool_calls);
      expect(calls.map((c) => c.name)).toEqual(['bash', 'str_replace_editor', 'submit']);
      expect(calls[1]!.output).toContain('has been edited');
      expect(calls[2]!.output).toContain('submitted');
      expect(result.verify_extras).toMatchObject({
        resolved: true,
        evaluation_completed: true,
        submitted: true,
        failure_reason: null,
        f2p_passed: fixture.failToPass.length,
        p2p_passed: fixture.passToPass.length,
      });
      expect(result.reward, JSON.stringify(result.verify_extras.failed_tests)).toBe(1);
      expect(String(result.verify_extras.model_patch)).toContain(fixture.goldEdit.path);
    }
    // the tools were offered to the policy
    const offered = (fake.requests[0]!.tools as Array<{ function: { name: string } }>).map((t) => t.function.name).sort();
    expect(offered).toEqual(['bash', 'str_replace_editor', 'submit']);
    expect(svc.status().live_sandboxes).toBe(0);
  });

  it('a policy that changes nothing gets reward 0 (empty patch), and every sandbox is freed', async () => {
    const { svc } = await setup((_request, turn) => (turn === 0 ? { toolCalls: [{ name: 'bash', arguments: { command: 'ls' } }] } : 'Nothing to do.'));
    const fixture = built.fixtures[0]!;
    await svc.submit([task(fixture, 'lazy')]);
    const result = await svc.wait('lazy');
    expect(result.critical_error).toBeNull();
    expect(result.reward).toBe(0);
    expect(result.verify_extras).toMatchObject({ failure_reason: 'empty_patch', resolved: false, submitted: false });
    expect(result.turns[0]!.tool_calls[0]!.output).toContain('tests');
    expect(svc.status().live_sandboxes).toBe(0);
  });

  it("the row's env reaches the agent's shell and the evaluation; verify_from 'response' takes the diff the policy wrote", async () => {
    const fixture = built.fixtures[0]!;
    const { svc } = await setup((_request, turn) =>
      turn === 0 ? { toolCalls: [{ name: 'bash', arguments: { command: 'echo "[$SWE_ROW_VAR]"' } }] } : `Here is the fix:\n\n\`\`\`diff\n${fixture.goldPatch}\`\`\`\n`,
    );
    const row = {
      ...fixture.row,
      env: { SWE_ROW_VAR: 'from the row' },
      verify_from: 'response',
      test_command: 'test "$SWE_ROW_VAR" = "from the row" && python3 -m pytest -rA {tests}',
    };
    await svc.submit([{ id: 'env', env: 'swe', row, policy: { model: 'fake-policy' } }]);
    const result = await svc.wait('env');
    expect(result.critical_error).toBeNull();
    expect(result.turns[0]!.tool_calls[0]!.output.trim()).toBe('[from the row]');
    expect(result.verify_extras).toMatchObject({ verify_from: 'response', model_patch: fixture.goldPatch, resolved: true });
    expect(result.reward).toBe(1);
    expect(svc.status().live_sandboxes).toBe(0);
  });
});
