import type { Sandbox } from '../sandbox/types.ts';

/**
 * Sandboxes ended because a channel to the service (the Python kernel's socket, the bash tool's
 * terminal) carried more than its bound, with why. The tool that saw the flood ends the sandbox at
 * once; the session's `limitExceeded()` then reports it as any other sandbox limit, so the rollout
 * ends with RESOURCE_LIMIT (the policy's doing, as a sandbox that fills its memory).
 */
const ended = new WeakMap<Sandbox, string>();

/** Ends `sandbox` for a flooded channel: its processes are killed now, and `reason` is kept. */
export function endSandboxForChannel(sandbox: Sandbox, reason: string): void {
  if (ended.has(sandbox)) return;
  ended.set(sandbox, reason);
  void sandbox.close().catch(() => undefined);
}

/** Why `sandbox` was ended for a flooded channel, if it was. */
export function channelLimitOf(sandbox: Sandbox | undefined): string | undefined {
  return sandbox === undefined ? undefined : ended.get(sandbox);
}
