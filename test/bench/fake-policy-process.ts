// A fake policy server in a process of its own, so that its CPU is not the service's.
// argv[2]: JSON FakePolicyOptions ({ script } is not passable; `reply` picks a canned script).
import { startFakePolicy, type FakeReply } from '@rollserve/testing';

const options = JSON.parse(process.argv[2] ?? '{}') as { reply?: string; turns?: number; tool?: string; latencyMs?: number; content?: string };
const turns = options.turns ?? 1;
const fake = await startFakePolicy({
  ...(options.latencyMs ? { latencyMs: options.latencyMs } : {}),
  script: (_request, ctx): FakeReply =>
    ctx.turn + 1 < turns && options.tool
      ? { ...(options.content ? { content: options.content } : {}), toolCalls: [{ name: options.tool, arguments: JSON.parse(options.reply ?? '{}') as Record<string, unknown> }] }
      : (options.tool ? 'done' : (options.reply ?? '\\boxed{8}')),
});
console.log(fake.url);
const stop = () => void fake.close().then(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
