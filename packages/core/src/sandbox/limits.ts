import { DEFAULT_RESOURCES, type SandboxResources } from './types.ts';

/*
 * The per-process limits of a sandbox, in the two forms the providers need: `ulimit` calls run
 * inside the sandbox (bwrap, apptainer) and a `prlimit` prefix run on the host (local).
 */

/**
 * The limits as POSIX sh `ulimit` calls, run INSIDE the sandbox's user namespace: RLIMIT_NPROC
 * then counts this sandbox only. (Set outside, before entering, it would count every sandbox's
 * processes of the uid, and setuid/execve fail with EAGAIN once 200 sandboxes run.) bash takes
 * `-u` for processes, dash and busybox `-p`.
 */
export function ulimitScript(resources: SandboxResources = {}): string {
  const r = { ...DEFAULT_RESOURCES, ...resources };
  return (
    `ulimit -c 0 2>/dev/null; ulimit -v ${r.memoryMib * 1024} 2>/dev/null; ulimit -f ${r.maxFileSizeMib * 2048} 2>/dev/null; ` +
    `ulimit -t ${r.cpuSeconds} 2>/dev/null; ulimit -u ${r.maxProcesses} 2>/dev/null || ulimit -p ${r.maxProcesses} 2>/dev/null`
  );
}


export function buildPrlimitArgs(resources: SandboxResources = {}, withNproc = true): string[] {
  const r = { ...DEFAULT_RESOURCES, ...resources };
  const mib = 1024 * 1024;
  return [
    'prlimit',
    `--as=${r.memoryMib * mib}`,
    ...(withNproc ? [`--nproc=${r.maxProcesses}`] : []),
    `--fsize=${r.maxFileSizeMib * mib}`,
    `--cpu=${r.cpuSeconds}`,
    '--core=0',
    '--',
  ];
}


/**
 * rlimits inside the instance (`ulimit -f` counts 512-byte blocks). RLIMIT_NPROC is left alone:
 * without a user namespace of its own it would count every process of the user on the node.
 */
export function limitWrapper(resources: SandboxResources = {}): string[] {
  const r = { ...DEFAULT_RESOURCES, ...resources };
  return [
    '/bin/sh',
    '-c',
    `ulimit -c 0 2>/dev/null; ulimit -v ${r.memoryMib * 1024} 2>/dev/null; ulimit -f ${r.maxFileSizeMib * 2048} 2>/dev/null; ulimit -t ${r.cpuSeconds} 2>/dev/null; exec "$@"`,
    'rollserve-limits',
  ];
}

