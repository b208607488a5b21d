import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import swe, { SWE_EXTRA_KEYS } from '@rollserve/env-swe';
import { createBwrapProvider, registerSandboxProvider } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch, type ResourcesServer, type RunningServer } from '@rollserve/core/gym';
import { call, cookieHeader, describeContract, makeResponse, workspaceRoot } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildSweFixtures, type SweFixture } from './fixtures.ts';

// The SWE environment as a NeMo Gym resources server, end to end on bwrap: seed → tools → verify
// over HTTP with the session cookie, on three small real repositories built here.

const built = buildSweFixtures();
afterAll(() => built.close());
const [calc, textkit, inventory] = built.fixtures as [SweFixture, SweFixture, SweFixture];

describeContract({
  env: swe,
  extraKeys: SWE_EXTRA_KEYS,
  sampleRow: calc.row,
  config: { repos_root: built.root },
  packageDir: join(workspaceRoot(), 'environments', 'swe'),
});

type Verify = Record<string, unknown> & { reward: number };

// bwrap, counting: which sandboxes are open, and in what order they come and go.
const live = new Set<string>();
const events: string[] = [];
registerSandboxProvider('swe-test-counting', () => {
  const inner = createBwrapProvider();
  return {
    name: 'swe-test-counting',
    async create(spec) {
      const sandbox = await inner.create(spec);
      live.add(sandbox.id);
      events.push(`create ${sandbox.id}`);
      const close = sandbox.close.bind(sandbox);
      sandbox.close = async () => {
        if (live.delete(sandbox.id)) events.push(`close ${sandbox.id}`);
        await close();
      };
      return sandbox;
    },
  };
});

