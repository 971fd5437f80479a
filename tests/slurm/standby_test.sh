#!/usr/bin/env bash
# MUSTER_STANDBY=1: a standby coordinator runs as a job step on the second
# node. The first coordinator hangs (SIGSTOP, as a node that stops
# answering): the standby takes the lease and rewrites the address file,
# the agents and trainers follow it, and the job completes without a
# requeue. The old coordinator, woken, finds its lease taken over, exits 4,
# and its guard restarts it as a standby. TLS is on (the default): the one
# certificate names both coordinators' hosts.
#   standby_test.sh SOURCE_DIR BIN_DIR [agent|direct]
set -euo pipefail
MODE="${3:-agent}"
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "$0")/lib.sh" "$1" "$2"
ensure_cluster

SCRIPT="$(batch_script "$MODE")"
export MUSTER_STANDBY=1
MUSTER_STANDBY_PORT="$(free_port)"
export MUSTER_STANDBY_PORT
# A 2 s lease: the standby serves about 2 s after the hang.
export MUSTER_COORDINATOR_ARGS="--lease-timeout 2s"
export MUSTER_AGENT_ARGS="--max-restarts 1 --restart-backoff 1s"
STEPS=400
MUSTER_TRAIN_ARGS="$(train_args $STEPS --log-every 25 --compute-ms 10)"
export MUSTER_TRAIN_ARGS
submit "$SCRIPT"
wait_output '^step (75|100|125)/' 120
address="$WORK/job/coordinator.address"
# Where the job put its coordinators: each node's address as muster-job.sh
# finds it (the host name, or Slurm's NodeAddr where the name does not
# resolve to an address other than loopback).
first="$(sed -n 's/.*, coordinator \([^ ,]*\), job dir .*/\1/p' "$WORK/out.log" | head -n 1)"
standby="$(sed -n 's/.* standby coordinator \([^ ]*\) on the second node.*/\1/p' "$WORK/out.log" |
  head -n 1)"
[ "${first##*:}" = "$MUSTER_PORT" ] && [ "${standby##*:}" = "$MUSTER_STANDBY_PORT" ] ||
  fail "the job named its coordinators '$first' and '$standby'"
[ "$(cat "$address")" = "$first" ] ||
  fail "the address file names '$(cat "$address")', not the first coordinator"
grep -q "standby: the lease of .* is held by" "$WORK/job/standby.log" ||
  fail "the standby is not waiting: $(cat "$WORK/job/standby.log")"
# The first coordinator itself, not its guard (whose command line holds the
# coordinator's too).
primary="$(pgrep -f "^[^ ]*/muster-coordinator --listen 0.0.0.0:$MUSTER_PORT .*$WORK/job/state" |
  head -n 1)" || fail "no first coordinator process of the job"
kill -STOP "$primary"
log "stopped the first coordinator (pid $primary)"
deadline=$(($(date +%s) + 30))
until [ "$(cat "$address" 2>/dev/null)" = "$standby" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { kill -CONT "$primary"; fail "the standby did not take over"; }
  sleep 0.1
done
log "the standby serves: $(cat "$address")"
sleep 2
kill -CONT "$primary"
wait_job_end 200

expect_completed_without_requeue
grep -q "lease of .*: epoch 2, held by $standby" \
  "$WORK/job/standby.log" || fail "the standby's log shows no takeover"
grep -q "lease (epoch 1) was taken over: epoch 2" "$WORK/job/coordinator.log" ||
  fail "the first coordinator did not stand down"
grep -q "the coordinator exited (4); restart 1 of 5" "$WORK/job/coordinator.log" ||
  fail "the guard did not restart the first coordinator after it stood down"
grep -qE "^done: $STEPS steps .* test accuracy" "$WORK/out.log" || fail "no final accuracy line"
expect_steps_never_went_back "the takeover"
log "PASS: the standby took over from a hung coordinator and the job completed"
