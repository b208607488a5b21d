// Run by images-cache.test.ts (with the source condition: this tree's code, not dist) as a second process sharing the image cache (a rollout node of the
// same host): `tsx image-cache-probe.ts <cache> <sandboxes> <image>` starts a bwrap sandbox on the
// image, prints "ready" and what it read from it, and holds it until its stdin closes (or it is
// killed: then its use of the image is left behind, for the other process to find stale).
import { createBwrapProvider } from '@rollserve/core/sandbox';

const [cacheDir, tmpDir, image] = process.argv.slice(2) as [string, string, string];
const provider = createBwrapProvider({ imageCacheDir: cacheDir, tmpDir });
const sandbox = await provider.create({ image });
const seen = await sandbox.exec('cat /data/marker');
process.stdout.write(`ready ${seen.stdout}`);
process.stdin.resume();
process.stdin.on('end', () => {
  void (async () => {
    await sandbox.close();
    await provider.close?.();
    process.stdout.write('closed\n');
  })();
});
