import { z } from 'zod';
import { bashTool, defineEnvironment, pythonTool } from '@rollserve/core';
import { exitOnSignals, startResourcesServer } from '@rollserve/core/gym';

// `pnpm bench tool-overhead`'s face under test: a NeMo Gym resources server for an environment with
// the bash and Python tools, in a process of its own, as `rollserve serve` runs one
// (startResourcesServer on the default sandbox provider). Plain JavaScript on @rollserve/core's
// build, which is what users run; prints its URL as tools-server.mjs does.

const env = defineEnvironment({
  name: 'bench_tool_overhead',
  domain: 'other',
  row: z.object({}),
  tools: { bash: bashTool, execute_python: pythonTool },
  verify: () => ({ reward: 0 }),
});

const server = await startResourcesServer(env, { port: 0 });
exitOnSignals(() => server.close());
console.log(`serving ${server.running.url}`);
