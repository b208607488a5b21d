// `pnpm bench [name...]`: runs the benchmarks (all of them by default); each prints its figures.
const BENCHES: Record<string, () => Promise<{ default: () => Promise<void> }>> = {
  'math-verify': () => import('./math-verify.ts'),
  'verify-http': () => import('./verify-http.ts'),
  tools: () => import('./tools.ts'),
  isolation: () => import('./isolation.ts'),
  kernel: () => import('./kernel.ts'),
  rollouts: () => import('./rollouts.ts'),
  'code-verify': () => import('./code-verify.ts'),
  swe: () => import('./swe.ts'),
  submit: () => import('./submit.ts'),
  'python-client': () => import('./python-client.ts'),
  'training-batch': () => import('./training-batch.ts'),
  start: () => import('./start.ts'),
  images: () => import('./images.ts'),
  store: () => import('./store.ts'),
  'service-memory': () => import('./service-memory.ts'),
  nodes: () => import('./nodes.ts'),
  'node-loss': () => import('./node-loss.ts'),
  'body-flood': () => import('./body-flood.ts'),
  'heartbeat-flood': () => import('./heartbeat-flood.ts'),
  startup: () => import('./startup.ts'),
  'dynamic-sampling': () => import('./dynamic-sampling.ts'),
  weights: () => import('./weights.ts'),
  'cold-start': () => import('./cold-start.ts'),
  'tool-overhead': () => import('./tool-overhead.ts'),
  sweep: () => import('./sweep.ts'),
  'ten-turn-cpu': () => import('./ten-turn-cpu.ts'),
};

const chosen = process.argv.slice(2);
for (const name of chosen) {
  if (!(name in BENCHES)) {
    console.error(`unknown benchmark "${name}" (known: ${Object.keys(BENCHES).join(', ')})`);
    process.exit(2);
  }
}
for (const name of chosen.length > 0 ? chosen : Object.keys(BENCHES)) {
  const { default: bench } = await BENCHES[name]!();
  await bench();
}
