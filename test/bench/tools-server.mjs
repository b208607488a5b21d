import { z } from 'zod';
import { bashTool, defineEnvironment } from '@rollserve/core';
import { exitOnSignals, startResourcesServer } from '@rollserve/core/gym';

// A NeMo Gym resources server for an environment with the bash tool, in a process of its own, as
// `rollserve serve` runs one (startResourcesServer): `pnpm bench tools` spawns it (issue 16) and
// reads its URL from the first line of stdout. Plain JavaScript on @rollserve/core's build, which
// is what users run (`pnpm bench` builds first): from source, tsx's helpers would be measured too.

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
