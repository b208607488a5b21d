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
// root (`-ef`, `-f` so that the directories they share are made by whichever comes first). The
// names of one file (hard links: a conda environment's files and its package cache share theirs)
// go to one unsquashfs, which makes them one file again; split, they would be copies.

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
    const [listing, links] = await Promise.all([squashfsListing(reference, parsed.path, offset, unpackAs, signal), hardLinks(parsed.path, offset, unpackAs, signal)]);
    const workers = Math.min(PARALLEL_MAX, availableParallelism(), Math.floor(listing.leaves.length / (PARALLEL_MIN_FILES / 2)));
    const runs = listing.exact && workers >= 2 && links !== undefined ? splitRuns(listing.leaves, workers, links) : undefined;
    if (runs !== undefined) {
      const made = await unpackInParallel(reference, parsed.path, offset, rootfs, staging, runs, unpackAs, signal);
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
 * The hard links of a squashfs, each name to the name it links to, from the pseudo-file
 * definitions unsquashfs writes (`-pf`: `name L target`, names backslash-escaped) before the file
 * data, which is not read: `sed` ends the pipe at the data's marker. (`-pf` wants a file it can
 * open: a pipe of the shell's, not the socket Node gives a child.) Undefined when they cannot be
 * read: then one unsquashfs unpacks the image.
 */
async function hardLinks(file: string, offset: number, as: { uid: number; gid: number } | undefined, signal: AbortSignal | undefined): Promise<Map<string, string> | undefined> {
  let stdout: string;
  try {
    ({ stdout } = await run('sh', ['-c', 'unsquashfs -no-progress -pf /dev/stdout -offset "$1" "$2" 2>/dev/null | sed "/^# START OF DATA/q"', 'sh', String(offset), file], {
      maxBuffer: 512 * 1024 * 1024,
      env: toolEnv(as),
      cwd: '/',
      ...(signal === undefined ? {} : { signal }),
      ...(as === undefined ? {} : { uid: as.uid, gid: as.gid }),
    }));
  } catch {
    return undefined;
  }
  const lines = stdout.split('\n');
  if (!lines.some((line) => line.startsWith('# START OF DATA'))) return undefined;
  const unescape = (name: string): string => name.replace(/\\(.)/g, '$1');
  const links = new Map<string, string>();
  for (const line of lines) {
    const link = /^((?:\\.|[^\\ ])+) L ((?:\\.|[^\\])+)$/.exec(line);
    if (link !== null) links.set(unescape(link[1]!), unescape(link[2]!));
  }
  return links;
}

/**
 * `leaves` in `workers` contiguous runs (files of one directory mostly go to one), every name of a
 * hard-linked file in the run of the name it links to; undefined when a link names a file the
 * listing does not (read back differently: one unsquashfs does it all then).
 */
function splitRuns(leaves: Listing['leaves'], workers: number, links: Map<string, string>): string[][] | undefined {
  const per = Math.ceil(leaves.length / workers);
  const runOf = new Map<string, number>();
  leaves.forEach((leaf, i) => runOf.set(leaf.name, Math.floor(i / per)));
  const runs: string[][] = Array.from({ length: workers }, () => []);
  for (const [link, target] of links) {
    const at = runOf.get(target);
    if (at === undefined || !runOf.has(link)) return undefined;
    runOf.set(link, at);
  }
  for (const leaf of leaves) runs[runOf.get(leaf.name)!]!.push(leaf.name);
  return runs.filter((run) => run.length > 0);
}

/** Unpacks each run of names with an unsquashfs of its own, all at once, into `rootfs`; returns how many files, symlinks and hard links they made. */
async function unpackInParallel(
  reference: string,
  file: string,
  offset: number,
  rootfs: string,
  staging: string,
  runs: string[][],
  as: { uid: number; gid: number } | undefined,
  signal: AbortSignal | undefined,
): Promise<number> {
  const counts = await Promise.all(
    runs.map(async (names, i) => {
      const list = join(staging, `extract-${i}`);
      // read by the unpacking uid; -no-wildcards: each line is a path, not a pattern
      writeFileSync(list, `${names.join('\n')}\n`, { mode: 0o644 });
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
