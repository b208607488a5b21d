// Runs submissions in sandboxes: one sandbox per submission, at most `concurrency` at a time.

import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { createSandboxProvider, DEFAULT_RESOURCES, shQuote, type SandboxProvider, type SandboxPythonRun, type SandboxSpec } from '@rollserve/core/sandbox';

/** One submission and its tests, in LiveCodeBench's format. */
export interface Submission {
  code: string;
  inputs: string[];
  outputs: string[];
  /** Set: call-based grading of this function (a `class Solution` method when there is one). */
  fnName: string | null;
  /** Seconds per test (SIGALRM), code_gen's `unit_test_timeout_secs`. */
  timeoutSecs: number;
}

/** code_gen's per-test result: `true` passed, `false` wrong call-based answer, or -1..-4. */
export type TestResult = boolean | number;

export interface RunOutcome {
  result: TestResult[];
  /** code_gen's metadata: the first failure, `{ 'execution time': s }`, or null after a global failure. */
  metadata: Record<string, unknown> | null;
  /** Wall time of the run, from sandbox start to result, seconds (not counting the queue). */
  seconds: number;
}

export interface CodeRunnerOptions {
  /** A provider name (bwrap, apptainer, local) or instance. @default the platform default (bwrap on Linux) */
  provider?: string | SandboxProvider;
  /** Submissions running at once (code_gen's `num_processes`). @default 8 */
  concurrency?: number;
  /** The Python interpreter inside the sandbox. @default 'python3' */
  python?: string;
  /** Address-space limit per process, MiB. @default 4096 */
  memoryMib?: number;
  /** Processes and threads of a submission. @default 64 */
  maxProcesses?: number;
  /** Largest file a submission may write, MiB. @default 16 */
  maxFileSizeMib?: number;
  /** The sandbox image (a root directory, .sif or docker:// reference). @default the host's root, read-only */
  image?: string;
  /** Sandboxes started ahead of demand (bwrap only). @default concurrency */
  warm?: number;
}

export interface CodeRunner {
  run(submission: Submission): Promise<RunOutcome>;
  close(): Promise<void>;
}

/** code_gen's global limit for a whole submission: (t + 1) · n + 5 seconds. */
export function globalTimeoutSecs(timeoutSecs: number, tests: number): number {
  return (timeoutSecs + 1) * tests + 5;
}

const HARNESS_URL = new URL('../python/harness.py', import.meta.url);
let harnessSource: string | undefined;

function harness(): string {
  return (harnessSource ??= readFileSync(HARNESS_URL, 'utf8'));
}

// Reads the setup (16-digit length, JSON), then hands it to the harness. Forked with a channel,
// the harness is the child that runs the submission and reports raw outputs on descriptor 3 to
// the fork server's grader on the host (`host` in harness.py), which alone is given the expected
// outputs. Executed, it forks that child before it reads the rest of stdin (expected outputs,
// result key), compares and signs the verdict. Nothing of the submission is on disk once the
// harness runs (it unlinks the stdin file). A forked interpreter has the harness made already
// (PRELOAD); it leaves sys.modules as the program starts, where a new interpreter never had it.
const BOOT = [
  'import os,json,sys',
  'def r(n):',
  " b=b''",
  ' while len(b)<n:',
  '  c=os.read(0,n-len(b))',
  '  if not c:raise EOFError',
  '  b+=c',
  ' return b',
  'p=json.loads(r(int(r(16))))',
  "h=sys.modules.pop('rollserve_harness',None)",
  "g=h.__dict__ if h is not None else {'__name__':'rollserve_harness'}",
  "if h is None:exec(compile(p.pop('harness'),'harness.py','exec'),g)",
  'del r,h',
  "g['main'](p)",
].join('\n');

