import { execFile } from 'node:child_process';
import { readFileSync, realpathSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { RolloutError } from '../../errors.ts';

// What the resolver and every image kind share: the error of a bad image, the unpack tools, and
// reading a file of an unpacked root.

export const run = promisify(execFile);

/** An image that cannot be used (missing, corrupt, unsafe): UNPROCESSABLE, a 422. */
export const imageError = (reference: string, message: string, cause?: unknown): RolloutError =>
  new RolloutError({ code: 'UNPROCESSABLE', message: `image ${JSON.stringify(reference)}: ${message}`, cause, details: { image: reference } });

/** Runs an unpack tool (as `as` under a root service); a missing one is UNAVAILABLE, a failing one an imageError. */
export async function tool(reference: string, argv: string[], what: string, as?: { uid: number; gid: number }, signal?: AbortSignal): Promise<void> {
  try {
    await run(argv[0]!, argv.slice(1), {
      maxBuffer: 16 * 1024 * 1024,
      env: toolEnv(as),
      cwd: '/',
      ...(signal === undefined ? {} : { signal }),
      ...(as === undefined ? {} : { uid: as.uid, gid: as.gid }),
    });
  } catch (error) {
    const e = error as NodeJS.ErrnoException & { stderr?: string; stdout?: string };
    if (e.code === 'ENOENT') throw missingTool(argv[0]!, error);
    const detail = `${e.stderr ?? ''}${e.stdout ?? ''}`.trim().split('\n').slice(-5).join('\n');
    throw imageError(reference, `cannot ${what}: ${detail || e.message}`, error);
  }
}

/** An unpack tool that is not installed: UNAVAILABLE. */
export const missingTool = (name: string, cause: unknown): RolloutError =>
  new RolloutError({ code: 'UNAVAILABLE', message: `${name} is not installed; images need umoci, skopeo and squashfs-tools (apt-get install umoci skopeo squashfs-tools)`, cause });

/** The unpack tools' environment: the service's, without a HOME another uid cannot use. */
export function toolEnv(as: { uid: number; gid: number } | undefined): NodeJS.ProcessEnv {
  return as === undefined ? { ...process.env, LC_ALL: 'C' } : { PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C', HOME: '/', TMPDIR: '/tmp' };
}

/**
 * A file of an unpacked root read by the service (its passwd, group, environment script): only
 * when it is a regular file whose real path stays inside the root. An image's symlink leads to
 * the host's files when followed from outside the sandbox, so one that leaves the root is not read.
 */
export function safeRead(rootfs: string, path: string): string | undefined {
  try {
    const real = realpathSync(join(rootfs, path));
    const root = realpathSync(rootfs);
    if (!real.startsWith(`${root}/`) || !statSync(real).isFile()) return undefined;
    return readFileSync(real, 'utf8');
  } catch {
    return undefined;
  }
}
