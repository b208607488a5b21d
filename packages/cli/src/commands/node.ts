import { availableParallelism } from 'node:os';
import { defineCommand } from 'citty';
import { pino } from 'pino';
import { RolloutError } from '@rollserve/core';
import { loadEnvironment } from '@rollserve/core/gym';
import { startRolloutNode, type RolloutNode } from '@rollserve/core/node';
import { listInstalledEnvironments } from '../discover.ts';
import { applyImageFlags, imageArgs, numberFlag } from '../flags.ts';
import { defaultPools, runNodeProcesses, SUPERVISED_ENV } from '../node-processes.ts';
import { sweepStaleSandboxes } from '../sweep.ts';
import { version } from '../version.ts';

export default defineCommand({
  meta: { name: 'node', description: 'A rollout node: runs the INIT/RUN/EVAL pools and sandboxes of this machine for a central service (one per Slurm node; --processes for several on a large one)' },
  args: {
    service: { type: 'string', description: 'The central rollout service, http://host:8100 (also ROLLSERVE_SERVICE)' },
    token: { type: 'string', description: 'Its bearer token: its --node-token when it has one, else its --token (also ROLLSERVE_TOKEN)' },
    id: { type: 'string', description: 'Node id, kept across re-registrations (default: <host>-<SLURM_JOB_ID or pid>-<random>)' },
    init: { type: 'string', description: 'INIT worker slots (sandbox start-up; default: 4 per core, at most 64)' },
    run: { type: 'string', description: 'RUN worker slots (agent loops; default: 64 per core, at most 512)' },
    eval: { type: 'string', description: 'EVAL worker slots (verification; default: 2 per core, at most 32)' },
    'max-rollouts': { type: 'string', description: 'Rollouts held at once (default: --init + --run)' },
    processes: {
      type: 'string',
      description:
        'Node processes on this host, each a node of its own with pools of its share of the CPUs where not given (an --id gets -0, -1, …): one node process keeps ~6-8 cores busy with sandboxed rollouts (default 1)',
    },
    'host-label': { type: 'string', description: 'Host name to register with (default: this host\'s name)' },
    'service-lost-s': { type: 'string', description: 'Exit (status 3, sandboxes killed) when the service has not answered for this long', default: '300' },
    'slurm-check-s': { type: 'string', description: 'Under Slurm, ask squeue this often whether this node\'s job is gone, and exit (status 3) if so; 0: never', default: '30' },
    'proxy-turns': {
      type: 'boolean',
      description: "Send the policy's turns through the service (as a node before direct backends did) instead of to the backends the service routes each rollout to",
      default: false,
    },
    ...imageArgs,
  },
  async run({ args, rawArgs }) {
    applyImageFlags(args);
    const service = (args.service ?? process.env.ROLLSERVE_SERVICE) || undefined;
    if (service === undefined) throw new RolloutError({ code: 'BAD_REQUEST', message: '--service is required (or ROLLSERVE_SERVICE): the central rollout service, http://host:8100' });
    const given = {
      init: numberFlag('init', args.init, { integer: true, min: 1 }),
      run: numberFlag('run', args.run, { integer: true, min: 1 }),
      eval: numberFlag('eval', args.eval, { integer: true, min: 1 }),
    };
    const processes = numberFlag('processes', args.processes, { integer: true, min: 1 }) ?? 1;
    if (processes > 1) process.exit(await runNodeProcesses(processes, rawArgs, given));
    const installed = listInstalledEnvironments();
    if (installed.length === 0) throw new Error('no environments installed');
    const environments = await Promise.all(installed.map((env) => loadEnvironment(env.dir)));
    // Pools sized to this host's cores unless given: a sandbox with a Python kernel costs ~0.4 s of
    // CPU to start, and a node starved of CPU past the node timeout cannot heartbeat (README, "HPC").
    const pools = defaultPools(availableParallelism(), given);
    const maxRollouts = numberFlag('max-rollouts', args['max-rollouts'], { integer: true, min: 1 });
    const serviceLostMs = numberFlag('service-lost-s', args['service-lost-s'], { min: 0.1 })! * 1000;
    const slurmCheckS = numberFlag('slurm-check-s', args['slurm-check-s'], { min: 0 })!;
    const token = (args.token ?? process.env.ROLLSERVE_TOKEN) || undefined;
    await sweepStaleSandboxes();
    // stdout has the one line of registration; the log goes to stderr
    const logger = pino({ name: 'rollserve-node', level: process.env.ROLLSERVE_LOG_LEVEL ?? 'warn' }, pino.destination(2));
    // SIGTERM (Slurm's scancel, preemption) or SIGINT: leave cleanly, what the node held re-queued at once
    let rolloutNode: RolloutNode | undefined;
    // A signal more while it leaves changes nothing: Slurm signals every process of a step, and a
    // supervisor (--processes) passes its own on too; a leave that hangs ends with Slurm's SIGKILL.
    let leaving = false;
    const leave = (signal: NodeJS.Signals) => {
      if (leaving) return;
      leaving = true;
      if (rolloutNode === undefined) process.exit(0); // not registered yet: nothing held
      rolloutNode.close().then(
        () => process.exit(0),
        (error: unknown) => {
          console.error(`rollserve node: error while leaving on ${signal}:`, error);
          process.exit(1);
        },
      );
    };
    process.on('SIGINT', leave);
    process.on('SIGTERM', leave);
    if (process.env[SUPERVISED_ENV] === '1') {
      // started by `--processes` (node-processes.ts): its stdin is a pipe only the supervisor
      // holds, whose end says the supervisor is gone (killed): leave as on SIGTERM
      process.stdin.on('error', () => leave('SIGTERM'));
      process.stdin.on('end', () => leave('SIGTERM'));
      process.stdin.resume();
    }
    rolloutNode = await startRolloutNode({
      serviceUrl: service,
      logger,
      environments,
      pools,
      version,
      ...(token ? { token } : {}),
      ...(args.id ? { nodeId: args.id } : {}),
      ...(maxRollouts ? { maxRollouts } : {}),
      ...(args['host-label'] ? { host: args['host-label'] } : {}),
      serviceLostMs,
      ...(args['proxy-turns'] ? { directBackends: false } : {}),
      slurmCheck: slurmCheckS > 0 ? { everyMs: slurmCheckS * 1000 } : false,
      onEvent: (event) => {
        if (event.type === 'registered' && event.again) console.error(`node ${event.nodeId} registered again with ${service}`);
      },
    }).catch((error: unknown) => {
      // its service never answered: an orphan from the start
      if (RolloutError.isInstance(error) && error.code === 'UNAVAILABLE') {
        console.error(`rollserve node: ${error.message}; exiting`);
        process.exit(3);
      }
      throw error;
    });
    const { capacity, max_rollouts: held, environments: envs } = rolloutNode.registration;
    console.log(`node ${rolloutNode.nodeId} registered with ${service} (init ${capacity.init}, run ${capacity.run}, eval ${capacity.eval}; up to ${held} rollouts; ${envs.join(', ')})`);
    // the service refusing to take the node back ends it: exit 1 with the reason
    void rolloutNode.ended().then(({ refused, orphaned }) => {
      if (orphaned !== undefined) {
        // its service or its Slurm job is gone: its sandboxes are killed by now
        console.error(`rollserve node: ${orphaned}; exiting`);
        process.exit(3);
      }
      if (!refused) return;
      console.error(`rollserve node: the service refused this node: ${refused.message}`);
      process.exit(1);
    });
  },
});