describe('swe over the NeMo Gym face (bwrap)', () => {
  let app: ResourcesServer;
  let running: RunningServer;
  let url: string;

  beforeAll(async () => {
    app = createResourcesServer(swe, { config: { sandbox_provider: 'swe-test-counting', repos_root: built.root, binds_root: built.root } });
    running = await serveFetch(app);
    url = running.url;
  });
  afterAll(async () => {
    await running?.close();
    await app?.close();
  });

  /** One rollout: seed, the given tool calls (as an agent makes them), verify; all with the cookie. */
  async function rollout(
    fixture: SweFixture,
    calls: Array<[tool: string, args: Record<string, unknown>]>,
    response = makeResponse([{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'Done.', annotations: [] }] }]),
  ): Promise<{ verify: Verify; outputs: string[] }> {
    events.length = 0;
    const seed = await call(url, 'POST', '/seed_session', fixture.row);
    expect(seed.status, seed.text).toBe(200);
    expect(live.size).toBe(1);
    expect((seed.json as { sandbox_handle: string }).sandbox_handle).toMatch(/^rs-/);
    const cookie = cookieHeader(seed.setCookies);
    const outputs: string[] = [];
    for (const [tool, args] of calls) {
      const answer = await call(url, 'POST', `/${tool}`, args, { cookie });
      expect(answer.status, answer.text).toBe(200);
      outputs.push(typeof answer.json === 'string' ? answer.json : answer.text);
    }
    const verify = await call(url, 'POST', '/verify', { ...fixture.row, response }, { cookie });
    expect(verify.status, verify.text).toBe(200);
    expect(live.size).toBe(0); // the agent's sandbox and the eval one are both gone
    return { verify: verify.json as Verify, outputs };
  }

  /** The agent writes the patch with the editor and applies it with bash. */
  const applyPatch = (patch: string): Array<[string, Record<string, unknown>]> => [
    ['str_replace_editor', { command: 'create', path: '/tmp/agent.patch', file_text: patch }],
    ['bash', { command: 'git apply /tmp/agent.patch && git status --short' }],
  ];

  it.each([0, 1, 2, 3])('the gold patch resolves fixture %i (reward 1, every test counted)', async (index) => {
    const fixture = built.fixtures[index]!;
    const { verify, outputs } = await rollout(fixture, [...applyPatch(fixture.goldPatch), ['submit', {}]]);
    expect(outputs[2]).toContain('submitted');
    // the agent's sandbox is released before the fresh eval sandbox starts
    expect(events.map((e) => e.split(' ')[0])).toEqual(['create', 'close', 'create', 'close']);
    expect(events[0]!.split(' ')[1]).toBe(events[1]!.split(' ')[1]);
    expect(events[2]!.split(' ')[1]).not.toBe(events[0]!.split(' ')[1]);
    expect(verify.failure_reason, String(verify.test_output)).toBeNull();
    expect(verify).toMatchObject({
      reward: 1,
      resolved: true,
      evaluation_completed: true,
      submitted: true,
      apply_failed: false,
      patch_applied_with: 'git apply',
      f2p_passed: fixture.failToPass.length,
      f2p_total: fixture.failToPass.length,
      p2p_passed: fixture.passToPass.length,
      p2p_total: fixture.passToPass.length,
      failed_tests: [],
      instance_id: fixture.row.instance_id,
    });
    // the model patch is the agent's diff: the gold change and nothing else (no /tmp file, no pyc)
    expect(verify.model_patch).toContain(`diff --git a/${fixture.goldEdit.path} b/${fixture.goldEdit.path}`);
    expect(String(verify.model_patch).match(/^diff --git/gm)).toHaveLength(1);
    for (const key of ['seed_time', 'diff_time', 'eval_sandbox_start_time_taken', 'patch_verification_time_taken', 'eval_time']) {
      expect(verify[key], key).toBeGreaterThan(0);
    }
    expect(Object.keys(verify).filter((k) => !['reward', 'responses_create_params', 'response'].includes(k)).sort()).toEqual([...SWE_EXTRA_KEYS].sort());
  });

  it("runs the row's setup_script in the agent's sandbox and in the eval one; what it makes is not in the patch", async () => {
    const row = {
      ...calc.row,
      setup_script: "printf 'GENERATED = 1\\n' > calc/generated.py && mkdir -p build && echo artefact > build/out.txt",
      test_command: 'test -f calc/generated.py && test -f build/out.txt && python3 -m pytest -rA {tests}',
    };
    const { verify, outputs } = await rollout({ ...calc, row }, [['bash', { command: 'cat calc/generated.py; git status --short | wc -l' }], ...applyPatch(calc.goldPatch)]);
    expect(outputs[0]!.trim().split('\n')).toEqual(['GENERATED = 1', '0']);
    expect(verify).toMatchObject({ reward: 1, resolved: true });
    expect(verify.model_patch).not.toContain('generated.py');
    const skipped = await rollout({ ...calc, row: { ...row, setup_script: 'true' } }, applyPatch(calc.goldPatch));
    // the test command needs the setup: without it no test runs
    expect(skipped.verify).toMatchObject({ reward: 0, evaluation_completed: true, f2p_passed: 0, p2p_passed: 0, failure_reason: 'tests_missing' });
  });

  it('an empty patch is reward 0 with the reason, and no eval sandbox is started', async () => {
    const { verify } = await rollout(calc, [['bash', { command: 'ls' }]]);
    expect(verify).toMatchObject({ reward: 0, resolved: false, evaluation_completed: false, model_patch: '', failure_reason: 'empty_patch', submitted: false });
    expect(verify.eval_sandbox_start_time_taken).toBe(0);
  });

  it('an agent that destroys the git repository gets reward 0 (diff_failed), its sandbox still released', async () => {
    const { verify } = await rollout(calc, [...applyPatch(calc.goldPatch), ['bash', { command: 'rm -rf .git' }]]);
    expect(verify).toMatchObject({ reward: 0, evaluation_completed: false, model_patch: '', failure_reason: 'diff_failed' });
    expect(verify.failure_detail).toMatch(/not a git repository/);
  });

  it('a patch that fixes the bug but breaks a PASS_TO_PASS test is reward 0', async () => {
    const { verify } = await rollout(calc, applyPatch(calc.breakingPatch));
    expect(verify).toMatchObject({ reward: 0, resolved: false, evaluation_completed: true, failure_reason: 'tests_failed', f2p_passed: 1, p2p_passed: 1 });
    expect(verify.failed_tests).toEqual([
      { id: 'tests/test_stats.py::test_mean', kind: 'PASS_TO_PASS', status: 'FAILED' },
      { id: 'tests/test_stats.py::test_variance', kind: 'PASS_TO_PASS', status: 'FAILED' },
    ]);
    expect(verify.test_output).toContain('FAILED tests/test_stats.py::test_mean');
  });

  it('a patch that does not apply in the eval sandbox is reward 0 with the reason', async () => {
    // An agent's diff is taken against base, so it applies; patches that do not come from the
    // sandbox (the gold patch verified with is_verifying_golden_patch, as NeMo Gym does) may not.
    const golden = createResourcesServer(swe, { config: { is_verifying_golden_patch: true, repos_root: built.root } });
    const server = await serveFetch(golden);
    try {
      const response = makeResponse([]);
      const answer = await call(server.url, 'POST', '/verify', { ...textkit.row, patch: textkit.unappliablePatch, response });
      expect(answer.status).toBe(200);
      expect(answer.json).toMatchObject({ reward: 0, resolved: false, evaluation_completed: false, apply_failed: true, failure_reason: 'patch_failed' });
      expect((answer.json as Verify).failure_detail).toMatch(/^the patch does not apply:\n[\s\S]*(patch does not apply|hunk)/i);
      expect((answer.json as Verify).model_patch).toBe(textkit.unappliablePatch);
      // the same server resolves the gold patch without any session: stateless golden verification
      const gold = await call(server.url, 'POST', '/verify', { ...textkit.row, response });
      expect(gold.json).toMatchObject({ reward: 1, resolved: true, f2p_passed: 2, p2p_passed: 4 });
    } finally {
      await server.close();
      await golden.close();
    }
  });

  it('a test_patch that does not apply, or tests past the time limit, are reward 0 with their reasons', async () => {
    const golden = createResourcesServer(swe, { config: { is_verifying_golden_patch: true, evaluation_timeout: 2, repos_root: built.root } });
    const server = await serveFetch(golden);
    try {
      const response = makeResponse([]);
      const badTests = await call(server.url, 'POST', '/verify', { ...inventory.row, test_patch: calc.testPatch, response });
      expect(badTests.json).toMatchObject({ reward: 0, evaluation_completed: false, apply_failed: false, patch_applied_with: 'git apply', failure_reason: 'patch_failed' });
      expect((badTests.json as Verify).failure_detail).toMatch(/^test_patch does not apply:/);
      const conftest = 'diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1,2 @@\n+import time\n+time.sleep(30)\n';
      const slow = `${inventory.testPatch}${conftest}`;
      const sleepy = await call(server.url, 'POST', '/verify', { ...inventory.row, test_patch: slow, response });
      expect(sleepy.json, JSON.stringify(sleepy.json)).toMatchObject({ reward: 0, evaluation_completed: false, failure_reason: 'tests_timeout' });
      expect((sleepy.json as Verify).patch_verification_time_taken).toBeGreaterThanOrEqual(2);
      expect((sleepy.json as Verify).failure_detail).toContain('timed out');
    } finally {
      await server.close();
      await golden.close();
    }
  });

  it("the agent's copy has base_commit's tree and no other history", async () => {
    const { outputs, verify } = await rollout(inventory, [
      ['bash', { command: 'pwd; git log --all --oneline | wc -l; git status --short | wc -l' }],
      ['bash', { command: `git cat-file -t ${inventory.futureCommit} 2>&1; git cat-file -t ${inventory.baseCommit} 2>&1; grep -c "raise KeyError" inventory/store.py` }],
      ['bash', { command: 'grep -rl "test_remove_too_many" . | wc -l; git count-objects -v | grep -E "^(count|in-pack):"' }],
    ]);
    expect(outputs[0]!.trim().split('\n')).toEqual(['/workspace', '1', '0']);
    expect(outputs[1]!.match(/could not get object info/g)).toHaveLength(2); // neither the future fix nor the real base sha exists
    expect(outputs[1]).toMatch(/^0$/m); // the bug is there
    expect(outputs[2]!.trim().split('\n')[0]).toBe('0'); // the tests the fix adds are nowhere, .git included
    expect(verify.failure_reason).toBe('empty_patch');
  });

  it('edits to test files cannot game the tests: test_patch is applied over base test files', async () => {
    const gamed = `${inventory.goldPatch}`; // a correct fix, plus a test file rewritten to pass anything
    const { verify } = await rollout(inventory, [
      ...applyPatch(gamed),
      ['bash', { command: `printf 'def test_nothing():\\n    pass\\n' > tests/test_store.py` }],
    ]);
    expect(verify.model_patch).toContain('tests/test_store.py');
    expect(verify).toMatchObject({ reward: 1, resolved: true, f2p_passed: 2, p2p_passed: 4 });
  });

  it('a row naming a commit its repository lacks is a 422 and holds no sandbox', async () => {
    const seed = await call(url, 'POST', '/seed_session', { ...calc.row, base_commit: 'f'.repeat(40) });
    expect(seed.status, seed.text).toBe(422);
    expect(seed.json).toEqual({ detail: [expect.objectContaining({ type: 'value_error', loc: ['body', 'base_commit'], msg: expect.stringContaining('cannot read') })] });
    expect(live.size).toBe(0);
  });

  it('a row whose repo_dir the sandbox cannot write (/testbed without an image) is a 422 naming repo_dir, and holds no sandbox', async () => {
    const seed = await call(url, 'POST', '/seed_session', { ...calc.row, repo_dir: '/testbed' });
    expect(seed.status, seed.text).toBe(422);
    expect(seed.json).toEqual({ detail: [expect.objectContaining({ type: 'value_error', loc: ['body', 'repo_dir'], msg: expect.stringContaining('Read-only file system') })] });
    expect(live.size).toBe(0);
  });

  it("a row's image that does not exist is a 422 naming it, and holds no sandbox", async () => {
    const { repo_path: _local, ...row } = calc.row;
    const seed = await call(url, 'POST', '/seed_session', { ...row, image: 'oci:/nonexistent/sweb.eval.x86_64.fixtures_1776_calc-1:latest' });
    expect(seed.status, seed.text).toBe(422);
    expect(seed.text).toContain('/nonexistent/sweb.eval.x86_64.fixtures_1776_calc-1');
    expect(live.size).toBe(0);
  });

  it('an unknown test_parser is a FastAPI 422 on /seed_session and /verify, never a 500', async () => {
    for (const path of ['/seed_session', '/verify']) {
      const answer = await call(url, 'POST', path, { ...calc.row, test_parser: 'bin/test', response: makeResponse([]) });
      expect(answer.status, answer.text).toBe(422);
      const detail = (answer.json as { detail: Array<Record<string, unknown>> }).detail;
      expect(detail).toEqual([expect.objectContaining({ type: 'value_error', loc: ['body', 'test_parser'], input: 'bin/test' })]);
      expect(detail[0]!.msg).toMatch(/^Value error, unknown test_parser "bin\/test" \(known: pytest, .*django.*sympy/);
    }
    expect(live.size).toBe(0);
  });

  it('verify without a seeded session is reward 0 (no agent sandbox), never a 5xx', async () => {
    const answer = await call(url, 'POST', '/verify', { ...calc.row, response: makeResponse([]) });
    expect(answer.status).toBe(200);
    expect(answer.json).toMatchObject({ reward: 0, failure_reason: 'no_agent_sandbox', evaluation_completed: false });
  });

  describe("SWE-bench's specs, failure reasons, env, binds and verify_from", () => {
    let golden: ResourcesServer;
    let goldenServer: RunningServer;
    beforeAll(async () => {
      golden = createResourcesServer(swe, { config: { is_verifying_golden_patch: true, repos_root: built.root } });
      goldenServer = await serveFetch(golden);
    });
    afterAll(async () => {
      await goldenServer?.close();
      await golden?.close();
    });
    const verifyGold = async (row: Record<string, unknown>): Promise<Verify> => {
      const answer = await call(goldenServer.url, 'POST', '/verify', { ...row, response: makeResponse([]) });
      expect(answer.status, answer.text).toBe(200);
      return answer.json as Verify;
    };

    it("a django/django row runs SWE-bench's runtests.py command on test_patch's modules and reads it with the django parser", async () => {
      const shop = built.fixtures[3]!;
      const gold = await verifyGold(shop.row);
      expect(gold).toMatchObject({ reward: 1, test_command: "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 'pricing_tests.tests'" });
      expect(gold.test_output).toContain('test_total_many (pricing_tests.tests.PricingTests.test_total_many) ... ok');
      const broken = await verifyGold({ ...shop.row, patch: shop.breakingPatch });
      expect(broken).toMatchObject({ reward: 0, evaluation_completed: true, failure_reason: 'tests_failed', f2p_passed: 1, p2p_passed: 1 });
      expect(broken.failed_tests).toEqual([{ id: 'The cheapest price is the smallest one.', kind: 'PASS_TO_PASS', status: 'FAILED' }]);
    });

    it("a pytest-dev/pytest row runs SWE-bench's `pytest -rA` (the sandbox's pytest, no cache plugin flag)", async () => {
      // SWE-bench's images install the package; here the row's env puts it on the path
      const row = { ...calc.row, repo: 'pytest-dev/pytest', version: '8.4', env: { PYTHONPATH: '/workspace' } };
      const verify = await verifyGold(row);
      expect(verify, String(verify.test_output)).toMatchObject({ reward: 1, resolved: true, test_command: "pytest -rA 'tests/test_stats.py'" });
      expect(verify.test_output).not.toContain('cacheprovider');
      const { env: _env, ...bare } = row;
      // without it `import calc` fails at collection: the file ERRORs and none of the tests runs
      expect(await verifyGold(bare)).toMatchObject({ reward: 0, failure_reason: 'tests_missing' });
    });

    it('tests that do not exist, or a command that runs none, are tests_missing; a failing one tests_failed', async () => {
      const missing = await verifyGold({ ...calc.row, FAIL_TO_PASS: ['tests/test_stats.py::test_not_there'], PASS_TO_PASS: [] });
      expect(missing).toMatchObject({ reward: 0, evaluation_completed: true, failure_reason: 'tests_missing', failed_tests: [{ id: 'tests/test_stats.py::test_not_there', kind: 'FAIL_TO_PASS', status: 'MISSING' }] });
      expect(missing.failure_detail).toMatch(/^none of the 1 FAIL_TO_PASS \/ PASS_TO_PASS tests is in the output of `python3 -m pytest -rA 'tests\/test_stats.py'` \(exit 0, parser pytest\)$/);
      const none = await verifyGold({ ...calc.row, test_command: 'echo no tests here' });
      expect(none).toMatchObject({ reward: 0, failure_reason: 'tests_missing', f2p_passed: 0, p2p_passed: 0 });
      // one expected test missing among ones that ran is a failure like any other
      const some = await verifyGold({ ...calc.row, FAIL_TO_PASS: [...calc.failToPass, 'tests/test_stats.py::test_not_there'] });
      expect(some).toMatchObject({ reward: 0, failure_reason: 'tests_failed', f2p_passed: 1 });
    });

    it("the row's env is in the agent's shell and in the evaluation; without it the tests do not run", async () => {
      const row = { ...calc.row, env: { SWE_ROW_VAR: 'from the row' }, test_command: 'test "$SWE_ROW_VAR" = "from the row" && python3 -m pytest -rA {tests}' };
      const { verify, outputs } = await rollout({ ...calc, row }, [['bash', { command: 'echo "[$SWE_ROW_VAR]"' }], ...applyPatch(calc.goldPatch)]);
      expect(outputs[0]!.trim()).toBe('[from the row]');
      expect(verify).toMatchObject({ reward: 1, resolved: true });
      const { env: _env, ...without } = row;
      const { verify: bare } = await rollout({ ...calc, row: without }, applyPatch(calc.goldPatch));
      expect(bare).toMatchObject({ reward: 0, failure_reason: 'tests_missing' });
    });

    it("the row's binds are in the agent's sandbox (read-only) and in the evaluation", async () => {
      // under binds_root: the root the operator gives rows' binds (the fixtures' directory here)
      const data = mkdtempSync(join(built.root, 'bind-'));
      try {
        writeFileSync(join(data, 'hello.txt'), 'bound in\n');
        chmodSync(data, 0o755); // the sandbox's user is not the owner
        const row = { ...calc.row, binds: [{ host: data, sandbox: '/tmp/swe-data' }], test_command: 'test -f /tmp/swe-data/hello.txt && python3 -m pytest -rA {tests}' };
        const { verify, outputs } = await rollout({ ...calc, row }, [
          ['bash', { command: 'cat /tmp/swe-data/hello.txt; touch /tmp/swe-data/new 2>/dev/null || echo read-only' }],
          ...applyPatch(calc.goldPatch),
        ]);
        expect(outputs[0]!.trim().split('\n')).toEqual(['bound in', 'read-only']);
        expect(verify).toMatchObject({ reward: 1, resolved: true });
      } finally {
        rmSync(data, { recursive: true, force: true });
      }
    });

    it("verify_from 'response' evaluates the diff in the response text and still releases the agent's sandbox", async () => {
      const text = `The fix:\n\n\`\`\`diff\n${textkit.goldPatch}\`\`\`\n`;
      const response = makeResponse([{ id: 'm', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] }]);
      // the agent's sandbox holds a different (wrong) change: the response's diff is what counts
      const { verify } = await rollout({ ...textkit, row: { ...textkit.row, verify_from: 'response' } }, applyPatch(textkit.breakingPatch), response);
      expect(verify).toMatchObject({ reward: 1, resolved: true, verify_from: 'response', model_patch: textkit.goldPatch, diff_time: 0 });
      // without a session too, and a response without a diff is an empty patch
      const stateless = await call(url, 'POST', '/verify', { ...textkit.row, verify_from: 'response', response });
      expect(stateless.json).toMatchObject({ reward: 1, verify_from: 'response' });
      const empty = await call(url, 'POST', '/verify', { ...textkit.row, verify_from: 'response', response: makeResponse([]) });
      expect(empty.json).toMatchObject({ reward: 0, failure_reason: 'empty_patch', evaluation_completed: false });
      expect(live.size).toBe(0);
    });
  });
});
