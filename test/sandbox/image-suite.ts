import { readdirSync, rmSync } from 'node:fs';
import { afterAll, afterEach, expect } from 'vitest';
import type { Sandbox, SandboxProvider } from '@rollserve/core/sandbox';

// Test-only (vitest hooks): kept apart from image-fixtures.ts, which the benches import too.

/**
 * An image suite's cleanup: the sandboxes a test left in `open` closed after it; after the suite
 * its provider closed, its directory removed, and every sandbox's directory gone from `sandboxDir`.
 */
export function closeImageSuite(state: () => { provider: SandboxProvider | undefined; dir: string; sandboxDir: string }, open: Sandbox[]): void {
  afterEach(async () => {
    await Promise.all(open.splice(0).map((sandbox) => sandbox.close()));
  });

  afterAll(async () => {
    const { provider, dir, sandboxDir } = state();
    await provider?.close?.();
    const left = readdirSync(sandboxDir);
    rmSync(dir, { recursive: true, force: true });
    // every sandbox's directory went with it
    expect(left).toEqual([]);
  });
}
