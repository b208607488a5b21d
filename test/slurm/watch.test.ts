import { goneSlurmJobs, slurmJobOf } from '@rollserve/core';
import { slurmMissing, startTestSlurm, type TestSlurm } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// How the service learns from Slurm that a node's job is gone (squeue against a real controller).
const missing = slurmMissing();
if (missing !== undefined && process.env.CI) throw new Error(`the Slurm suite must run in CI: ${missing}`);

describe.skipIf(missing !== undefined)('asking Slurm whether node jobs are gone', () => {
  let slurm: TestSlurm;
  beforeAll(async () => {
    slurm = await startTestSlurm({ nodes: 1 });
  }, 120_000);
  afterAll(async () => {
    await slurm?.close();
  }, 120_000);

  it('tells running jobs from cancelled and unknown ones, and concludes nothing without squeue', async () => {
    const env = { ...process.env, ...slurm.env };
    const running = await slurm.sbatch(['--wrap', 'sleep 300']);
    const array = await slurm.sbatch(['--array=0-1', '--wrap', 'sleep 300']);
    const waitFor = async (check: () => Promise<boolean>) => {
      while (!(await check())) await new Promise((r) => setTimeout(r, 200));
    };
    await waitFor(async () => (await slurm.jobs(running))[0]?.state === 'RUNNING');
    const first = slurmJobOf({ slurm: { arrayJobId: array, arrayTaskId: '0', jobId: 'ignored' } })!;
    expect(first).toBe(`${array}_0`);
    const node = (await slurm.jobs(running))[0]!.nodeList;
    const refs = [{ id: running, node }, { id: first }];
    await waitFor(async () => (await goneSlurmJobs(refs, { env }))?.size === 0);
    // the same job id running on another Slurm node than the one a node registered from: a new run
    expect([...(await goneSlurmJobs([{ id: running, node: 'elsewhere' }], { env }))!]).toEqual([running]);

    await slurm.cancel(running);
    await waitFor(async () => (await goneSlurmJobs(refs, { env }))?.has(running) === true);
    expect((await goneSlurmJobs(refs, { env }))!.has(first)).toBe(false);
    // a job id the controller never knew (or purged): gone, and it does not hide the others' state
    expect([...(await goneSlurmJobs([{ id: '999999' }, { id: first }], { env }))!]).toEqual(['999999']);
    // a controller that does not answer: nothing concluded; no squeue at all: an error
    expect(await goneSlurmJobs([{ id: first }], { env: { ...env, SLURM_CONF: '/nonexistent/slurm.conf' } })).toBeUndefined();
    await expect(goneSlurmJobs([{ id: first }], { env, squeue: '/nonexistent/squeue' })).rejects.toMatchObject({ code: 'ENOENT' });
    await slurm.cancel(array);
  }, 120_000);
});
