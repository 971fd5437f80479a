#!/usr/bin/env bash
# The coordinator dies in the middle of a job (SIGKILL, as a crash or the
# OOM killer would): the batch script's guard restarts it on the same state
# dir and port, the agents and trainers reconnect and re-register, training
# goes on from where it was (no step lost, no requeue), and the job
# completes.
#   coordinator_restart_test.sh SOURCE_DIR BIN_DIR [agent|direct]
set -euo pipefail
MODE="${3:-agent}"
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "$0")/lib.sh" "$1" "$2"
ensure_cluster

SCRIPT="$(batch_script "$MODE")"
export MUSTER_AGENT_ARGS="--max-restarts 1 --restart-backoff 1s"
STEPS=400
MUSTER_TRAIN_ARGS="$(train_args $STEPS --log-every 25 --compute-ms 10)"
export MUSTER_TRAIN_ARGS
submit "$SCRIPT"
wait_output '^step (75|100|125)/' 120
# The coordinator itself, not its guard (whose command line holds the
# coordinator's too).
coordinator="$(pgrep -f "^[^ ]*/muster-coordinator --listen .*$WORK/job/state" | head -n 1)" ||
  fail "no coordinator process of the job"
kill -KILL "$coordinator"
log "killed the coordinator (pid $coordinator)"
wait_job_end 200

expect_completed_without_requeue
grep -q "the coordinator exited (137); restart 1 of 5 on the same state" \
  "$WORK/job/coordinator.log" || fail "the guard did not restart the coordinator"
grep -qE "^done: $STEPS steps .* test accuracy" "$WORK/out.log" || fail "no final accuracy line"
expect_steps_never_went_back "the restart"
grep -h "muster-coordinator-guard:" "$WORK/job/coordinator.log" || true
log "PASS: the coordinator was restarted in place and the job completed"
