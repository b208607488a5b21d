import { z } from 'zod';
import { exitOnSignals, startResourcesServer } from '../../packages/core/src/gym/index.ts';
import { defineEnvironment } from '../../packages/core/src/spec/index.ts';
import { bashTool } from '../../packages/core/src/tools/index.ts';

// A NeMo Gym resources server for an environment with the bash tool, in a process of its own, as
// `rollserve serve` runs one (startResourcesServer): `pnpm bench tools` spawns it (issue 16) and
// reads its URL from the first line of stdout. Run from source (tsx), so that it measures the
// tree as it is rather than the last `tsc -b`.

const env = defineEnvironment({
  name: 'bench_tools',
  domain: 'other',
  row: z.object({}),
  tools: { bash: bashTool },
  verify: () => ({ reward: 0 }),
});

const server = await startResourcesServer(env, { port: 0 });
exitOnSignals(() => server.close());
console.log(`serving ${server.running.url}`);
