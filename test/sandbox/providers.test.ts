import {
  bwrapAvailable,
  createApptainerProvider,
  createBwrapProvider,
  createLocalProvider,
  findApptainerBinary,
  type SandboxSpec,
} from '@rollserve/core/sandbox';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll } from 'vitest';
import { describeSandboxBehaviour } from '@rollserve/testing';

// The same behavioural suite on every provider; a provider that cannot run here is skipped with
// the reason printed.
describeSandboxBehaviour('bwrap', () => createBwrapProvider(), {
  ...(bwrapAvailable() ? {} : { skip: 'bwrap is not installed' }),
});

// warm sandboxes are handed out for default specs: the same behaviour, env and files included
const warm = createBwrapProvider({ warm: 2 });
afterAll(() => warm.close?.());
describeSandboxBehaviour('bwrap (warm pool)', () => warm, {
  ...(bwrapAvailable() ? {} : { skip: 'bwrap is not installed' }),
});

describeSandboxBehaviour('local', () => createLocalProvider());

// Apptainer: a given image (ROLLSERVE_TEST_APPTAINER_IMAGE: a local .sif or directory with
// /bin/sh), else a directory image made here whose /usr is the host's, bound read-only (no
// network to pull docker:// images). UNTESTED on a machine with apptainer: none was available.
const apptainerBinary = findApptainerBinary();
let apptainerSpec: SandboxSpec | undefined;
if (apptainerBinary !== undefined) {
  const given = process.env.ROLLSERVE_TEST_APPTAINER_IMAGE;
  if (given !== undefined) apptainerSpec = { image: given };
  else {
    const image = mkdtempSync(join(tmpdir(), 'rs-apptainer-image-'));
    chmodSync(image, 0o755);
    for (const dir of ['usr', 'etc', 'tmp', 'proc', 'dev', 'sys', 'run', 'workspace', 'root', 'home']) mkdirSync(join(image, dir));
    for (const dir of ['bin', 'lib', 'lib64', 'sbin']) symlinkSync(`usr/${dir}`, join(image, dir));
    writeFileSync(join(image, 'etc', 'passwd'), 'root:x:0:0::/root:/bin/sh\n');
    apptainerSpec = { image, binds: [{ host: '/usr', sandbox: '/usr', readOnly: true }] };
    afterAll(() => rmSync(image, { recursive: true, force: true }));
  }
}
describeSandboxBehaviour('apptainer', () => createApptainerProvider(), {
  ...(apptainerBinary === undefined ? { skip: 'neither apptainer nor singularity is on PATH' } : {}),
  ...(apptainerSpec === undefined ? {} : { spec: apptainerSpec }),
});
