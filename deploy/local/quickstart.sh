#!/usr/bin/env bash
# The quick start: set up a fresh machine, then run the main job on the embedded default
# (a local control plane with simulated S4000 + S5000 nodes, Redis, our roles, the seeds' pods).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/setup.sh
exec python3 -m controller.cli demo "$@"
