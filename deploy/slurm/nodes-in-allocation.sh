#!/bin/bash
# nodes-in-allocation.sh: one rollout node per host of an allocation that already exists (a trainer's
# job), each started as a job step of its own on that one host.
#
# What runs where:
#   - The central service (`rollserve start --store postgres://…`) and its database run on one host;
#     nodes reach the service over HTTP at ROLLSERVE_SERVICE and never talk to the database.
#   - On each host of the allocation: one step `srun -N1 -n1 -w <host> --overlap rollserve node …`,
#     running the INIT/RUN/EVAL pools and the sandboxes of its rollouts on that host. `--overlap` lets
#     the step share the host's CPUs and memory with the trainer's own steps (by default a step would
#     wait for resources another step holds).
#     On a host with more cores than one node process keeps busy (~6-8 with sandboxed multi-turn
#     rollouts; README, "One node process carries a host only so far"), ROLLSERVE_NODE_ARGS="--processes K"
#     makes the step run K nodes, each with pools of its share of the CPUs the step may use. (A step
#     asks for one CPU: where Slurm binds steps to their CPUs, task/affinity or cgroup ConstrainCores,
#     the node would see one; this script has not been run on such a cluster.)
#   - Never one step spanning every host: a step dies on all its hosts when one of them fails. With a
#     step per host, a failed host ends only its own step, and the service re-issues that node's work
#     once its lease lapses.
#
# The allocation must be made with `--no-kill` (`#SBATCH --no-kill`, `salloc --no-kill`): without it
# Slurm revokes the whole job, trainer included, when any one node fails.
#
# Usage, inside the trainer's batch script:
#   #SBATCH --nodes=8
#   #SBATCH --no-kill
#   ROLLSERVE_SERVICE=http://head:8100 deploy/slurm/nodes-in-allocation.sh &
#   srun … python train.py            # the trainer's own step(s)
# or from a login node, into a running job:
#   SLURM_JOB_ID=123456 ROLLSERVE_SERVICE=http://head:8100 deploy/slurm/nodes-in-allocation.sh
# Hosts may be given as arguments (default: every host of the allocation).
# It waits for its steps; SIGTERM or SIGINT to it is passed on to every node, which then leaves
# cleanly (what it held is re-queued at once on the service).
#
# Environment: ROLLSERVE_SERVICE (required), ROLLSERVE_TOKEN, ROLLSERVE_NODE_ARGS, ROLLSERVE_BIN and
# ROLLSERVE_SANDBOX_PROVIDER as in rollserve-nodes.sbatch (Apptainer is described there; without
# ROLLSERVE_BIN: `rollserve` on PATH, else the checkout holding this script, else the one it was
# started from; the hosts must see that path, e.g. on a shared filesystem), and
# ROLLSERVE_LOG_DIR: where each step's output goes (default: the current directory), as
# rollserve-node-<job id>.<step id>-<host>.out.
set -euo pipefail

: "${ROLLSERVE_SERVICE:?set ROLLSERVE_SERVICE to the central rollout service, e.g. http://head:8100}"
: "${SLURM_JOB_ID:?run this inside a Slurm allocation, or set SLURM_JOB_ID to the job to start nodes in}"
# How to run rollserve, as rollserve-nodes.sbatch resolves it: ROLLSERVE_BIN, else `rollserve` on PATH,
# else the checkout this script is in (the README runs it as deploy/slurm/nodes-in-allocation.sh of
# one), else the checkout it was started from, else say so before any step starts.
if [[ -z "${ROLLSERVE_BIN:-}" ]]; then
  if command -v rollserve >/dev/null; then
    ROLLSERVE_BIN=rollserve
  else
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    for dir in "$here/../.." "${SLURM_SUBMIT_DIR:-}" "$PWD"; do
      if [[ -n "$dir" && -f "$dir/packages/cli/bin/rollserve.js" ]]; then
        ROLLSERVE_BIN="node $(cd "$dir" && pwd)/packages/cli/bin/rollserve.js"
        break
      fi
    done
  fi
  : "${ROLLSERVE_BIN:?rollserve is not on PATH and neither the directory of this script nor ${SLURM_SUBMIT_DIR:-$PWD} is in a rollserve checkout (packages/cli/bin/rollserve.js): set ROLLSERVE_BIN, e.g. \"node /path/to/rollserve/packages/cli/bin/rollserve.js\"}"
fi
read -r -a rollserve <<<"$ROLLSERVE_BIN"
read -r -a node_args <<<"${ROLLSERVE_NODE_ARGS:-}"
log_dir="${ROLLSERVE_LOG_DIR:-$PWD}"

if (($# > 0)); then
  hosts=("$@")
else
  nodelist="${SLURM_JOB_NODELIST:-$(squeue -h -j "$SLURM_JOB_ID" -o %N)}"
  mapfile -t hosts < <(scontrol show hostnames "$nodelist")
fi

pids=()
for host in "${hosts[@]}"; do
  # One task on one host, sharing the host with the job's other steps. %j.%s is job.step, %N the host.
  srun --jobid="$SLURM_JOB_ID" --nodes=1 --ntasks=1 --nodelist="$host" --overlap \
    --job-name=rollserve-node --output="$log_dir/rollserve-node-%j.%s-%N.out" \
    "${rollserve[@]}" node --service "$ROLLSERVE_SERVICE" "${node_args[@]}" &
  pids+=("$!")
  echo "rollserve node: step on $host (srun pid $!) for $ROLLSERVE_SERVICE" >&2
done

# srun passes SIGTERM/SIGINT on to its task.
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
status=0
for i in "${!pids[@]}"; do
  while :; do
    wait "${pids[$i]}" && rc=0 || rc=$?
    # A trapped signal ends `wait` early (status > 128) while srun still runs: wait again.
    if ((rc > 128)) && kill -0 "${pids[$i]}" 2>/dev/null; then continue; fi
    break
  done
  echo "rollserve node: step on ${hosts[$i]} ended (exit $rc)" >&2
  ((rc == 0)) || status=$rc
done
exit "$status"
