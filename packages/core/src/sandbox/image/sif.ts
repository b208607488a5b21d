import { closeSync, openSync, readSync } from 'node:fs';

/*
 * The SIF layout (github.com/apptainer/sif, pkg/sif): a 128-byte global header, then
 * `DescriptorsTotal` packed little-endian descriptors of 585 bytes. The root filesystem is the
 * partition descriptor (data type 0x4004) whose partition type is "primary system" (2) and
 * whose filesystem type is squashfs (1).
 */
const MAGIC = 'SIF_MAGIC';
const HEADER_SIZE = 128;
const DESCRIPTOR_SIZE = 585;
const DATA_PARTITION = 0x4004;
const FS_SQUASH = 1;
const PART_PRIMARY_SYSTEM = 2;

/** Where the root squashfs of a SIF starts, or a reason why none was found. */
export function sifRootPartition(path: string): { offset: number; size: number } | { error: string } {
  const fd = openSync(path, 'r');
  try {
    const header = Buffer.alloc(HEADER_SIZE);
    if (readSync(fd, header, 0, HEADER_SIZE, 0) < HEADER_SIZE) return { error: 'too short for a SIF header' };
    if (header.toString('latin1', 32, 32 + MAGIC.length) !== MAGIC) return { error: 'no SIF magic' };
    const total = Number(header.readBigInt64LE(88));
    const descriptorsOffset = Number(header.readBigInt64LE(96));
    if (total < 0 || total > 4096) return { error: `implausible descriptor count ${total}` };
    const table = Buffer.alloc(total * DESCRIPTOR_SIZE);
    if (readSync(fd, table, 0, table.length, descriptorsOffset) < table.length) return { error: 'descriptor table cut short' };
    let fallback: { offset: number; size: number } | undefined;
    for (let i = 0; i < total; i++) {
      const d = table.subarray(i * DESCRIPTOR_SIZE, (i + 1) * DESCRIPTOR_SIZE);
      const used = d[4] !== 0;
      if (!used || d.readInt32LE(0) !== DATA_PARTITION) continue;
      // extra (at 201): fstype int32, parttype int32, arch [3]byte
      const fsType = d.readInt32LE(201);
      const partType = d.readInt32LE(205);
      const offset = Number(d.readBigInt64LE(17));
      const size = Number(d.readBigInt64LE(25));
      if (fsType !== FS_SQUASH) continue;
      if (partType === PART_PRIMARY_SYSTEM) return { offset, size };
      fallback ??= { offset, size };
    }
    return fallback ?? { error: 'no squashfs root partition in the SIF' };
  } finally {
    closeSync(fd);
  }
}
