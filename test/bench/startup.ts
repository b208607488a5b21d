import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { workspaceRoot } from '@rollserve/testing';
import { request } from 'undici';
import { stringify } from 'yaml';
import { heading, percentile } from './stats.ts';

// `pnpm bench startup`: what a rollout node and an environment server cost to start (issue 24,
// step 3: the CLI's commands are loaded lazily and core's doors are slim, so neither loads the
// service, its store drivers nor swagger). For `rollserve node` (spawn to its registration with a
// running service), `rollserve serve math` (spawn to GET / answering) and the NeMo Gym launch
// (`python3 app.py` of the math package, as `gym env start` runs it, to GET / answering): the start
// time, the peak RSS (VmHWM at ready), the modules loaded (a --import hook lists every module the
// ESM loader loads) and whether pg, better-sqlite3 (its .node file in /proc/<pid>/maps too),
// swagger-ui-dist (api/docs, which resolved it on load) or the service's own modules (service/,
// store/, api/) were among them. ROLLSERVE_BENCH_BASELINE=<path to another checkout's rollserve.js>
// measures that build in the same run, side by side (each build runs from its own checkout).

const ROLLSERVE = join(workspaceRoot(), 'packages', 'cli', 'bin', 'rollserve.js');
const RUNS = Number(process.env.ROLLSERVE_BENCH_RUNS ?? 5);

interface Sample {
  ms: number;
  rssMib: number;
  modules: string[];
  maps: string;
}

/** The checkout of a rollserve.js: <root>/packages/<core or cli>/bin/rollserve.js. */
const rootOf = (bin: string) => resolve(dirname(bin), '..', '..', '..');

async function freePort(): Promise<number> {
  const server = createServer().listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  server.close();
  return port;
}

/** The --import hook: every module the ESM loader loads, one URL a line, appended as it loads. */
function writeHook(dir: string): string {
  writeFileSync(
    join(dir, 'hooks.mjs'),
    "import { appendFileSync } from 'node:fs';\n" +
      'export async function load(url, context, next) {\n' +
      '  if (process.env.ROLLSERVE_BENCH_MODULES) appendFileSync(process.env.ROLLSERVE_BENCH_MODULES, url + "\\n");\n' +
      '  return next(url, context);\n' +
      '}\n',
  );
  const hook = join(dir, 'hook.mjs');
  writeFileSync(hook, "import { register } from 'node:module';\nregister('./hooks.mjs', import.meta.url);\n");
  return hook;
}

function waitFor(child: ChildProcess, pattern: RegExp, what: string): Promise<RegExpExecArray> {
  let output = '';
  return new Promise((resolveMatch, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const match = pattern.exec(output);
      if (match) resolveMatch(match);
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('exit', (code) => reject(new Error(`${what} exited (${code}) before it was ready: ${output}`)));
  });
}

async function answers(url: string): Promise<void> {
  const response = await request(url);
  await response.body.text();
  if (response.statusCode !== 200) throw new Error(`GET ${url}: ${response.statusCode}`);
}

/** Spawns `argv`, waits until `ready` settles, and reads what the process loaded and its peak RSS. */
async function sample(argv: string[], cwd: string, env: Record<string, string>, hook: string, dir: string, ready: (child: ChildProcess) => Promise<void>): Promise<Sample> {
  const modulesFile = join(dir, `modules-${performance.now()}.txt`);
  writeFileSync(modulesFile, '');
  const started = performance.now();
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env, ROLLSERVE_LOG_LEVEL: 'silent', NODE_OPTIONS: `--import=${hook}`, ROLLSERVE_BENCH_MODULES: modulesFile },
  });
  try {
    await ready(child);
    const ms = performance.now() - started;
    const status = readFileSync(`/proc/${child.pid}/status`, 'utf8');
    const rssMib = Number(/VmHWM:\s+(\d+) kB/.exec(status)![1]) / 1024;
    const maps = readFileSync(`/proc/${child.pid}/maps`, 'utf8');
    return { ms, rssMib, modules: readFileSync(modulesFile, 'utf8').split('\n').filter(Boolean), maps };
  } finally {
    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  }
}

