#!/usr/bin/env bash
# The tests' local Slurm cluster: deploy/slurm/local-cluster with a state
# directory and ports of its own, so that a developer's cluster is not touched.
#   cluster.sh SOURCE_DIR start|stop|status|env [ARGS]
# `start` puts each node in a muster-lab lab host of its own (--lab: a network
# namespace with its own address, as on a cluster) where the lab can start,
# and on loopback otherwise, saying so in one line.
set -euo pipefail
SRC="${1:?usage: cluster.sh SOURCE_DIR start|stop|status|env}"
shift
export MUSTER_SLURM_DIR="${MUSTER_SLURM_TEST_DIR:-/tmp/muster-slurm-ctest}"
export MUSTER_SLURM_PORT="${MUSTER_SLURM_TEST_PORT:-16917}"
CLUSTER="$SRC/deploy/slurm/local-cluster"
[ "${1:-}" = start ] || exec "$CLUSTER" "$@"
pid_file="$MUSTER_SLURM_DIR/run/slurmctld.pid"
if [ -s "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  # Up already (the fixture started it): as it is placed.
  if [ -s "$MUSTER_SLURM_DIR/etc/lab-hosts" ]; then exec "$CLUSTER" "$@" --lab; fi
  exec "$CLUSTER" "$@"
fi
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null 2>&1; then
  rc=0
  out="$(mktemp)"
  "$CLUSTER" "$@" --lab 2>"$out" || rc=$?
  cat "$out" >&2
  # Only a lab that did not come up falls back to loopback; any other
  # reason this machine cannot run the cluster holds for loopback too.
  if [ "$rc" != 77 ] || ! grep -q "muster-lab up failed\|--lab needs" "$out"; then
    rm -f "$out"
    exit "$rc"
  fi
  rm -f "$out"
  echo "cluster.sh: the nodes share loopback: the lab did not start (above)"
fi
exec "$CLUSTER" "$@"
