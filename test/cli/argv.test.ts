import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

// Mistakes on the command line, as a user makes them, against the built CLI.
const bin = join(import.meta.dirname, '../../packages/cli/bin/rollserve.js');
const run = (...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' } });

describe('rollserve command line', () => {
  it('names an unknown command and suggests the one meant', () => {
    const result = run('strat');
    expect(result.status).toBe(2);
    expect(result.stderr.trim()).toBe('rollserve: unknown command "strat"; did you mean "start"? (rollserve --help lists the commands)');
  });

  it('refuses an unknown option instead of running with a default, and suggests the one meant', () => {
    const result = run('serve', 'math', '--prot', '9001');
    expect(result.status).toBe(2);
    expect(result.stderr).toContain('unknown option --prot for "rollserve serve"; did you mean --port?');
    expect(result.stderr).not.toMatch(/\n\s+at /); // no stack trace
    expect(run('rollout', '--env', 'math', '--input', 'x', '--output', 'y', '--policy', 'http://127.0.0.1:9/v1', '--model', 'm', '--nn', '4').stderr).toContain(
      'unknown option --nn for "rollserve rollout"; did you mean --n?',
    );
  });

  it('says which option lacks its value', () => {
    const result = run('start', '--llm');
    expect(result.status).toBe(2);
    expect(result.stderr.trim()).toBe('rollserve: option --llm of "rollserve start" needs a value');
    // an empty shell variable before the next option
    const empty = run('rollout', '--env', 'math', '--input', 'x', '--output', 'y', '--policy', '--model', 'm');
    expect(empty.status).toBe(2);
    expect(empty.stderr.trim()).toBe('rollserve: option --policy of "rollserve rollout" needs a value');
  });

  it('reports a failing command in one line, without a stack trace', () => {
    const result = run('serve', 'nosuchenv', '--port', '0');
    expect(result.status).toBe(1);
    expect(result.stderr.trim()).toMatch(/^rollserve serve: no environment "nosuchenv" is installed/);
    expect(result.stderr).not.toMatch(/\n\s+at /);
  });

  it('checks --image-cache-max and --image-unpacks (beside ROLLSERVE_IMAGE_CACHE_MAX / _UNPACKS) before serving, and lists them', () => {
    const cap = run('serve', 'math', '--port', '0', '--image-cache-max', 'lots');
    expect(cap.status).toBe(1);
    expect(cap.stderr.trim()).toBe('rollserve serve: --image-cache-max takes a size (bytes, or a number with K, M, G or T: 200G), not "lots"');
    const unpacks = run('node', '--image-unpacks', '0');
    expect(unpacks.status).toBe(1);
    expect(unpacks.stderr.trim()).toBe('rollserve node: --image-unpacks takes an integer >= 1, not "0"');
    for (const command of ['start', 'serve', 'node']) expect(run(command, '--help').stdout).toMatch(/--image-cache-max[\s\S]*--image-unpacks/);
  });

  it('names a missing required option in one line (rollout requires --model), but not with --help', () => {
    const result = run('rollout', '--env', 'math', '--input', 'x', '--output', 'y', '--policy', 'http://127.0.0.1:9/v1');
    expect(result.status).toBe(2);
    expect(result.stderr.trim()).toBe('rollserve: option --model of "rollserve rollout" is required (Served model name, as the inference servers name it)');
    expect(result.stdout).toBe('');
    const help = run('rollout', '--help');
    expect(help.status).toBe(0);
    expect(help.stdout).toContain('--concurrency');
  });

  it('names a bad store URL or --run-locally value of rollserve start in one line, before serving anything', () => {
    // (a bounded wait: a value taken instead of refused would leave the service running)
    const start = (...args: string[]) => spawnSync(process.execPath, [bin, 'start', '--port', '0', ...args], { encoding: 'utf8', timeout: 60_000, env: { ...process.env, ROLLSERVE_LOG_LEVEL: 'silent' } });
    const mode = start('--run-locally', 'sometimes');
    expect(mode.status).toBe(1);
    expect(mode.stderr.trim()).toBe('rollserve start: --run-locally is auto, always or never, not "sometimes"');
    const store = start('--store', 'mysql://db/rollouts');
    expect(store.status).toBe(1);
    expect(store.stderr.trim()).toMatch(/^rollserve start: unknown store URL "mysql:\/\/db\/rollouts" \(sqlite:\/\/\/path\/to\/file.db, sqlite::memory: or postgres:\/\/…\)$/);
    expect(store.stdout).toBe(''); // nothing was served
    const lease = start('--lease-s', 'soon');
    expect(lease.status).toBe(1);
    expect(lease.stderr.trim()).toBe('rollserve start: --lease-s takes a number >= 1, not "soon"');
  }, 120_000);

  it('prints --help without colour codes into a pipe, and with them when asked (FORCE_COLOR)', () => {
    // what a shell gives it: none of the variables that turn citty's colours off by themselves
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !['NO_COLOR', 'FORCE_COLOR', 'TEST', 'CI', 'TERM'].includes(k)));
    const help = (extra: Record<string, string>, ...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env: { ...env, ...extra } });
    for (const args of [['--help'], ['rollout', '--help'], ['start', '--help']]) {
      const piped = help({ TERM: 'xterm-256color' }, ...args);
      expect(piped.status).toBe(0);
      expect(piped.stdout).toContain('USAGE');
      expect(piped.stdout).not.toContain('\u001b[');
    }
    expect(help({ TERM: 'xterm-256color', FORCE_COLOR: '1' }, '--help').stdout).toContain('\u001b[');
  });
});