/** What a start loaded of what only the service needs. */
function loadedOf(s: Sample): string {
  const has = (pattern: RegExp) => s.modules.some((url) => pattern.test(url));
  const service = s.modules.filter((url) => /\/packages\/core\/(dist|src)\/(service|store|api)\//.test(url)).length;
  const flags = [
    `pg ${has(/\/node_modules\/pg\//) ? 'yes' : 'no'}`,
    `better-sqlite3 ${has(/\/node_modules\/better-sqlite3\//) || s.maps.includes('better_sqlite3.node') ? 'yes' : 'no'}`,
    `swagger ${has(/\/api\/docs\.js$|swagger-ui-dist/) ? 'yes' : 'no'}`,
    `service modules ${service}`,
  ];
  return `${s.modules.length} modules; ${flags.join(', ')}`;
}

function line(label: string, samples: Sample[]): void {
  const ms = samples.map((s) => s.ms);
  const rss = samples.map((s) => s.rssMib);
  console.log(`${label.padEnd(34)} start p50 ${percentile(ms, 50).toFixed(0).padStart(5)} ms (min ${Math.min(...ms).toFixed(0)})  peak RSS p50 ${percentile(rss, 50).toFixed(0).padStart(4)} MiB  ${loadedOf(samples[0]!)}`);
}

async function startService(dir: string): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, [ROLLSERVE, 'start', '--port', '0', '--run-locally', 'never', '--store', `sqlite://${join(dir, 'store.db')}`, '--journal', join(dir, 'none.jsonl')], {
    cwd: workspaceRoot(),
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' },
  });
  const [, url] = await waitFor(child, /^rollouts\s+(http:\/\/127\.0\.0\.1:\d+)[\s\S]*^swe\s+http/m, 'rollserve start');
  return { url: url!, child };
}

export default async function bench(): Promise<void> {
  heading(`startup: rollserve node and an environment server, spawn to ready (p50 of ${RUNS}), peak RSS, and what they load`);
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-bench-startup-'));
  const hook = writeHook(dir);
  const builds: Array<[string, string]> = [['this build', ROLLSERVE]];
  if (process.env.ROLLSERVE_BENCH_BASELINE) builds.unshift(['baseline', resolve(process.env.ROLLSERVE_BENCH_BASELINE)]);
  const service = await startService(dir);
  try {
    const results: Array<[string, Sample[]]> = [];
    for (const [build, bin] of builds) {
      const root = rootOf(bin);
      const node: Sample[] = [];
      const serve: Sample[] = [];
      const gym: Sample[] = [];
      for (let run = 0; run < RUNS; run++) {
        node.push(
          await sample([process.execPath, bin, 'node', '--service', service.url, '--init', '1', '--run', '1', '--eval', '1', '--slurm-check-s', '0'], root, {}, hook, dir, async (child) => {
            await waitFor(child, /^node \S+ registered with/m, 'rollserve node');
          }),
        );
        serve.push(
          await sample([process.execPath, bin, 'serve', 'math', '--port', '0'], root, {}, hook, dir, async (child) => {
            const [, url] = await waitFor(child, /^math\s+(http:\/\/127\.0\.0\.1:\d+)/m, 'rollserve serve math');
            await answers(`${url!}/`);
          }),
        );
        const port = await freePort();
        const config = { head_server: { host: '127.0.0.1', port: 11000 }, math_instance: { resources_servers: { math: { entrypoint: 'app.py', domain: 'math', host: '127.0.0.1', port } } } };
        const shim = join(root, 'environments', 'math', 'nemo-gym', 'app.py');
        if (!existsSync(shim)) throw new Error(`${shim} is missing`);
        gym.push(
          await sample(['python3', 'app.py'], dirname(shim), { NEMO_GYM_CONFIG_DICT: stringify(config), NEMO_GYM_CONFIG_PATH: 'math_instance' }, hook, dir, async (child) => {
            await waitFor(child, new RegExp(`http://127\\.0\\.0\\.1:${port}`), 'the NeMo Gym launch of math');
            await answers(`http://127.0.0.1:${port}/`);
          }),
        );
      }
      results.push([`${build}: rollserve node`, node], [`${build}: rollserve serve math`, serve], [`${build}: NeMo Gym launch (app.py)`, gym]);
    }
    for (const [label, samples] of results.sort(([a], [b]) => a.split(': ')[1]!.localeCompare(b.split(': ')[1]!))) line(label, samples);
  } finally {
    service.child.kill('SIGTERM');
    await once(service.child, 'exit');
    await rm(dir, { recursive: true, force: true });
  }
  // measured on a 2-core host shared with other work (p50 of 5; baseline f84292a, one door and one CLI module):
  // rollserve node 2.66 s / 143 MiB / 336 modules -> 1.45 s / 137 MiB / 283; serve math 2.55 s / 142 MiB / 311 ->
  // 1.61 s / 117 MiB / 227; the NeMo Gym launch 3.11 s / 135 MiB / 311 -> 1.54 s / 113 MiB / 212; baseline loaded
  // pg, better-sqlite3, swagger-ui-dist and 25 service/store/api modules in each, this build none
  console.log('target: neither rollserve node nor an environment server loads pg, better-sqlite3, swagger-ui-dist or the service (service/, store/, api/)');
}
