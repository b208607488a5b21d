import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createSweEnvironment, freshRepoScript, SWE_EXTRA_KEYS } from '@rollserve/env-swe';
import { limitWrapper } from '@rollserve/core/sandbox';
import { createResourcesServer, serveFetch } from '@rollserve/core/gym';
import { call, cookieHeader, makeResponse } from '@rollserve/testing';
import { afterAll, describe, expect, it } from 'vitest';
import { buildSweFixtures } from './fixtures.ts';

// The Apptainer path, without Apptainer: a stand-in `apptainer` binary records every command line
// the provider runs and executes `exec instance://...` commands on the host, so a SWE-bench-style
// row (an image holding the repository at repo_dir) goes through seed and verify for real while
// the exact command lines are checked. (The stand-in gives each command a private /tmp with bwrap,
// as an instance has; nothing is written to the host's /tmp.)

const built = buildSweFixtures();
const root = mkdtempSync(join(tmpdir(), 'rollserve-swe-apptainer-'));
afterAll(() => {
  built.close();
  rmSync(root, { recursive: true, force: true });
});

const log = join(root, 'calls.log');
const binary = join(root, 'bin', 'apptainer');
mkdirSync(join(root, 'bin'));
// Records: \x1e between calls, \x1f between arguments (scripts hold newlines).
writeFileSync(
  binary,
  `#!/bin/sh
{ printf '\\036'; for a in "$@"; do printf '%s\\037' "$a"; done; } >> '${log}'
case "$1 $2" in
  "instance start"|"instance stop") exit 0 ;;
  "instance list") echo '{"instances":[]}'; exit 0 ;;
esac
# like an instance, a private /tmp (the test's own directory still visible)
while [ $# -gt 0 ]; do case "$1" in instance://*) shift; exec bwrap --dev-bind / / --tmpfs /tmp --bind '${root}' '${root}' -- "$@" ;; *) shift ;; esac; done
exit 99
`,
);
chmodSync(binary, 0o755);

function calls(): string[][] {
  return readFileSync(log, 'utf8')
    .split('\x1e')
    .filter((c) => c !== '')
    .map((c) => c.split('\x1f').slice(0, -1));
}

describe('swe on the apptainer provider (stand-in binary)', () => {
  it('runs a SWE-bench-style image row through seed and verify with the expected command lines', async () => {
    const fixture = built.fixtures[0]!;
    // "the image": the repository at base_commit with its full history, future fix included
    const testbed = join(root, 'testbed');
    const workdir = join(root, 'workspace');
    mkdirSync(workdir);
    execFileSync('git', ['clone', '-q', fixture.repoPath, testbed]);
    execFileSync('git', ['-C', testbed, 'checkout', '-q', fixture.baseCommit]);
    const image = 'swebench/sweb.eval.x86_64.fixtures_1776_calc-1:latest';
    const { repo_path: _unused, ...row } = fixture.row;
    const imageRow = { ...row, image };

    const env = createSweEnvironment();
    const app = createResourcesServer(env, {
      config: { sandbox_provider: { apptainer: { binary } }, repo_dir: testbed, workdir, is_verifying_golden_patch: true },
    });
    const server = await serveFetch(app);
    try {
      const seed = await call(server.url, 'POST', '/seed_session', imageRow);
      expect(seed.status, seed.text).toBe(200);
      const cookie = cookieHeader(seed.setCookies);
      // the agent's shell starts in the repository, which has no history but its one commit
      const shell = await call(server.url, 'POST', '/bash', { command: `pwd; git log --all --oneline | wc -l; git cat-file -t ${fixture.futureCommit} 2>&1` }, { cookie });
      expect(shell.text).toMatch(new RegExp(`^${testbed}\\n1\\nfatal`));
      const verify = await call(server.url, 'POST', '/verify', { ...imageRow, response: makeResponse([]) }, { cookie });
      expect(verify.status).toBe(200);
      const answer = verify.json as Record<string, unknown>;
      expect(answer, String(answer.failure_detail)).toMatchObject({ reward: 1, resolved: true, evaluation_completed: true, patch_applied_with: 'git apply' });
      expect(Object.keys(answer).length).toBe(SWE_EXTRA_KEYS.length + 3);
    } finally {
      await server.close();
      await app.close();
    }

    const all = calls();
    const starts = all.filter((c) => c[0] === 'instance' && c[1] === 'start');
    const stops = all.filter((c) => c[0] === 'instance' && c[1] === 'stop');
    expect(starts).toHaveLength(2); // the agent's sandbox and the eval one
    expect(stops).toHaveLength(2);
    for (const start of starts) {
      const name = start.at(-1)!;
      expect(name).toMatch(/^rollserve-rs-[0-9a-f]{12}$/);
      expect(start).toEqual([
        'instance', 'start', '--containall', '--writable-tmpfs', '--no-home', '--net', '--network', 'none',
        '--bind', expect.stringMatching(new RegExp(`^/.*/workspace:${workdir}$`)),
        '--bind', expect.stringMatching(/:\/run\/rollserve$/),
        `docker://${image}`, name,
      ]);
    }
    // the agent's instance is stopped before the eval one starts
    const order = all.map((c) => `${c[1]} ${c.at(-1)}`);
    const agent = starts[0]!.at(-1)!;
    const evalName = starts[1]!.at(-1)!;
    expect(order.indexOf(`stop ${agent}`)).toBeLessThan(order.indexOf(`start ${evalName}`));
    expect(stops.map((s) => s[2])).toEqual([agent, evalName]);

    // every command runs as `exec --env-file <f> instance://<name> <limits> /bin/sh -c 'cd <dir> ...'`
    const execs = all.filter((c) => c[0] === 'exec');
    for (const exec of execs) {
      expect(exec[1]).toBe('--env-file');
      expect(exec[3]).toMatch(/^instance:\/\/rollserve-rs-/);
      expect(exec.slice(4, 4 + limitWrapper().length)).toEqual(limitWrapper());
    }
    const scripts = execs.map((c) => `${c[3]} ${c.at(-1)}`);
    const prepared = scripts.filter((s) => s.endsWith(freshRepoScript()));
    expect(prepared.map((s) => s.split(' ')[0])).toEqual([`instance://${agent}`, `instance://${evalName}`]);
    expect(prepared[0]).toContain(`cd '${testbed}' || exit 1`);
    expect(scripts.some((s) => s.startsWith(`instance://${agent}`) && s.includes('diff --cached --binary --no-color'))).toBe(true);
    expect(scripts.some((s) => s.startsWith(`instance://${evalName}`) && s.includes("git apply --verbose --whitespace=nowarn '/tmp/rollserve-swe/model.patch'"))).toBe(true);
    expect(scripts.some((s) => s.startsWith(`instance://${evalName}`) && s.includes("python3 -m pytest -rA 'tests/test_stats.py' 2>&1"))).toBe(true);
    // nothing copied in: the image holds the repository
    expect(scripts.some((s) => s.includes('tar -x'))).toBe(false);
  });
});
