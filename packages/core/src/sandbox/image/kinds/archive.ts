import type { ImageKindHandler } from './kind.ts';
import { copyToLayout, unpackLayout } from './oci.ts';

// `docker-archive:<file.tar>` and `oci-archive:<file.tar>`: keyed by the file's sha256, copied into
// an OCI layout of our own with skopeo, then unpacked as one.

export const archive: ImageKindHandler = {
  source: (parsed) => ({ path: parsed.path, missing: `no image file at ${parsed.path}` }),
  async unpack(job) {
    const { layout, tag } = await copyToLayout(job, `${job.parsed.kind}:${job.parsed.path}`);
    return unpackLayout(job, layout, tag);
  },
};
