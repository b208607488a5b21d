import { rmSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { sifRootPartition } from '../sif.ts';
import { imageError, missingTool, run, safeRead, tool, toolEnv } from '../tools.ts';
import type { ImageKindHandler } from './kind.ts';

// `squashfs:<file>` and `sif:<file>` (an Apptainer image: its primary squashfs partition):
// keyed by the file's sha256, unpacked with unsquashfs; the environment is the one
// docker2singularity wrote.
//
// unsquashfs has one writer: on a disk where creating a file costs hundreds of microseconds of
// kernel time (this CI's ext4: 276 µs an openat(O_CREAT), 4.4 s of a 218 MB image's 16,000 files)
// the unpack is bound by file creation, one file at a time. So a large image's files are split
// into contiguous runs of its listing and unpacked by several unsquashfs at once into the same
// root (`-ef`, `-f` so that the directories they share are made by whichever comes first).

/** Images with fewer files are unpacked by one unsquashfs. */
const PARALLEL_MIN_FILES = 2000;
/** unsquashfs processes at most for one image. */
const PARALLEL_MAX = 4;

export const squashfs: ImageKindHandler = {
  source: (parsed) => ({ path: parsed.path, missing: `no image file at ${parsed.path}` }),
  async unpack({ reference, parsed, rootfs, staging, unpackAs, signal }) {
    let offset = 0;
    if (parsed.kind === 'sif') {
      const partition = sifRootPartition(parsed.path);
      if ('error' in partition) throw imageError(reference, `not a usable SIF: ${partition.error}`);
      offset = partition.offset;
    }
    const listing = await squashfsListing(reference, parsed.path, offset, unpackAs, signal);
    const workers = Math.min(PARALLEL_MAX, availableParallelism(), Math.floor(listing.leaves.length / (PARALLEL_MIN_FILES / 2)));
    if (listing.exact && workers >= 2) {
      const made = await unpackInParallel(reference, parsed.path, offset, rootfs, staging, listing.leaves, workers, unpackAs, signal);
      // what the listing names and the workers made are counted, not assumed (a name unsquashfs
      // reads back differently from an extract file would be missing): else one unsquashfs again
      if (made === listing.leaves.filter((leaf) => leaf.type !== 'd').length) return (root) => ({ env: singularityEnv(root) });
    }
    // device nodes, fifos and sockets are not made at all (as root unsquashfs would make them;
    // otherwise it fails on them): the sealed root holds none anyway
    const specials = listing.specials;
    await tool(
      reference,
      ['unsquashfs', '-f', '-no-progress', '-quiet', '-no-xattrs', '-offset', String(offset), ...(specials.length > 0 ? ['-excludes'] : []), '-dest', rootfs, parsed.path, ...specials],
      'unpack the squashfs',
      unpackAs,
      signal,
    );
    return (root) => ({ env: singularityEnv(root) });
  },
};

interface Listing {
  /** Files, symlinks and empty directories to unpack (no device node, fifo or socket), in the image's order. */
  leaves: Array<{ name: string; type: string }>;
  /** Device nodes, fifos and sockets (their paths). */
  specials: string[];
  /** False when a name cannot be read back from the listing exactly (a newline in it). */
  exact: boolean;
}

/** The files of a squashfs (`unsquashfs -lc` for the names, `-llc` for their types, in the same order). */
async function squashfsListing(reference: string, file: string, offset: number, as: { uid: number; gid: number } | undefined, signal: AbortSignal | undefined): Promise<Listing> {
  const list = async (flag: string): Promise<string[]> => {
    try {
      const { stdout } = await run('unsquashfs', [flag, '-offset', String(offset), file], {
        maxBuffer: 512 * 1024 * 1024,
        env: toolEnv(as),
        cwd: '/',
        ...(signal === undefined ? {} : { signal }),
        ...(as === undefined ? {} : { uid: as.uid, gid: as.gid }),
      });
      return stdout.split('\n').filter((line) => line !== '');
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return []; // reported by the unpack itself
      const e = error as NodeJS.ErrnoException & { stderr?: string };
      throw imageError(reference, `cannot unpack the squashfs: ${(e.stderr ?? e.message).trim().split('\n').slice(-3).join('\n')}`, error);
    }
  };
  const [names, typed] = await Promise.all([list('-lc'), list('-llc')]);
  const prefix = 'squashfs-root/';
  const leaves: Listing['leaves'] = [];
  const specials: string[] = [];
  // a name with a newline shows as two lines, the second without the prefix
  let exact = names.length === typed.length;
  for (let i = 0; i < typed.length; i++) {
    const line = typed[i]!;
    const name = names[i];
    const known = exact && name !== undefined && name.startsWith(prefix);
    if (!known) exact = false;
    if (/^[bcps]/.test(line)) {
      const at = line.indexOf(` ${prefix}`);
      if (known) specials.push(name.slice(prefix.length));
      else if (at >= 0) specials.push(line.slice(at + 1 + prefix.length));
    } else if (known) {
      leaves.push({ name: name.slice(prefix.length), type: line[0]! });
    }
  }
  return { leaves, specials, exact };
}

/**
 * Unpacks `leaves` with `workers` unsquashfs at once, each a contiguous run of them (files of one
 * directory mostly go to one), into `rootfs`; returns how many files and symlinks they made.
 */
async function unpackInParallel(
  reference: string,
  file: string,
  offset: number,
  rootfs: string,
  staging: string,
  leaves: Listing['leaves'],
  workers: number,
  as: { uid: number; gid: number } | undefined,
  signal: AbortSignal | undefined,
): Promise<number> {
  const per = Math.ceil(leaves.length / workers);
  const counts = await Promise.all(
    Array.from({ length: workers }, async (_, i) => {
      const list = join(staging, `extract-${i}`);
      // read by the unpacking uid; -no-wildcards: each line is a path, not a pattern
      writeFileSync(list, `${leaves.slice(i * per, (i + 1) * per).map((leaf) => leaf.name).join('\n')}\n`, { mode: 0o644 });
      let stdout: string;
      try {
        ({ stdout } = await run('unsquashfs', ['-f', '-no-progress', '-no-xattrs', '-no-wildcards', '-offset', String(offset), '-dest', rootfs, '-ef', list, file], {
          maxBuffer: 16 * 1024 * 1024,
          env: toolEnv(as),
          cwd: '/',
          ...(signal === undefined ? {} : { signal }),
          ...(as === undefined ? {} : { uid: as.uid, gid: as.gid }),
        }));
      } catch (error) {
        const e = error as NodeJS.ErrnoException & { stderr?: string };
        if (e.code === 'ENOENT') throw missingTool('unsquashfs', error);
        throw imageError(reference, `cannot unpack the squashfs: ${(e.stderr ?? e.message).trim().split('\n').slice(-5).join('\n')}`, error);
      } finally {
        rmSync(list, { force: true });
      }
      const count = (what: string): number => Number(new RegExp(`^created (\\d+) ${what}$`, 'm').exec(stdout)?.[1] ?? 0);
      return count('files?') + count('symlinks?') + count('hardlinks?');
    }),
  );
  return counts.reduce((sum, n) => sum + n, 0);
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
