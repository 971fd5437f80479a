#!/usr/bin/env bash
# The time-limit path: Slurm's warning (here SIGUSR1 sent to the batch shell
# with scancel --signal=USR1 --batch, as --signal=B:USR1@N does) makes the
# trainers checkpoint and exit 75; the batch script requeues the job; the
# requeued job (SLURM_RESTART_COUNT=1) restarts the coordinator on the same
# state directory, the trainers resume from that checkpoint, and the job
# completes.
#   requeue_test.sh SOURCE_DIR BIN_DIR [agent|direct]
set -euo pipefail
MODE="${3:-agent}"
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "$0")/lib.sh" "$1" "$2"
ensure_cluster

SCRIPT="$(batch_script "$MODE")"
export MUSTER_AGENT_ARGS="--max-restarts 1 --restart-backoff 1s"
STEPS=400
MUSTER_TRAIN_ARGS="$(train_args $STEPS --log-every 25 --checkpoint-every 1000)"
export MUSTER_TRAIN_ARGS
submit "$SCRIPT"
wait_output '^step (100|125|150)/' 120
scancel --signal=USR1 --batch "$JOB"
log "sent SIGUSR1 to the batch shell"
wait_output 'requeueing job' 60
wait_output 'run 2 \(SLURM_RESTART_COUNT=1\)' 60
log "requeued job started again"
wait_job_end 150

[ "$(job_field JobState)" = COMPLETED ] || fail "job state $(job_field JobState), want COMPLETED"
[ "$(job_field Restarts)" = 1 ] || fail "job restarts $(job_field Restarts), want 1"
stopped="$(sed -n 's/^muster: stopping at step \([0-9]*\) after checkpointing$/\1/p' "$WORK/out.log" | head -n 1)"
[ -n "$stopped" ] || fail "the trainers did not report stopping after a checkpoint"
resumed="$(sed -n 's/^muster: resumed from the checkpoint of step \([0-9]*\)$/\1/p' "$WORK/out.log" | head -n 1)"
[ "$resumed" = "$stopped" ] || fail "resumed from step '$resumed', want the stop checkpoint $stopped"
if [ "$stopped" -lt 100 ] || [ "$stopped" -ge $STEPS ]; then fail "stopped at step $stopped"; fi
grep -qE "^done: $STEPS steps .* test accuracy" "$WORK/out.log" || fail "no final accuracy line"
grep -E "^(muster: stopping|muster: resumed|done:)" "$WORK/out.log"
log "PASS: stopped at step $stopped, requeued, resumed from it and completed"
