import { SOCKET_MOUNT, type ResolvedSandboxResources } from '../types.ts';
import { ulimitScript } from '../limits.ts';
import { EXEC_DIR, INPUT_MOUNT } from './args.ts';

/**
 * The in-sandbox exec agent (POSIX sh: dash, bash, busybox). Limits first (the user namespace
 * exists by now, so RLIMIT_NPROC counts this sandbox only); one that cannot be set ends the agent
 * before it says it is ready, so the sandbox never runs without it.
 */
export function agentScript(resources: ResolvedSandboxResources): string {
  return [
    // "$D" is made by bwrap (buildBwrapArgs)
    `D=${SOCKET_MOUNT}/${EXEC_DIR}; I=${INPUT_MOUNT}`,
    ulimitScript(resources, 'exit 1'),
    `printf 'R\\n'`,
    'while IFS= read -r id; do',
    '  i=/dev/null; [ -e "$I/$id.in" ] && i="$I/$id.in"',
    '  ( { ( ROLLSERVE_SANDBOX=$id; export ROLLSERVE_SANDBOX; exec /bin/sh "$I/$id.sh" ) <"$i" >"$D/$id.out" 2>"$D/$id.err"; echo "$id $?"; } & )',
    'done',
  ].join('\n');
}

