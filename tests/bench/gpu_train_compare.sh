#!/usr/bin/env bash
# muster-train against PyTorch eager mode on the GPU, side by side: the same
# model, batch, optimizer and step timing (tests/bench/pytorch_step.py).
# World 1 runs muster on NCCL; world 2 runs two trainers as two "nodes"
# sharing the GPU (hier: NCCL inside each node, Gloo across from pinned host
# buffers) against PyTorch DDP over Gloo.
#
# Usage: gpu_train_compare.sh BIN_DIR MODEL DATA WORLD
#   (PYTORCH_STEP_MS set: PyTorch's step time from an earlier run, not run again)
#   MODEL  cnn or resnet18
#   DATA   synthetic (224x224 RGB) or a Fashion-MNIST directory (28x28 grey)
# Prints: train device=cuda model=M data=D batch=B world=W muster_step_ms=T
#         pytorch_step_ms=T ratio=R
# and each muster rank's step timeline (Distributed::step_timeline, medians):
#         phases rank=R step_ms=.. forward_ms=.. ... gather_ms=..
set -euo pipefail
bin=$1 model=$2 data=$3 world=$4
batch=${BATCH:-64}
steps=${STEPS:-60}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

if [[ $data == synthetic ]]; then
  data_flags=(--dataset=synthetic --synthetic-size=224 --synthetic-channels=3)
  py_flags=(--size 224 --channels 3)
  data_name=synthetic224
else
  data_flags=(--dataset=fashion-mnist "--data-dir=$data")
  py_flags=(--size 28 --channels 1)
  data_name=fashion-mnist
fi
backend=nccl
if ((world > 1)); then backend=hier; fi

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin/muster-coordinator" "--listen=127.0.0.1:$port" --no-auth "--min-members=$world" \
  "--max-members=$world" --last-call=0s >"$dir/coordinator.log" 2>&1 &
coordinator=$!
pids=()
for ((i = 0; i < world; i++)); do
  "$bin/muster-train" "--coordinator=127.0.0.1:$port" "--node-id=node$i" --local-rank=0 \
    "--model=$model" "${data_flags[@]}" "--batch-size=$batch" "--steps=$steps" --device=cuda \
    "--backend=$backend" --time-steps --quiet "--job=compare$$" \
    "--summary-json=$dir/summary$i.json" >"$dir/trainer$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
kill "$coordinator" 2>/dev/null || true
if ((failed)); then
  tail -n 20 "$dir"/trainer*.log >&2
  exit 1
fi
# muster's slowest rank, and the warm-up steps it left out, which PyTorch's
# median leaves out too.
read -r muster_ms warmup < <(python3 - "$dir" "$world" <<'PY'
import json, sys
d, w = sys.argv[1], int(sys.argv[2])
s = [json.load(open(f"{d}/summary{i}.json")) for i in range(w)]
print(max(x["step_ms_p50"] for x in s), s[0]["step_ms_warmup"])
PY
)
if [[ -n ${PYTORCH_STEP_MS:-} ]]; then  # measured by an earlier run of the same comparison
  pytorch_ms=$PYTORCH_STEP_MS
else
  line=$(python3 "$here/pytorch_step.py" --model "$model" "${py_flags[@]}" --batch "$batch" \
    --steps "$steps" --warmup "$warmup" --world "$world")
  pytorch_ms=${line##*step_ms_p50=}
fi
ratio=$(python3 -c "print(f'{$muster_ms / $pytorch_ms:.3f}')")
echo "train device=cuda model=$model data=$data_name batch=$batch world=$world" \
  "muster_step_ms=$muster_ms pytorch_step_ms=$pytorch_ms ratio=$ratio"
python3 - "$dir" "$world" <<'PY'
import json, sys
d, w = sys.argv[1], int(sys.argv[2])
for i in range(w):
    s = json.load(open(f"{d}/summary{i}.json"))
    fields = " ".join(f"{k[len('phase_'):]}={v}" for k, v in s.items() if k.startswith("phase_"))
    print(f"phases rank={s['rank']} {fields}")
PY
