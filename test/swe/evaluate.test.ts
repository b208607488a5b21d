import { evaluatePatch, resolveInstance, SweConfig, SweRow } from '@rollserve/env-swe';
import { createBwrapProvider, type Sandbox, type SandboxProvider } from '@rollserve/core/sandbox';
import { afterAll, describe, expect, it } from 'vitest';
import { buildSweFixtures } from './fixtures.ts';

// evaluatePatch on its own: an abort (the rollout's time limit, a cancel) ends the eval sandbox at
// once, whatever it is running.

const built = buildSweFixtures();
afterAll(() => built.close());

function trackingProvider(): { provider: SandboxProvider; open: Set<Sandbox> } {
  const inner = createBwrapProvider();
  const open = new Set<Sandbox>();
  return {
    open,
    provider: {
      name: 'tracking',
      async create(spec) {
        const sandbox = await inner.create(spec);
        open.add(sandbox);
        const close = sandbox.close.bind(sandbox);
        sandbox.close = async () => {
          open.delete(sandbox);
          await close();
        };
        return sandbox;
      },
    },
  };
}

// The tests mark that they run (a file in the sandbox's /tmp), then sleep.
const CONFTEST_SLEEP =
  "diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1,3 @@\n+import time\n+open('/tmp/rollserve-tests-running', 'w').close()\n+time.sleep(60)\n";

describe('evaluatePatch', () => {
  it('an abort during the tests closes the eval sandbox and reports it, within a second', async () => {
    const fixture = built.fixtures[0]!;
    const config = SweConfig.parse({ repos_root: built.root });
    const instance = resolveInstance(SweRow.parse({ ...fixture.row, test_patch: `${fixture.testPatch}${CONFTEST_SLEEP}` }), config);
    const { provider, open } = trackingProvider();
    const controller = new AbortController();
    const running = evaluatePatch(instance, fixture.goldPatch, { provider, config, signal: controller.signal });
    while (open.size === 0) await new Promise((r) => setTimeout(r, 10));
    const sandbox = [...open][0]!;
    while ((await sandbox.exec('test -e /tmp/rollserve-tests-running')).returnCode !== 0) await new Promise((r) => setTimeout(r, 20));
    controller.abort();
    const outcome = await running;
    expect(outcome).toMatchObject({ evaluation_completed: false, resolved: false, failure_reason: 'eval_sandbox_failed', patch_applied_with: 'git apply' });
    expect(open.size).toBe(0);
  });

  it('an already aborted verify starts nothing it leaves behind', async () => {
    const fixture = built.fixtures[1]!;
    const config = SweConfig.parse({ repos_root: built.root });
    const { provider, open } = trackingProvider();
    const outcome = await evaluatePatch(resolveInstance(SweRow.parse(fixture.row), config), fixture.goldPatch, { provider, config, signal: AbortSignal.abort() });
    expect(outcome).toMatchObject({ evaluation_completed: false, failure_reason: 'eval_sandbox_failed', failure_detail: 'verify was aborted' });
    expect(open.size).toBe(0);
  });
});
