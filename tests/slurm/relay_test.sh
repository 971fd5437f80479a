#!/usr/bin/env bash
# Submits deploy/slurm/train.sbatch with MUSTER_RELAY_EVERY=2 to the local
# cluster as 2 nodes x 2 trainers: one muster-relay, on the first node,
# carries both agents' sessions (over the job's TLS). Checks that the job
# completes, that each agent listed the relay before the coordinator, and
# that the relay carried calls and stopped with the job.
#   relay_test.sh SOURCE_DIR BIN_DIR agent
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "$0")/lib.sh" "$1" "$2"
ensure_cluster

export MUSTER_AGENT_ARGS="--max-restarts 1 --restart-backoff 1s"
export MUSTER_RELAY_EVERY=2
MUSTER_RELAY_PORT="$(free_port)"
export MUSTER_RELAY_PORT
MUSTER_TRAIN_ARGS="$(train_args 60 --log-every 20)"
export MUSTER_TRAIN_ARGS
submit train.sbatch
wait_job_end 150

[ "$(job_field JobState)" = COMPLETED ] || fail "job state $(job_field JobState), want COMPLETED"
[ "$(job_field ExitCode)" = 0:0 ] || fail "job exit $(job_field ExitCode), want 0:0"
grep -q "relays on every 2 nodes: [^ ]*:$MUSTER_RELAY_PORT " "$WORK/out.log" ||
  fail "the batch script started no relay"
grep -qE '^done: 60 steps .* test accuracy [0-9.]+%' "$WORK/out.log" ||
  fail "no final accuracy line from rank 0"
# Both nodes' agents: the relay first, the coordinator after it.
via="$(grep -cE "node node[12]: one session with [^ ]*:$MUSTER_RELAY_PORT,[^ ]+ for this node" \
  "$WORK/out.log" || true)"
[ "$via" = 2 ] || fail "want both agents to list the relay first, saw $via"
relay_log="$WORK/job/relay.log"
grep -q "muster-relay: listening on port $MUSTER_RELAY_PORT" "$relay_log" ||
  fail "no relay listened: $(cat "$relay_log")"
calls="$(sed -nE 's/.*stopping after ([0-9]+) calls.*/\1/p' "$relay_log" | tail -1)"
[ -n "$calls" ] || fail "the relay did not stop with the job: $(cat "$relay_log")"
[ "$calls" -gt 0 ] || fail "the relay carried no call: $(cat "$relay_log")"
log "PASS: 2 nodes through one relay completed; the relay carried $calls calls"