/**
 * What the harness and the program's preamble import (harness.py's own imports, `_FROM_IMPORTS`,
 * and what `guard` imports), made once in the provider's interpreter where programs are forked
 * from one: ≈ 20 ms of imports and 3-6 ms of compiling the harness less per submission. The
 * program finds nothing it would not have found: the harness imports all of it before the
 * program runs. The harness's `prepare` then runs its pure steps once there (parsing, wrapping,
 * comparing, signing a sample), so no fork specialises their code again.
 */
const PRELOAD_MODULES = [
  'ast', 'builtins', 'faulthandler', 'io', 'json', 'os', 'resource', 'signal', 'sys', 'time', 'traceback', 'decimal',
  'string', 're', 'datetime', 'collections', 'heapq', 'bisect', 'copy', 'math', 'random', 'statistics', 'itertools',
  'functools', 'operator', 'typing', 'shutil', 'subprocess', 'ctypes',
];

type Preload = NonNullable<SandboxPythonRun['preload']>;
let preloadSpec: Preload | undefined;

/** One object for every run: the provider keeps what it made of it (its server, the source's digest). */
function preload(): Preload {
  return (preloadSpec ??= {
    modules: PRELOAD_MODULES,
    module: { name: 'rollserve_harness', source: harness(), file: 'harness.py', prepare: 'prepare', host: 'host' },
  });
}

class Semaphore {
  private active = 0;
  private readonly waiting: Array<() => void> = [];
  constructor(private readonly limit: number) {}

  async use<T>(task: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) await new Promise<void>((resolve) => this.waiting.push(resolve));
    else this.active++;
    try {
      return await task();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.active--;
    }
  }
}

/** A result line is "<hex hmac-sha256(key, json)> <json>"; only the harness parent holds the key. */
function authentic(line: string, key: string): boolean {
  const space = line.indexOf(' ');
  if (space !== 64) return false;
  const expected = createHmac('sha256', key).update(line.slice(space + 1), 'utf8').digest();
  const given = Buffer.from(line.slice(0, space), 'hex');
  return given.length === expected.length && timingSafeEqual(given, expected);
}

function globalFailure(tests: number): Omit<RunOutcome, 'seconds'> {
  return { result: Array.from({ length: tests }, () => -1), metadata: null };
}

/** What the grader on the host answers for a channel (harness.py's `host`). */
const verdictSchema = z.object({
  result: z.array(z.union([z.boolean(), z.number()])),
  metadata: z.record(z.string(), z.unknown()).nullable(),
});

/**
 * Creates the runner. The sandbox gives isolation (no network, read-only root, own pid space) and
 * the limits; the harness reproduces code_gen's grading. The submission runs in a process that
 * holds only its code and the test inputs and reports raw outputs: forked, to the fork server's
 * grader on the host, which the service gives the expected outputs once that process runs and
 * which answers the service directly; executed (no fork server), to the harness parent in the
 * sandbox, which reads the expected outputs and the HMAC key of the result line after forking it,
 * compares, and reports.
 *
 * @example
 * const runner = createCodeRunner({ concurrency: 8 });
 * const { result } = await runner.run({ code: 'print(int(input()) * 2)', inputs: ['2\n'], outputs: ['4\n'], fnName: null, timeoutSecs: 10 });
 * // result → [true]
 */
