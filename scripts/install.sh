#!/usr/bin/env bash
# Installs everything rollserve needs on a Debian/Ubuntu machine that has Node 20.19+:
# system packages (bubblewrap for the sandboxes, python3 with IPython and pytest for the Python
# tool and the SWE environment, numpy for the Python client's training batches, git, patch and
# tmux; skopeo, umoci and squashfs-tools for container images; postgresql for the store's tests;
# slurm-wlm and munge for the Slurm tests), pnpm, the workspace's dependencies, and the build. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_node_major=20
node_version=$(node --version 2>/dev/null || true)
if [ -z "$node_version" ]; then
  echo "rollserve: Node.js 20.19 or newer is required (node is not on PATH)" >&2
  exit 1
fi
major=${node_version#v}; major=${major%%.*}
if [ "$major" -lt "$need_node_major" ]; then
  echo "rollserve: Node.js 20.19 or newer is required (found $node_version)" >&2
  exit 1
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v git >/dev/null 2>&1 || missing+=(git)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v patch >/dev/null 2>&1 || missing+=(patch)
# Container images without Docker or root: OCI archives copied by skopeo and unpacked by umoci,
# Apptainer/Singularity (SIF, squashfs) images unpacked by unsquashfs.
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v unsquashfs >/dev/null 2>&1 || missing+=(squashfs-tools)
# The store's PostgreSQL engine is tested against a throwaway cluster the tests start (initdb, pg_ctl).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# Rollout nodes on Slurm are tested on a single-host cluster the tests start (slurmctld, slurmd and
# the client commands from slurm-wlm; munged for its authentication).
command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ] || missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || missing+=(munge)
# Sandboxes run the system's python3 (not a pyenv or venv one): the SWE environment's tests need
# pytest there.
/usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || missing+=(python3-pytest)
# The Python client's training batches (rollserve.training) are numpy arrays; its tests run there.
/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 || missing+=(python3-numpy)
# The Python tool uses IPython's InteractiveShell where the sandbox's Python has it.
/usr/bin/python3 -c 'import IPython' >/dev/null 2>&1 || missing+=(python3-ipython)
if [ ${#missing[@]} -gt 0 ]; then
  echo "rollserve: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

pnpm_version=$(node -p "require('./package.json').packageManager.split('@')[1]")
if [ "$(pnpm --version 2>/dev/null || true)" != "$pnpm_version" ]; then
  echo "rollserve: installing pnpm $pnpm_version"
  "${sudo_cmd[@]}" npm install -g --silent "pnpm@$pnpm_version"
fi

pnpm install --frozen-lockfile
pnpm build
