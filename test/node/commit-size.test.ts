import { defineEnvironment } from '@rollserve/core';
import { startRolloutNode, type NodeEvent } from '@rollserve/core/node';
import { startRolloutServer } from '@rollserve/core/service';
import { startFakePolicy } from '@rollserve/testing';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';

// The service caps request bodies (a node's results at 4 × --max-body-mib): a node whose batch of
// finished results is larger commits it in halves instead of losing it.

const BLOB = 'x'.repeat(600 * 1024);
const bulky = defineEnvironment({ name: 'bulky', domain: 'other', row: z.object({}).passthrough(), verify: () => ({ reward: 1, blob: BLOB }) });

describe('a node and the service\'s body cap', () => {
  it('commits a batch of results larger than the cap in smaller batches, every result kept', async () => {
    const fake = await startFakePolicy({ script: () => 'done' });
    // results may be 4 × 256 KiB = 1 MiB: one 600 KiB result fits, two do not
    const server = await startRolloutServer({ environments: [bulky], llmBackends: [fake.url], maxBodyBytes: 256 * 1024, runLocally: 'never', store: 'sqlite::memory:' });
    const events: NodeEvent[] = [];
    const node = await startRolloutNode({ serviceUrl: server.url, environments: [bulky], pools: { init: 16, run: 16, eval: 16 }, onEvent: (e) => events.push(e) });
    try {
      const [submitted] = await server.service.submit([{ id: 'bulk', env: 'bulky', n: 12, row: { responses_create_params: { input: 'go' } }, policy: { model: 'fake-policy' } } as never]);
      const results = await Promise.all(submitted!.rolloutIds.map((id) => server.service.wait(id)));
      expect(results.map((r) => r.state)).toEqual(Array(12).fill('done'));
      expect(results.every((r) => (r.verify_extras as { blob?: string }).blob === BLOB)).toBe(true);
      // the node hears each commit answered (the last one maybe just after the service stored it)
      const deadline = Date.now() + 10_000;
      while (events.filter((e) => e.type === 'committed').length < 12 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      expect(events.filter((e) => e.type === 'committed')).toHaveLength(12);
    } finally {
      await node.close();
      await server.close();
      await fake.close();
    }
  }, 120_000);
});
