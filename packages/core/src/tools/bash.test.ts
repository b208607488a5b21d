import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import type { Sandbox } from '../sandbox/types.ts';
import { ansiCQuote, BashSession, stripAnsi } from './bash.ts';

describe('bash helpers', () => {
  it('quotes any command as one terminal-safe line', () => {
    const quoted = ansiCQuote("echo 'a'\\b\n\x03\x04\ttab é");
    expect(quoted).toBe("$'echo \\'a\\'\\\\b\\x0a\\x03\\x04\\x09tab é'");
    expect(/[\x00-\x1f\x7f]/.test(quoted)).toBe(false);
  });

  it('strips colours, cursor moves, titles and bracketed paste', () => {
    expect(stripAnsi('\x1b[31mred\x1b[0m \x1b]0;title\x07\x1b[?2004hok\x1b[?2004l\r\n\x1b[2K\x1b[1Gdone')).toBe('red ok\ndone');
  });
});

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[bash tests] skipped: ${skip}`);

describe.skipIf(skip !== undefined)('BashSession in a bwrap sandbox', () => {
  let sandbox: Sandbox;
  const sessions: BashSession[] = [];
  const start = async (options = {}) => {
    const session = await BashSession.start(sandbox, options);
    sessions.push(session);
    return session;
  };
  beforeAll(async () => {
    sandbox = await createBwrapProvider().create();
  });
  afterEach(async () => {
    await Promise.all(sessions.splice(0).map((s) => s.close()));
  });
  afterAll(() => sandbox.close());

  it('runs commands with their exit codes, without echo, prompts or ANSI codes', async () => {
    const bash = await start();
    expect(await bash.run('echo hi')).toEqual({ output: 'hi\n', exitCode: 0, timedOut: false, truncated: false });
    expect(await bash.run('false')).toMatchObject({ output: '', exitCode: 1 });
    expect((await bash.run('echo -n no-newline')).output).toBe('no-newline');
    expect((await bash.run('printf "\\033[1;31mred\\033[0m\\n"; ls --color=always -d /tmp')).output).toBe('red\n/tmp\n');
    expect((await bash.run('echo err >&2')).output).toBe('err\n');
  });

  it('keeps cwd, variables and functions across calls', async () => {
    const bash = await start();
    await bash.run('mkdir -p /tmp/w && cd /tmp/w && export GREETING=hello && f() { echo "f:$1"; }');
    expect((await bash.run('pwd; echo $GREETING; f x')).output).toBe('/tmp/w\nhello\nf:x\n');
  });

  it('survives syntax errors, heredocs, multi-line scripts and long commands', async () => {
    const bash = await start();
    const bad = await bash.run('echo "unterminated');
    expect(bad.exitCode).toBe(2);
    expect((await bash.run('cat <<EOF\nline 1\nline 2\nEOF')).output).toBe('line 1\nline 2\n');
    expect((await bash.run('for i in 1 2 3; do\n  echo $i\ndone')).output).toBe('1\n2\n3\n');
    const long = 'x'.repeat(20_000);
    expect((await bash.run(`echo ${long} | wc -c`)).output.trim()).toBe('20001');
  });

  it('interrupts at the time limit, reports partial output, and stays usable', async () => {
    const bash = await start();
    await bash.run('export KEEP=1');
    const result = await bash.run('echo before; sleep 30; echo never', { timeoutMs: 300 });
    expect(result.timedOut).toBe(true);
    expect(result.exitCode).toBeNull();
    expect(result.output).toContain('before\n');
    expect(result.output).not.toContain('never');
    expect(result.output).toContain('timed out after 0.3 seconds');
    expect((await bash.run('echo $KEEP')).output).toBe('1\n');
  });

  it('kills a foreground job that ignores Ctrl-C and keeps the shell', async () => {
    const bash = await start();
    await bash.run('cd /tmp');
    const result = await bash.run("sh -c 'trap \"\" INT; sleep 30'", { timeoutMs: 300 });
    expect(result.timedOut).toBe(true);
    expect((await bash.run('pwd')).output).toBe('/tmp\n');
  });

  it('caps long output with a truncation notice, keeping head and tail', async () => {
    const bash = await start({ maxOutputChars: 2000 });
    const result = await bash.run('seq 1 100000');
    expect(result.truncated).toBe(true);
    expect(result.output.startsWith('1\n2\n3\n')).toBe(true);
    expect(result.output.endsWith('99999\n100000\n')).toBe(true);
    expect(result.output).toMatch(/\[\.\.\. \d+ characters of output truncated \.\.\.\]/);
    expect(result.output.length).toBeLessThan(2400);
    expect((await bash.run('echo next')).output).toBe('next\n');
  });

  it('starts a new shell after exit and says so', async () => {
    const bash = await start();
    const exited = await bash.run('exit 3');
    expect(exited.exitCode).toBeNull();
    expect(exited.output).toContain('exited with code 3');
    const next = await bash.run('echo again');
    expect(next.output).toContain('again\n');
    expect(next.output).toContain('new shell');
  });

  it('keeps what background jobs print between commands bounded', async () => {
    const bash = await start({ maxOutputChars: 1_000 });
    await bash.run('(while :; do echo noise-noise-noise-noise; done) & echo started');
    await new Promise((r) => setTimeout(r, 1_500));
    expect((bash as unknown as { buffer: string }).buffer.length).toBeLessThanOrEqual(2 * (1_000 + 8192));
    const after = await bash.run('kill %1; echo still-here');
    expect(after.output).toContain('still-here');
    expect(after.output.length).toBeLessThan(20_000);
  });

  it('queues concurrent calls on one shell', async () => {
    const bash = await start();
    const results = await Promise.all(Array.from({ length: 10 }, (_, i) => bash.run(`echo ${i}`)));
    expect(results.map((r) => r.output)).toEqual(Array.from({ length: 10 }, (_, i) => `${i}\n`));
  });

  it('does not let a command read the next command as its input', async () => {
    const bash = await start();
    const result = await bash.run('read -t 0.2 line; echo "read=[$line] rc=$?"');
    expect(result.output).toMatch(/^read=\[\] rc=\d+\n$/);
  });
});
