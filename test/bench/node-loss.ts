import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startPolicyProcess } from './policy-process.ts';
import {
  adopt,
  checkResults,
  dispatcher,
  getJson,
  listNodes,
  load,
  mathTask,
  openStream,
  pollUntil,
  startNode,
  startService,
  stop,
  stopAll,
  submit,
  type NodeProcess,
  type WireResult,
} from './cluster.ts';
import { heading } from './stats.ts';

// `pnpm bench node-loss`: how long the central service takes to notice a rollout node that died
// and to give its work to another. `rollserve start --run-locally never --node-timeout-s 10` (nodes
// heartbeat every 2 s), 2 nodes each holding at most PER_NODE rollouts, a policy taking POLICY_MS
// per turn, 2×PER_NODE single-turn rollouts submitted; once both nodes hold their share, one is
// SIGKILLed. Measured from the kill, polling every 100 ms: (a) GET /v1/nodes shows it 'lost',
// (b) every rollout not yet finished is leased again (the surviving node holds all of them),
// (c) the last result. Every rollout must end with exactly one result (the stream, and the
// store's listing). Repeated REPEATS times, a fresh node replacing the killed one each time.

const REPEATS = Number(process.env.NODE_LOSS_REPEATS ?? 3);
const PER_NODE = Number(process.env.NODE_LOSS_PER_NODE ?? 20);
const POLICY_MS = Number(process.env.NODE_LOSS_POLICY_MS ?? 2_000);
const TIMEOUT_S = 10;
const TARGET_S = 15;

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/** Every rollout the service lists for this round's tasks, each with its state (GET /v1/rollouts, paged). */
async function listed(url: string, prefix: string): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  let cursor: string | null = null;
  do {
    const page: { items: Array<{ task_id: string; state: string }>; next_cursor: string | null } = await getJson(
      `${url}/v1/rollouts?limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`,
    );
    for (const item of page.items) if (item.task_id.startsWith(prefix)) counts.set(item.task_id, (counts.get(item.task_id) ?? 0) + 1);
    cursor = page.next_cursor;
  } while (cursor);
  return counts;
}

export default async function bench(): Promise<void> {
  heading(
    `node loss: service (--run-locally never --node-timeout-s ${TIMEOUT_S}, heartbeats every 2 s) + 2 nodes holding ${PER_NODE} rollouts each, ` +
      `policy ${POLICY_MS} ms per turn; one node SIGKILLed mid-batch, ${REPEATS}× (target: lost and re-issued ≤ ${TARGET_S} s)`,
  );
  console.log(`(${load()} at the start)`);
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-node-loss-bench-'));
  const policy = await startPolicyProcess({ reply: '\\boxed{8}', latencyMs: POLICY_MS });
  adopt(policy.child, 'policy');
  try {
    const service = await startService(policy.url, join(dir, 'store.db'), { args: ['--run-locally', 'never', '--node-timeout-s', String(TIMEOUT_S)] });
    const nodeArgs = ['--max-rollouts', String(PER_NODE)];
    const nodes: NodeProcess[] = [await startNode(service.url, nodeArgs), await startNode(service.url, nodeArgs)];
    const rows: Array<{ lost: number; leased: number; finished: number }> = [];
    for (let repeat = 0; repeat < REPEATS; repeat++) {
      const prefix = `loss${repeat}-`;
      const ids = Array.from({ length: 2 * PER_NODE }, (_, i) => `${prefix}${i}`);
      const results: WireResult[] = [];
      await submit(service.url, ids.map(mathTask));
      const stream = openStream(service.url, (r) => results.push(r), ids);
      const [victim, survivor] = nodes as [NodeProcess, NodeProcess];
      // both nodes hold their share (their rollouts are in the policy's turn)
      await pollUntil('both nodes to hold their rollouts', async () => {
        const view = await listNodes(service.url);
        return nodes.every((n) => view.find((v) => v.node_id === n.nodeId)?.leases === PER_NODE) ? true : undefined;
      });
      const killed = performance.now();
      await stop(victim.child, 'SIGKILL');
      let lostAt: number | undefined;
      let leasedAt: number | undefined;
      await pollUntil(
        'the lost node to be seen and its work leased again',
        async () => {
          const view = await listNodes(service.url);
          const now = performance.now();
          if (lostAt === undefined && view.find((v) => v.node_id === victim.nodeId)?.state === 'lost') lostAt = now;
          // every rollout not finished yet is held by the survivor
          const held = view.find((v) => v.node_id === survivor.nodeId)?.leases ?? 0;
          if (leasedAt === undefined && lostAt !== undefined && held > 0 && held + results.length === ids.length) leasedAt = now;
          return lostAt !== undefined && (leasedAt !== undefined || results.length === ids.length) ? true : undefined;
        },
        100,
        120_000,
      );
      await stream.done;
      const finishedAt = performance.now();
      checkResults(ids, results);
      const listing = await listed(service.url, prefix);
      const extra = [...listing].filter(([, n]) => n !== 1);
      if (listing.size !== ids.length || extra.length > 0) throw new Error(`the store lists ${listing.size} of ${ids.length} tasks, ${extra.length} with other than one rollout`);
      const row = { lost: lostAt! - killed, leased: (leasedAt ?? finishedAt) - killed, finished: finishedAt - killed };
      rows.push(row);
      console.log(
        `kill ${repeat + 1}: lost after ${seconds(row.lost)}, its ${PER_NODE} rollouts leased again after ${seconds(row.leased)}, the last result after ${seconds(row.finished)}` +
          `  (${ids.length} rollouts, each exactly one result, done with reward 1)`,
      );
      // a fresh node in place of the killed one, the survivor first in line to be killed next
      nodes.splice(0, 2, survivor, await startNode(service.url, nodeArgs));
    }
    const worst = (key: 'lost' | 'leased') => Math.max(...rows.map((r) => r[key]));
    console.log(
      `worst of ${REPEATS}: lost ${seconds(worst('lost'))}, leased again ${seconds(worst('leased'))} — target ≤ ${TARGET_S} s: ${worst('leased') <= TARGET_S * 1000 ? 'met' : 'NOT met'} ` +
        `(--node-timeout-s ${TIMEOUT_S} + the service's sweep every 2 s; the last result adds the policy's ${seconds(POLICY_MS)} turn)  (${load()})`,
    );
  } finally {
    await stopAll();
    await dispatcher.close();
    await rm(dir, { recursive: true, force: true });
  }
}
