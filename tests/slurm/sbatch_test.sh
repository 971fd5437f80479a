#!/usr/bin/env bash
# Submits deploy/slurm/train.sbatch (MODE agent: one muster-agent per node) or
# train-direct.sbatch (MODE direct: srun starts the trainers) to the local
# cluster as 2 nodes x 2 trainers, and checks that the job completes with
# exit 0, that rank 0 printed its final test accuracy, that the job
# directory is private (0700), and that the coordinator served TLS with the
# job's own certificate (its key 0600), which every client pinned.
#   sbatch_test.sh SOURCE_DIR BIN_DIR agent|direct
set -euo pipefail
MODE="${3:?agent|direct}"
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "$0")/lib.sh" "$1" "$2"
ensure_cluster

case "$MODE" in
  agent) SCRIPT=train.sbatch; export MUSTER_AGENT_ARGS="--max-restarts 1 --restart-backoff 1s" ;;
  direct) SCRIPT=train-direct.sbatch ;;
  *) echo "usage: $0 SOURCE_DIR BIN_DIR agent|direct" >&2; exit 2 ;;
esac
MUSTER_TRAIN_ARGS="$(train_args 60 --log-every 20 --checkpoint-every 30)"
export MUSTER_TRAIN_ARGS
submit "$SCRIPT"
wait_job_end 150

[ "$(job_field JobState)" = COMPLETED ] || fail "job state $(job_field JobState), want COMPLETED"
[ "$(job_field ExitCode)" = 0:0 ] || fail "job exit $(job_field ExitCode), want 0:0"
grep -q "($MODE), coordinator" "$WORK/out.log" || fail "the job did not run in $MODE mode"
line="$(grep -E '^done: 60 steps .* test accuracy [0-9.]+%' "$WORK/out.log")" ||
  fail "no final accuracy line from rank 0"
echo "$line"
members="$(grep -oE 'member node[12]/[01] \(identity from [a-z-]+\)' "$WORK/out.log" | sort -u | wc -l)"
[ "$members" = 4 ] || fail "want 4 distinct members node1/0..node2/1, saw $members"
[ -f "$WORK/job/checkpoints/step-60/manifest.json" ] || fail "no checkpoint of step 60"
grep -q "training completed" "$WORK/out.log" || fail "no completion line from the batch script"
[ "$(stat -c %a "$WORK/job")" = 700 ] || fail "job dir mode $(stat -c %a "$WORK/job"), want 700"
grep -q "listening on port [0-9]* (TLS)" "$WORK/job/coordinator.log" ||
  fail "the coordinator did not serve TLS"
[ "$(stat -c %a "$WORK/job/tls/key.pem")" = 600 ] ||
  fail "certificate key mode $(stat -c %a "$WORK/job/tls/key.pem"), want 600"
log "PASS: $SCRIPT on 2 nodes x 2 trainers completed"
