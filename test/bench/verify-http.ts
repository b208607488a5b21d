import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { makeResponse, referenceCases, workspaceRoot } from '@rollserve/testing';
import { Pool } from 'undici';
import { heading, latencyLine } from './stats.ts';

// /verify throughput of the math resources server, in a process of its own (as NeMo Gym runs it),
// driven over HTTP from this process with keep-alive connections.

const TYPICAL: Array<[expected: string, answer: string]> = [
  ['8', 'So 3 + 5 = 8. The answer is \\boxed{8}.'],
  ['\\frac{1}{2}', 'Hence the probability is \\boxed{\\dfrac{1}{2}}.'],
  ['0.5', 'The value is $\\frac{1}{2}$, so \\boxed{0.5}'],
  ['\\sqrt{2}', 'Therefore \\boxed{\\sqrt{2}}'],
  ['3\\pi', 'The area is \\boxed{3\\pi} square units.'],
  ['x^2+2x+1', '\\boxed{(x+1)^2}'],
  ['(1,2)', 'The point is \\boxed{(1, 2)}'],
  ['-3', 'We get \\boxed{-4}.'],
  ['1000', 'The final answer is 1,000.'],
  ['\\{1,2,3\\}', '\\boxed{\\{3,2,1\\}}'],
];

async function startServer(): Promise<{ url: string; child: ChildProcess }> {
  const bin = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');
  const child = spawn(process.execPath, [bin, 'serve', 'math', '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  let output = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      const match = /http:\/\/127\.0\.0\.1:\d+/.exec(output);
      if (match) resolve(match[0]);
    });
    child.once('exit', (code) => reject(new Error(`math server exited (${code}): ${output}`)));
  });
  return { url, child };
}

function body(expected: string, answer: string): string {
  return JSON.stringify({
    responses_create_params: { input: [{ role: 'user', content: 'Solve it.' }] },
    question: 'Solve it.',
    expected_answer: expected,
    response: makeResponse([
      { id: 'msg', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: answer, annotations: [] }] },
    ]),
  });
}

async function verify(pool: Pool, payload: string): Promise<{ ms: number; reward: number }> {
  const started = performance.now();
  const response = await pool.request({ path: '/verify', method: 'POST', headers: { 'content-type': 'application/json' }, body: payload });
  const answer = (await response.body.json()) as { reward: number };
  if (response.statusCode !== 200) throw new Error(`verify answered ${response.statusCode}`);
  return { ms: performance.now() - started, reward: answer.reward };
}

async function drive(pool: Pool, payloads: string[], concurrency: number): Promise<{ seconds: number; latencies: number[] }> {
  const latencies: number[] = [];
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < payloads.length) {
        const payload = payloads[next++]!;
        latencies.push((await verify(pool, payload)).ms);
      }
    }),
  );
  return { seconds: (performance.now() - started) / 1000, latencies };
}

export default async function bench(): Promise<void> {
  heading('math /verify over HTTP (one server process)');
  const { url, child } = await startServer();
  const pool = new Pool(url, { connections: 64, pipelining: 1 });
  try {
    const fixtures = referenceCases('math_with_judge')
      .filter(({ recorded, row }) => recorded.reward === 1 && String(row.expected_answer).length < 20)
      .map(({ row, recorded }) => JSON.stringify({ ...row, response: recorded.response }));
    const typical = [...TYPICAL.map(([e, a]) => body(e, a)), ...fixtures];
    await drive(pool, Array.from({ length: 200 }, (_, i) => typical[i % typical.length]!), 32); // warm-up
    const total = 3_000;
    const run = await drive(pool, Array.from({ length: total }, (_, i) => typical[i % typical.length]!), 64);
    console.log(`typical answers: ${(total / run.seconds).toFixed(0)} verifies/s  ${latencyLine(run.latencies)}  (target: 1,000 verifies/s or more with 64 connections, issue 11)`);

    for (const [label, answer] of [
      ['10^{10^{10}}', '\\boxed{10^{10^{10}}}'],
      ['5,000 nested braces', `\\boxed{${'{'.repeat(5_000)}1${'}'.repeat(5_000)}}`],
      ['a 1 MB answer', `\\boxed{${'x+'.repeat(500_000)}1}`],
    ] as const) {
      const one = await verify(pool, body('1', answer));
      // The same pathological answer in flight while typical ones keep flowing.
      const during = await Promise.all([verify(pool, body('1', answer)), drive(pool, Array.from({ length: 500 }, (_, i) => typical[i % typical.length]!), 32)]);
      console.log(
        `pathological ${label}: ${one.ms.toFixed(0)} ms, reward ${one.reward}; typical verifies meanwhile: ${(500 / during[1].seconds).toFixed(0)}/s  ${latencyLine(during[1].latencies)}`,
      );
    }
  } finally {
    await pool.close();
    child.kill('SIGTERM');
  }
}
