# shellcheck shell=bash
# Helpers for the Slurm tests, sourced by each test script:
#   source lib.sh SOURCE_DIR BIN_DIR
# They run against the local cluster of deploy/slurm/local-cluster, started
# by cluster.sh with a state directory and ports of its own.
# A test exits 77 (skipped) only when that cluster cannot run on this machine.
set -euo pipefail

SRC="$(cd "${1:?source dir}" && pwd)"
BIN="$(cd "${2:?bin dir}" && pwd)"
CLUSTER="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh"
eval "$("$CLUSTER" "$SRC" env)"  # SLURM_CONF (and ensure_cluster again)
WORK="$(mktemp -d /tmp/muster-slurm-test.XXXXXX)"
JOB=""
T0=$(date +%s)

log() { echo "[$(($(date +%s) - T0))s] $*"; }

# Shows what the job left, for a failing test.
dump_job() {
  echo "---- job output ($WORK/out.log)"
  cat "$WORK/out.log" 2>/dev/null || true
  echo "---- coordinator log (tail)"
  tail -n 20 "$WORK/job/coordinator.log" 2>/dev/null || true
  if [ -f "$WORK/job/standby.log" ]; then
    echo "---- standby coordinator log (tail)"
    tail -n 20 "$WORK/job/standby.log"
  fi
  if [ -n "$JOB" ]; then
    echo "---- scontrol show job $JOB"
    scontrol show job "$JOB" 2>/dev/null || true
  fi
}

fail() {
  echo "FAIL: $*" >&2
  dump_job >&2
  exit 1
}

cleanup() {
  local rc=$?
  if [ -n "$JOB" ]; then scancel "$JOB" 2>/dev/null || true; fi
  if [ "$rc" = 0 ] || [ "$rc" = 77 ]; then rm -rf "$WORK"; else echo "kept $WORK" >&2; fi
}
trap cleanup EXIT

# Starts the local cluster (a no-op when the fixture already did); exits 77
# when this machine cannot run it.
ensure_cluster() {
  local rc=0
  "$CLUSTER" "$SRC" start --nodes 2 > "$WORK/cluster.log" 2>&1 || rc=$?
  if [ "$rc" = 77 ]; then
    cat "$WORK/cluster.log"
    echo "SKIP: no local Slurm cluster on this machine (see above)"
    exit 77
  fi
  [ "$rc" = 0 ] || { cat "$WORK/cluster.log"; fail "local-cluster start failed ($rc)"; }
  eval "$("$CLUSTER" "$SRC" env)"  # in the lab, MUSTER_IFACE too
}

# A free TCP port on this machine (for the job's coordinator).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Submits SCRIPT for a small CPU job on 2 nodes x 2 trainers; MUSTER_* for
# the job come from the caller's environment. Sets JOB.
submit() {  # SCRIPT
  export MUSTER_BIN="$BIN" MUSTER_JOB_DIR="$WORK/job"
  MUSTER_PORT="$(free_port)"
  export MUSTER_PORT
  JOB="$(sbatch --parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
    --time=10:00 --output="$WORK/out.log" "$SRC/deploy/slurm/$1")" || fail "sbatch $1 failed"
  log "submitted $1 as job $JOB"
}

# The job's field NAME (JobState, ExitCode, Restarts) from scontrol.
job_field() {  # NAME
  scontrol show job -o "$JOB" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"
}

# Waits until the job has ended for good (a requeued job passes through
# PENDING again); fails after SECONDS.
wait_job_end() {  # SECONDS
  local deadline=$(($(date +%s) + $1)) state
  while [ "$(date +%s)" -lt "$deadline" ]; do
    state="$(job_field JobState)"
    case "$state" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        log "job $JOB ended: $state, exit $(job_field ExitCode), restarts $(job_field Restarts)"
        return 0 ;;
    esac
    sleep 0.5
  done
  fail "job $JOB still not finished after $1 s (state $(job_field JobState))"
}

# Waits until the job output matches the extended regex PATTERN.
wait_output() {  # PATTERN SECONDS
  local deadline=$(($(date +%s) + $2))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    grep -qE "$1" "$WORK/out.log" 2>/dev/null && return 0
    sleep 0.2
  done
  fail "no line matching '$1' in the job output after $2 s"
}

# Pids of live (not zombie) processes that belong to the job: the job's
# directory is on their command line, or its id is in their environment.
job_processes() {
  local dir pid state cmd env
  for dir in /proc/[0-9]*; do
    pid="${dir#/proc/}"
    state="$(sed 's/.*) //' "$dir/stat" 2>/dev/null | cut -d' ' -f1)" || continue
    if [ -z "$state" ] || [ "$state" = Z ]; then continue; fi
    cmd="$( { tr '\0' ' ' < "$dir/cmdline"; } 2>/dev/null)" || true
    env="$( { tr '\0' '\n' < "$dir/environ"; } 2>/dev/null)" || true
    if [[ "$cmd" == *"$WORK/job"* || $'\n'"$env"$'\n' == *$'\n'"SLURM_JOB_ID=$JOB"$'\n'* ]]; then
      echo "$pid $cmd"
    fi
  done
}

# The trainers' small run: Fashion-MNIST, the MLP, CPU.
train_args() {  # STEPS [more flags]
  local steps="$1"
  shift
  # --job: shared-memory names of their own (job ids repeat between clusters).
  echo "--model mlp --dataset fashion-mnist --batch-size 64 --steps $steps --device cpu" \
    "--threads 1 --job $(basename "$WORK") $*"
}

# The batch script of MODE: train.sbatch (agent) or train-direct.sbatch.
batch_script() {  # MODE
  if [ "$1" = direct ]; then echo train-direct.sbatch; else echo train.sbatch; fi
}

# Fails unless rank 0's "step N/" lines in the job output never go back
# (nothing was redone from a checkpoint) after EVENT.
expect_steps_never_went_back() {  # EVENT
  python3 - "$WORK/out.log" <<'PY' || fail "rank 0's steps went back after $1"
import re, sys
steps = [int(m.group(1)) for m in re.finditer(r"^step (\d+)/", open(sys.argv[1]).read(), re.M)]
sys.exit(0 if steps and steps == sorted(steps) else 1)
PY
}

# Fails unless the job completed with exit 0 in its first run (no requeue).
expect_completed_without_requeue() {
  [ "$(job_field JobState)" = COMPLETED ] || fail "job state $(job_field JobState), want COMPLETED"
  [ "$(job_field ExitCode)" = 0:0 ] || fail "job exit $(job_field ExitCode), want 0:0"
  [ "$(job_field Restarts)" = 0 ] || fail "job restarts $(job_field Restarts), want 0 (no requeue)"
}
