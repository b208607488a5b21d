import { lstatSync, readdirSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { removeStaleCgroups } from './cgroup.ts';

/**
 * Removes the temporary directories and cgroups of sandboxes whose service died without closing
 * them (their processes died with it: --die-with-parent). A directory is stale when no process's
 * command line names it and it is older than `minAgeMs`; a cgroup when it is that old and empty.
 * Call once at service start. Returns what it removed. `ids` limits it to those sandboxes.
 */
export async function removeStaleSandboxDirs(options: { tmpDir?: string; minAgeMs?: number; ids?: string[] } = {}): Promise<string[]> {
  const dir = options.tmpDir ?? tmpdir();
  const minAgeMs = options.minAgeMs ?? 60_000;
  const only = options.ids === undefined ? undefined : new Set(options.ids.map((id) => `rollserve-${id}`));
  const cgroups = removeStaleCgroups({ minAgeMs, ...(only === undefined ? {} : { only: (name: string) => only.has(name) }) });
  let names: string[];
  try {
    names = readdirSync(dir).filter((name) => /^rollserve-rs-[0-9a-f]{12}$/.test(name) && (only === undefined || only.has(name)));
  } catch {
    return cgroups;
  }
  if (names.length === 0) return cgroups;
  if (names.length === 0) return [];
  const cmdlines: string[] = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      cmdlines.push(readFileSync(`/proc/${pid}/cmdline`, 'latin1'));
    } catch {
      // exited
    }
  }
  const removed: string[] = [];
  for (const name of names) {
    const path = join(dir, name);
    try {
      if (Date.now() - lstatSync(path).mtimeMs < minAgeMs) continue;
    } catch {
      continue;
    }
    if (cmdlines.some((cmdline) => cmdline.includes(path))) continue;
    await rm(path, { recursive: true, force: true });
    removed.push(path);
  }
  return [...cgroups, ...removed];
}