export function createCodeRunner(options: CodeRunnerOptions = {}): CodeRunner {
  const concurrency = options.concurrency ?? 8;
  const memoryMib = options.memoryMib ?? DEFAULT_RESOURCES.memoryMib;
  const python = options.python ?? 'python3';
  const ownsProvider = typeof options.provider !== 'object';
  let provider: SandboxProvider | undefined = typeof options.provider === 'object' ? options.provider : undefined;
  const semaphore = new Semaphore(concurrency);
  // The default spec keeps warm bwrap sandboxes usable; the harness lowers the other limits itself.
  const spec: SandboxSpec = {
    ...(options.image === undefined ? {} : { image: options.image }),
    ...(memoryMib === DEFAULT_RESOURCES.memoryMib ? {} : { resources: { memoryMib } }),
  };

  function getProvider(): SandboxProvider {
    if (provider) return provider;
    const name = options.provider as string | undefined;
    const warm = options.warm ?? concurrency;
    provider = name === undefined || name === 'bwrap' ? createSandboxProvider(name, { warm }) : createSandboxProvider(name);
    return provider;
  }

  async function runOnce(submission: Submission): Promise<RunOutcome> {
    const started = performance.now();
    const outcome = await runInSandbox(submission);
    return { ...outcome, seconds: (performance.now() - started) / 1000 };
  }

  async function runInSandbox(submission: Submission): Promise<Omit<RunOutcome, 'seconds'>> {
    const tests = submission.inputs.length;
    const limitSecs = globalTimeoutSecs(submission.timeoutSecs, tests);
    const key = randomBytes(32).toString('hex');
    const payload = (withHarness: boolean, channel = false): Buffer => {
      const setup = Buffer.from(
        JSON.stringify({
          ...(withHarness ? { harness: harness() } : {}),
          ...(channel ? { channel: true } : {}),
          code: submission.code,
          inputs: submission.inputs,
          fn_name: submission.fnName,
          timeout: submission.timeoutSecs,
          limits: {
            processes: options.maxProcesses ?? 64,
            file_bytes: (options.maxFileSizeMib ?? 16) * 1024 * 1024,
            cpu_seconds: limitSecs + 1,
            memory_bytes: memoryMib * 1024 * 1024,
          },
        }),
      );
      // With a channel the expected outputs never enter the sandbox.
      if (channel) return Buffer.concat([Buffer.from(String(setup.length).padStart(16, '0')), setup]);
      // The secret part comes last: the harness reads it only after forking the submission's process.
      return Buffer.concat([
        Buffer.from(String(setup.length).padStart(16, '0')),
        setup,
        Buffer.from(JSON.stringify({ outputs: submission.outputs, key })),
      ]);
    };
    const sandbox = await getProvider().create(spec);
    try {
      const run = { timeoutMs: limitSecs * 1000, maxOutputBytes: 16 * 1024 * 1024 };
      // A fork of the provider's prepared interpreter where it has one (bwrap: no interpreter
      // start per submission, the harness made once, graded on the host), else a new one.
      // exec'd: no shell keeps the payload file open for the submission to read through /proc.
      const channel = { data: { inputs: submission.inputs, fn_name: submission.fnName, outputs: submission.outputs } };
      const forked = sandbox.forkPython?.({ python, code: BOOT, stdin: payload(false, true), preload: preload(), channel, ...run });
      const graded = forked === undefined ? undefined : await forked.catch(() => undefined);
      if (graded !== undefined) {
        // the grader's answer is the verdict; none (the program died, stopped early, sent
        // anything else or too much, or ran out of time or sandbox) is code_gen's global failure
        const verdict = graded.channel !== undefined && 'result' in graded.channel ? verdictSchema.safeParse(graded.channel.result) : undefined;
        return verdict?.success === true ? { result: verdict.data.result, metadata: verdict.data.metadata } : globalFailure(tests);
      }
      const executed = await sandbox.exec(`exec ${shQuote(python)} -I -c ${shQuote(BOOT)}`, { stdin: payload(true), ...run });
      // A result counts when the harness exited cleanly (or was cut at the global limit after
      // writing it); a killed harness or sandbox does not.
      if (executed.errorType === 'sandbox' || (executed.errorType === undefined && executed.returnCode !== 0)) {
        return globalFailure(tests);
      }
      const line = executed.stdout.split('\n').findLast((l) => authentic(l, key));
      if (line === undefined) return globalFailure(tests);
      const parsed = JSON.parse(line.slice(line.indexOf(' ') + 1)) as { result: TestResult[]; metadata: Record<string, unknown> | null };
      return { result: parsed.result, metadata: parsed.metadata };
    } finally {
      await sandbox.close();
    }
  }

  return {
    run: (submission) => semaphore.use(() => runOnce(submission)),
    async close() {
      if (ownsProvider) await provider?.close?.();
      provider = undefined;
    },
  };
}
