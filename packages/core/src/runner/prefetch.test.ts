import { describe, expect, it } from 'vitest';
import type { SandboxProvider, SandboxSpec } from '../sandbox/types.ts';
import { ImagePrefetcher } from './prefetch.ts';

// The prefetcher's order and what it drops, over a provider whose prefetch notes each image and
// waits for the test (the real unpacks are test/sandbox/images-prefetch.test.ts's and
// test/node/images-prefetch.test.ts's).
function recordingProvider() {
  const readied: string[] = [];
  const gates: Array<() => void> = [];
  const provider: SandboxProvider = {
    name: 'recording',
    create: () => Promise.reject(new Error('not here')),
    prefetch: async (spec: SandboxSpec) => {
      readied.push(spec.image!);
      await new Promise<void>((resolve) => gates.push(resolve));
    },
  };
  return { provider, readied, gates };
}

describe('ImagePrefetcher', () => {
  it("skips an image once every rollout that asked for it has begun INIT, readies hints after the rollouts' images", async () => {
    const { provider, readied, gates } = recordingProvider();
    const prefetcher = new ImagePrefetcher({ concurrency: 1, lookahead: 8 });
    let aInInit = false;
    prefetcher.prefetch(provider, { image: 'first' });
    await new Promise((resolve) => setTimeout(resolve, 5));
    expect(readied).toEqual(['first']); // holds the one slot
    prefetcher.prefetch(provider, { image: 'hinted' }, { hint: true });
    prefetcher.prefetch(provider, { image: 'a' }, { stale: () => aInInit });
    prefetcher.prefetch(provider, { image: 'shared' }, { stale: () => true });
    prefetcher.prefetch(provider, { image: 'shared' }, { stale: () => false });
    prefetcher.prefetch(provider, { image: 'b' }, { stale: () => true });
    aInInit = true;
    while (prefetcher.pending > 0) {
      gates.splice(0).forEach((open) => open());
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    // a and b: their rollouts were in INIT when their turn came; shared: one asker still waits
    expect(readied).toEqual(['first', 'shared', 'hinted']);
    await prefetcher.close();
  });

  it('holds no more hints than the host unpacks at once, and hints take no lookahead of held rollouts', async () => {
    const { provider, readied, gates } = recordingProvider();
    const prefetcher = new ImagePrefetcher({ concurrency: 1, lookahead: 2 });
    prefetcher.prefetch(provider, { image: 'h1' }, { hint: true });
    prefetcher.prefetch(provider, { image: 'h2' }, { hint: true }); // over the hints' bound: dropped
    prefetcher.prefetch(provider, { image: 'r1' });
    prefetcher.prefetch(provider, { image: 'r2' });
    prefetcher.prefetch(provider, { image: 'r3' }); // over the lookahead: dropped
    while (prefetcher.pending > 0) {
      gates.splice(0).forEach((open) => open());
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect(readied).toEqual(['h1', 'r1', 'r2']);
    await prefetcher.close();
  });
});
