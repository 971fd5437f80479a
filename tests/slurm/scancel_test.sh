#!/usr/bin/env bash
# scancel in the middle of training: the job ends and nothing of it is left
# running: no coordinator, agent, trainer or srun of the job. How the trainers
# end is not checked: they checkpoint and exit 75 when every rank sees the
# stop at the same step, and are killed after KillWait when Slurm's SIGTERM
# reached one node a step earlier than the other (that node's trainers then
# leave, and the rest wait for members until killed).
#   scancel_test.sh SOURCE_DIR BIN_DIR agent|direct
set -euo pipefail
MODE="${3:?agent|direct}"
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "$0")/lib.sh" "$1" "$2"
ensure_cluster

SCRIPT="$(batch_script "$MODE")"
export MUSTER_AGENT_ARGS="--max-restarts 1 --restart-backoff 1s"
MUSTER_TRAIN_ARGS="$(train_args 100000 --log-every 25)"
export MUSTER_TRAIN_ARGS
submit "$SCRIPT"
wait_output '^step 100/' 120
[ -n "$(job_processes)" ] || fail "found no processes of the running job (the check sees nothing)"
scancel "$JOB"
log "scancel $JOB"
wait_job_end 60
[ "$(job_field JobState)" = CANCELLED ] || fail "job state $(job_field JobState), want CANCELLED"
left=""
for _ in $(seq 40); do
  left="$(job_processes)"
  [ -z "$left" ] && break
  sleep 0.5
done
[ -z "$left" ] || fail "processes of job $JOB still running after it ended:
$left"
case "$(job_field ExitCode)" in
  75:0) how="the trainers checkpointed and exited 75" ;;
  0:9) how="Slurm killed the rest after KillWait (SIGTERM reached the nodes at different steps)" ;;
  *) how="exit $(job_field ExitCode)" ;;
esac
log "PASS: scancel left no process of the job behind; $how"
