// What a sandbox can learn of the host's paths, for host-paths.test.ts (run in-process as root and
// as another user: `setpriv --reuid=65534 ... tsx host-paths-probe.ts <sandboxes> <cache> <image>`,
// then it prints one JSON line). Each sandbox is read from inside through exec (the agent), through
// an entering process (spawn: nsenter) and, without an image, while a Python kernel runs (staged
// source, socket): every /proc file and link that names a path, of every process it can see.
import { createBwrapProvider, type Sandbox } from '@rollserve/core/sandbox';
import { PythonKernel } from '@rollserve/core/sandbox';

/** POSIX sh with cat, ls and tr (an image's root has no more). */
export const DUMP = [
  'for f in /proc/self/mountinfo /proc/self/mounts /proc/mounts /proc/self/mountstats /proc/self/cgroup /proc/self/environ /proc/net/unix; do echo "== $f"; cat "$f" | tr "\\0" " "; done',
  'for p in /proc/[0-9]*; do echo "== $p"; for f in cmdline environ mountinfo cgroup maps; do cat "$p/$f" 2>/dev/null | tr "\\0" " "; echo; done; ls -l "$p/cwd" "$p/root" "$p/exe" "$p/fd/" 2>/dev/null; done',
  'echo "== cwd $(pwd)"',
].join('\n');

export interface Seen {
  exec: string;
  spawned: string;
  stderr: string;
}

/** Runs DUMP in `sandbox` through exec and through an entering process (with a kernel running, when asked). */
export async function look(sandbox: Sandbox, withKernel: boolean): Promise<Seen> {
  const kernel = withKernel ? await PythonKernel.start(sandbox) : undefined;
  try {
    // a command with stdin: its script and stdin are open from the input directory meanwhile
    const exec = await sandbox.exec(DUMP, { stdin: 'some input\n' });
    const child = sandbox.spawn(['/bin/sh', '-c', DUMP]);
    let spawned = '';
    let stderr = exec.stderr;
    child.stdout.on('data', (chunk: Buffer) => (spawned += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    await child.exited;
    return { exec: exec.stdout, spawned, stderr };
  } finally {
    await kernel?.close();
  }
}

if (process.argv[1]?.endsWith('host-paths-probe.ts')) {
  const [tmpDir, imageCacheDir, image] = process.argv.slice(2) as [string, string, string];
  const provider = createBwrapProvider({ tmpDir, imageCacheDir });
  const seen: Record<string, Seen> = {};
  try {
    for (const [label, spec] of [['plain', {}], ['image', { image }]] as const) {
      const sandbox = await provider.create(spec);
      try {
        seen[label] = await look(sandbox, label === 'plain');
        seen[`${label}-id`] = { exec: sandbox.id, spawned: '', stderr: '' };
      } finally {
        await sandbox.close();
      }
    }
  } finally {
    await provider.close?.();
  }
  process.stdout.write(`${JSON.stringify({ uid: process.getuid!(), seen })}\n`);
}
