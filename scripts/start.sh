#!/usr/bin/env bash
# The quickstart's first command: install everything, then start the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec node packages/cli/bin/rollserve.js start "$@"
