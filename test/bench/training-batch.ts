import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { heading, percentile } from './stats.ts';

// The Python client's training batches (rollserve.training.build_batch, numpy): 1,024 samples of
// 8k tokens padded into verl's DataProto fields, from views already parsed (the stream's cost is
// `pnpm bench python-client`'s). Views are synthetic, shaped as the service's: a prompt of 1k
// tokens, then turns of 200-800 generated tokens and 50-300 tool-output tokens. CPU time is
// printed beside wall time: on a shared machine the wall clock also counts other processes.

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PYTHON = process.env.PYTHON ?? '/usr/bin/python3';

export default async function bench(): Promise<void> {
  const samples = Number(process.env.TRAINING_BATCH_SAMPLES ?? 1024);
  const tokens = Number(process.env.TRAINING_BATCH_TOKENS ?? 8192);
  heading(`training batches: ${samples.toLocaleString('en')} samples of ${tokens.toLocaleString('en')} tokens into verl DataProto arrays (Python client, numpy; 5 builds)`);
  const output = await new Promise<string>((resolve, reject) => {
    const child = spawn(PYTHON, [`${ROOT}clients/python/benchmarks/training_batch.py`, String(samples), String(tokens)], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' },
    });
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`python exited with ${code}: ${out}`))));
  });
  const report = JSON.parse(output) as { shape: number[]; seconds: number[]; cpu_seconds: number[] };
  const s = (values: number[]) => values.map((v) => v.toFixed(2)).join(', ');
  console.log(`input_ids ${report.shape.join(' x ')}: wall p50 ${percentile(report.seconds, 50).toFixed(2)} s (runs: ${s(report.seconds)}), CPU p50 ${percentile(report.cpu_seconds, 50).toFixed(2)} s (runs: ${s(report.cpu_seconds)}) (target: ≤ 1 s)`);
}
