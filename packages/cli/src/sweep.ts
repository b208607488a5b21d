import { removeStaleSandboxDirs, sweepOrphanedSandboxDirs } from '@rollserve/core/sandbox';

let orphanSweep: (() => void) | undefined;

/**
 * Sandbox directories left by a service or node that was killed (its processes died with it): at
 * start, then those whose maker is gone every 30 s (another node of this host killed meanwhile).
 */
export async function sweepStaleSandboxes(): Promise<void> {
  const removed = await removeStaleSandboxDirs();
  if (removed.length > 0) console.error(`removed ${removed.length} sandbox directories left by a stopped service`);
  orphanSweep ??= sweepOrphanedSandboxDirs();
}
