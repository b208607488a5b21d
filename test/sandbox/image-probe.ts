// Run by images.test.ts as another user (`setpriv --reuid=65534 ... tsx image-probe.ts <cache>
// <sandboxes> <image>`): a bwrap provider of that user starts a sandbox on the image and this
// prints, as one JSON line, what the sandbox sees and what the cache holds.
import { lstatSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createBwrapProvider, resolveImage } from '@rollserve/core/sandbox';

const [cacheDir, tmpDir, image] = process.argv.slice(2) as [string, string, string];
const provider = createBwrapProvider({ imageCacheDir: cacheDir, tmpDir });
try {
  const sandbox = await provider.create({ image });
  const inside = await sandbox.exec('id -u; stat -c "%A %n" /hostile/*; echo mine > /hostile/shared/open-file && cat /hostile/shared/open-file; cat /proc/self/mountinfo');
  await sandbox.close();
  const resolved = await resolveImage(image, { cacheDir });
  const files: Array<{ path: string; mode: number; uid: number; special: boolean }> = [];
  const visit = (path: string): void => {
    const stat = lstatSync(path);
    files.push({ path, mode: stat.mode, uid: stat.uid, special: stat.isBlockDevice() || stat.isCharacterDevice() || stat.isFIFO() || stat.isSocket() });
    if (stat.isDirectory()) for (const name of readdirSync(path)) visit(join(path, name));
  };
  visit(resolved.rootfs);
  process.stdout.write(`${JSON.stringify({ uid: process.getuid!(), inside, rootfs: resolved.rootfs, cacheMode: statSync(cacheDir).mode & 0o777, files })}\n`);
} finally {
  await provider.close?.();
}
