#!/usr/bin/env bash
# The tests' local Slurm cluster: deploy/slurm/local-cluster with a state
# directory and ports of its own, so that a developer's cluster is not touched.
#   cluster.sh SOURCE_DIR start|stop|status|env
set -euo pipefail
SRC="${1:?usage: cluster.sh SOURCE_DIR start|stop|status|env}"
shift
export MUSTER_SLURM_DIR="${MUSTER_SLURM_TEST_DIR:-/tmp/muster-slurm-ctest}"
export MUSTER_SLURM_PORT="${MUSTER_SLURM_TEST_PORT:-16917}"
exec "$SRC/deploy/slurm/local-cluster" "$@"
