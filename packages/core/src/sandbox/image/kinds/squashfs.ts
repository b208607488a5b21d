import { sifRootPartition } from '../sif.ts';
import { imageError, run, safeRead, tool, toolEnv } from '../tools.ts';
import type { ImageKindHandler } from './kind.ts';

// `squashfs:<file>` and `sif:<file>` (an Apptainer image: its primary squashfs partition):
// keyed by the file's sha256, unpacked with unsquashfs; the environment is the one
// docker2singularity wrote.

export const squashfs: ImageKindHandler = {
  source: (parsed) => ({ path: parsed.path, missing: `no image file at ${parsed.path}` }),
  async unpack({ reference, parsed, rootfs, unpackAs }) {
    let offset = 0;
    if (parsed.kind === 'sif') {
      const partition = sifRootPartition(parsed.path);
      if ('error' in partition) throw imageError(reference, `not a usable SIF: ${partition.error}`);
      offset = partition.offset;
    }
    // device nodes, fifos and sockets are not made at all (as root unsquashfs would make them;
    // otherwise it fails on them): the sealed root holds none anyway
    const specials = await squashfsSpecials(reference, parsed.path, offset, unpackAs);
    await tool(
      reference,
      ['unsquashfs', '-no-progress', '-quiet', '-no-xattrs', '-offset', String(offset), ...(specials.length > 0 ? ['-excludes'] : []), '-dest', rootfs, parsed.path, ...specials],
      'unpack the squashfs',
      unpackAs,
    );
    return (root) => ({ env: singularityEnv(root) });
  },
};

/** The device nodes, fifos and sockets of a squashfs (its paths, from `unsquashfs -lln`). */
async function squashfsSpecials(reference: string, file: string, offset: number, as: { uid: number; gid: number } | undefined): Promise<string[]> {
  let listing: string;
  try {
    ({ stdout: listing } = await run('unsquashfs', ['-lln', '-offset', String(offset), file], {
      maxBuffer: 512 * 1024 * 1024,
      env: toolEnv(as),
      cwd: '/',
      ...(as === undefined ? {} : { uid: as.uid, gid: as.gid }),
    }));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return []; // reported by the unpack itself
    const e = error as NodeJS.ErrnoException & { stderr?: string };
    throw imageError(reference, `cannot unpack the squashfs: ${(e.stderr ?? e.message).trim().split('\n').slice(-3).join('\n')}`, error);
  }
  const specials: string[] = [];
  for (const line of listing.split('\n')) {
    if (!/^[bcps]/.test(line)) continue;
    const at = line.indexOf(' squashfs-root/');
    if (at >= 0) specials.push(line.slice(at + ' squashfs-root/'.length));
  }
  return specials;
}

/**
 * The variables of an Apptainer image that docker2singularity wrote as plain `export K="V"` lines
 * (`/.singularity.d/env/10-docker2singularity.sh`); anything that needs a shell to expand is left.
 */
function singularityEnv(rootfs: string): Record<string, string> {
  const env: Record<string, string> = {};
  const text = safeRead(rootfs, '.singularity.d/env/10-docker2singularity.sh');
  if (text === undefined) return env;
  for (const line of text.split('\n')) {
    const match = /^export ([A-Za-z_][A-Za-z0-9_]*)="([^"$`\\]*)"$/.exec(line.trim());
    if (match !== null) env[match[1]!] = match[2]!;
  }
  return env;
}
