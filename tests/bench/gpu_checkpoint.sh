#!/usr/bin/env bash
# Checkpoints on the GPU with muster-train (ResNet-18 on synthetic 224x224,
# world 1):
#   overhead  mean step time (everything but batch loading, after 20 warm-up
#             steps) with a checkpoint every 50 steps against none:
#             checkpoint device=cuda model=resnet18 every=50 step_ms_without=..
#             step_ms_with=.. step_overhead_pct=..
#   resume    SIGUSR1 mid-run (checkpoint, exit 75), a restart resumes, and
#             the final parameters equal an uninterrupted run's:
#             resume device=cuda model=M deterministic=D checksum_reference=..
#             checksum_resumed=.. equal=yes|no
#
# Usage: gpu_checkpoint.sh BIN_DIR overhead|resume
set -euo pipefail
bin=$1 what=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"; kill "${coordinator:-0}" 2>/dev/null || true' EXIT

start_coordinator() {  # start_coordinator NAME: a coordinator keeping its state in $dir/NAME
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin/muster-coordinator" "--listen=127.0.0.1:$port" --no-auth --min-members=1 \
    --max-members=1 --last-call=0s "--state-dir=$dir/$1-state" >>"$dir/$1-coordinator.log" 2>&1 &
  coordinator=$!
}

train() {  # train NAME FLAGS...: one trainer of job NAME; its exit code
  local name=$1
  shift
  local rc=0
  "$bin/muster-train" "--coordinator=127.0.0.1:$port" --node-id=node0 --local-rank=0 \
    --device=cuda "--job=$name$$" "--summary-json=$dir/$name.json" "$@" \
    >>"$dir/$name.log" 2>&1 || rc=$?
  return "$rc"
}

field() { python3 -c "import json; print(json.load(open('$1'))['$2'])"; }

resnet=(--model=resnet18 --dataset=synthetic --synthetic-size=224 --synthetic-channels=3
        --batch-size=64 --quiet)

if [[ $what == overhead ]]; then
  start_coordinator without
  train without "${resnet[@]}" --steps=300 --time-steps
  kill "$coordinator"
  start_coordinator with
  train with "${resnet[@]}" --steps=300 --time-steps "--checkpoint-dir=$dir/ckpt" \
    --checkpoint-every=50
  kill "$coordinator"
  without=$(field "$dir/without.json" step_ms_mean)
  with=$(field "$dir/with.json" step_ms_mean)
  echo "checkpoint device=cuda model=resnet18 every=50 step_ms_without=$without" \
    "step_ms_with=$with step_overhead_pct=$(python3 -c "print(f'{100 * ($with / $without - 1):.2f}')")"
  exit 0
fi

# resume: MODEL [deterministic] pairs
for spec in mlp:no cnn:no cnn:yes; do
  model=${spec%%:*} det=${spec##*:}
  flags=("--model=$model" --dataset=synthetic --batch-size=64 --steps=300 --lr=0.05
         --compute-ms=5 --log-every=10)
  [[ $det == yes ]] && flags+=(--deterministic)
  name=ref-$model-$det
  start_coordinator "$name"
  train "$name" "${flags[@]}"
  kill "$coordinator"
  name=cut-$model-$det
  start_coordinator "$name"
  train "$name" "${flags[@]}" "--checkpoint-dir=$dir/ckpt-$model-$det" &
  trainer=$!
  until grep -q '^step 150/' "$dir/$name.log" 2>/dev/null; do sleep 0.02; done
  pkill -USR1 -f "job=$name$$" || true
  rc=0
  wait "$trainer" || rc=$?
  if ((rc != 75)); then
    echo "resume: the interrupted trainer exited $rc, not 75" >&2
    tail -n 20 "$dir/$name.log" >&2
    exit 1
  fi
  train "$name" "${flags[@]}" "--checkpoint-dir=$dir/ckpt-$model-$det"
  kill "$coordinator"
  ref=$(field "$dir/ref-$model-$det.json" parameter_checksum)
  got=$(field "$dir/$name.json" parameter_checksum)
  equal=no
  [[ $ref == "$got" ]] && equal=yes
  echo "resume device=cuda model=$model deterministic=$det checksum_reference=$ref" \
    "checksum_resumed=$got equal=$equal"
done
