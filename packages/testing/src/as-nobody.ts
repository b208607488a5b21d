import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { workspaceRoot } from './fixtures.ts';

/**
 * Runs `script` (an ES module, TypeScript through tsx) in a new Node as uid and gid 65534 with no
 * supplementary groups, from the workspace root: the service as an unprivileged user runs it. Its
 * environment is PATH and HOME=/tmp alone. Tests parse the last line it prints.
 */
export function runScriptAsNobody(script: string, timeoutMs = 60_000): SpawnSyncReturns<string> {
  return spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: workspaceRoot(),
    encoding: 'utf8',
    timeout: timeoutMs,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp' },
  });
}
