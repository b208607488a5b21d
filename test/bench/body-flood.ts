import { spawn, type ChildProcess } from 'node:child_process';
import { connect } from 'node:net';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { workspaceRoot } from '@rollserve/testing';
import { Pool } from 'undici';
import { heading, percentile } from './stats.ts';

// How long a resources server (math, `rollserve serve`, in a process of its own) keeps other
// requests waiting while 50 MB request bodies arrive, four at a time: GET / is probed every 10 ms,
// alone and during the flood, and the ratio printed. Three floods: invalid JSON (the case:
// read whole, decoded and scanned), a JSON body of token ids broken at its very end (JSON.parse
// and the json.loads limit scan run the whole body), and the same bodies over a cap of 16 MiB
// (refused before they are read). ROLLSERVE_BENCH_BASELINE=<path to another rollserve.js> runs the
// same floods against that build too (e.g. one from before the cap), for a before/after figure.

const ROLLSERVE = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');
const FLOOD_MS = 8_000;
const SENDERS = 4;
const BODY_BYTES = 50_000_000;

async function startServer(bin: string, args: string[]): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, [bin, 'serve', 'math', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' } });
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

/** Invalid JSON from its first byte, and token ids broken at the last byte. */
function bodies(): Record<string, Buffer> {
  const invalid = Buffer.alloc(BODY_BYTES, 'a');
  invalid[0] = 0x7b;
  const ids: number[] = [];
  let text = '';
  for (let i = 0; text.length < BODY_BYTES - 200; i++) {
    ids.push((i * 7919) % 151_936);
    if (ids.length === 100_000) {
      text += `${text === '' ? '' : ','}${ids.join(',')}`;
      ids.length = 0;
    }
  }
  const late = Buffer.from(`{"responses_create_params":{"input":"x"},"response":{"output":[{"prompt_token_ids":[${text}]}]},"question":"x","expected_answer":"1"x`);
  return { 'invalid JSON': invalid, 'token ids, broken at the end': late };
}

/** One body on a fresh connection with Content-Length; resolves with the status. */
function send(url: string, body: Buffer): Promise<number> {
  return new Promise((resolve) => {
    const { port } = new URL(url);
    const socket = connect(Number(port), '127.0.0.1');
    let answer = '';
    socket.on('data', (data) => {
      answer += data.toString('latin1');
      if (/\r\n\r\n/.test(answer)) {
        socket.destroy();
        resolve(Number(answer.split(' ')[1]));
      }
    });
    socket.on('error', () => resolve(0));
    socket.on('close', () => resolve(Number(answer.split(' ')[1]) || 0));
    socket.write(`POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`);
    socket.write(body);
  });
}

async function probe(pool: Pool, untilMs: number): Promise<number[]> {
  const latencies: number[] = [];
  while (performance.now() < untilMs) {
    const started = performance.now();
    const response = await pool.request({ path: '/', method: 'GET' });
    await response.body.text();
    latencies.push(performance.now() - started);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return latencies;
}

const fmt = (ms: number) => `${ms.toFixed(1)} ms`;

async function measure(label: string, bin: string, body: Buffer, args: string[], quiet: number[]): Promise<void> {
  const { url, child } = await startServer(bin, args);
  const pool = new Pool(url, { connections: 1 });
  try {
    const until = performance.now() + FLOOD_MS;
    let sent = 0;
    const statuses = new Map<number, number>();
    const senders = Array.from({ length: SENDERS }, async () => {
      while (performance.now() < until) {
        const status = await send(url, body);
        statuses.set(status, (statuses.get(status) ?? 0) + 1);
        sent++;
      }
    });
    const during = await probe(pool, until);
    await Promise.all(senders);
    const base = percentile(quiet, 99);
    const answered = [...statuses].map(([status, n]) => `${n}×${status}`).join(' ');
    console.log(
      `${label.padEnd(44)} GET / p50 ${fmt(percentile(during, 50))}  p99 ${fmt(percentile(during, 99))}  max ${fmt(Math.max(...during))}` +
        `  (p99 ${(percentile(during, 99) / base).toFixed(0)}× quiet; ${(sent / (FLOOD_MS / 1000)).toFixed(1)} bodies/s: ${answered})`,
    );
  } finally {
    await pool.close();
    child.kill('SIGKILL');
  }
}

export default async function bench(): Promise<void> {
  heading(`body flood: GET / of a resources server while ${SENDERS} clients send ${BODY_BYTES / 1e6} MB bodies to /verify (${FLOOD_MS / 1000} s each)`);
  const quietServer = await startServer(ROLLSERVE, []);
  const pool = new Pool(quietServer.url, { connections: 1 });
  const quiet = await probe(pool, performance.now() + 3_000);
  await pool.close();
  quietServer.child.kill('SIGKILL');
  console.log(`${'quiet (no flood)'.padEnd(44)} GET / p50 ${fmt(percentile(quiet, 50))}  p99 ${fmt(percentile(quiet, 99))}  max ${fmt(Math.max(...quiet))}`);
  const builds: Array<[string, string]> = [['this build', ROLLSERVE]];
  if (process.env.ROLLSERVE_BENCH_BASELINE) builds.unshift(['baseline', process.env.ROLLSERVE_BENCH_BASELINE]);
  for (const [name, body] of Object.entries(bodies())) {
    for (const [build, bin] of builds) await measure(`${build}, ${name}`, bin, body, [], quiet);
    await measure(`this build, ${name}, --max-body-mib 16`, ROLLSERVE, body, ['--max-body-mib', '16'], quiet);
  }
  console.log('target: while bodies flood in, GET / waits for at most one body\'s decoding (p99 within a few hundred ms), never for all of them');
}
