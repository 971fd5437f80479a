#!/usr/bin/env bash
# Spare nodes: train.sbatch with MUSTER_SPARE_NODES=1 on 2 nodes x 2 runs the
# world on node1 and two hot spares on node2. `muster status` shows them as
# spares; a SIGKILLed trainer of node1 is replaced by a spare in the next
# generation (the coordinator's events say which); node1's agent restarts the
# killed trainer, which waits as a spare in turn; the job completes with exit
# 0, the spares included.
#   spare_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "$0")/lib.sh" "$1" "$2"
ensure_cluster

export MUSTER_SPARE_NODES=1
export MUSTER_AGENT_ARGS="--max-restarts 2 --restart-backoff 1s"
MUSTER_TRAIN_ARGS="$(train_args 400 --log-every 25 --checkpoint-every 100 --compute-ms 20)"
export MUSTER_TRAIN_ARGS
submit train.sbatch
wait_output '^step 50/' 120
grep -q "the last 1 nodes run spares only: a world of 2, 2 spares" "$WORK/out.log" ||
  fail "the batch script did not set up spare nodes"
target="$(sed -n 's/.*, coordinator \([^,]*\), job dir.*/\1/p' "$WORK/out.log" | head -n 1)"

# Prints "ID STATE RANK" per member of `muster status --json`.
members() {
  "$BIN/muster" --coordinator "$target" --token-file "$WORK/job/token" \
    --tls-ca "$WORK/job/tls/cert.pem" --json status |
    python3 -c '
import json, sys
for m in json.load(sys.stdin).get("members", []):
    print(m["member"]["member_id"], m["state"], m["rank"])'
}

view="$(members)"
echo "$view"
[ "$(grep -c ' spare ' <<< "$view")" = 2 ] || fail "want 2 spares in muster status"
[ "$(grep -cE '^node2/[01] spare ' <<< "$view")" = 2 ] || fail "the spares are not node2's"

# SIGKILL node1's local rank 0 (the agent sets MUSTER_NODE_ID and
# MUSTER_LOCAL_RANK in each trainer's environment).
victim=""
for pid in $(pgrep -f "muster-train .*$WORK/job" || true); do
  env="$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null)" || continue
  if grep -qx MUSTER_NODE_ID=node1 <<< "$env" && grep -qx MUSTER_LOCAL_RANK=0 <<< "$env"; then
    victim="$pid"
  fi
done
[ -n "$victim" ] || fail "no trainer node1/0 found"
kill -KILL "$victim"
log "SIGKILL node1/0 (pid $victim)"

# A spare of node2 takes the place, and the restarted node1/0 becomes a spare.
deadline=$(($(date +%s) + 60))
while :; do
  view="$(members 2>/dev/null || true)"
  if grep -qE '^node2/[01] active ' <<< "$view" && grep -qE '^node1/0 spare ' <<< "$view"; then
    break
  fi
  [ "$(date +%s)" -lt "$deadline" ] || fail "no spare took node1/0's place:
$view"
  sleep 0.5
done
echo "$view"
grep -qE 'spare: node2/[01] takes rank [01] in generation [0-9]+' "$WORK/job/coordinator.log" ||
  fail "no event of a spare taking a rank in the coordinator log"

wait_job_end 180
[ "$(job_field JobState)" = COMPLETED ] || fail "job state $(job_field JobState), want COMPLETED"
[ "$(job_field ExitCode)" = 0:0 ] || fail "job exit $(job_field ExitCode), want 0:0"
grep -qE '^done: 400 steps .* test accuracy' "$WORK/out.log" || fail "no final accuracy line"
grep -E 'spare: ' "$WORK/job/coordinator.log"
log "PASS: a spare node's trainer replaced a killed one, the restart became a spare, and the job completed"
