#!/usr/bin/env bash
# muster-train against PyTorch DDP on the CPU, side by side in one run: the
# same model, batch (64 per rank), optimizer, Fashion-MNIST-shaped input and
# step timing (tests/bench/pytorch_step.py; muster's --time-steps leaves out
# only loading the batch). muster runs NODES "nodes" of PER_NODE trainers on
# this host (shm inside a node, Gloo across, hier for both); PyTorch runs DDP
# over Gloo at the same world size, with bf16_compress_hook/fp16_compress_hook
# when COMPRESSION is bf16/fp16. Both get the host's CPUs shared out among
# all the ranks (several "nodes" on one host would each count every CPU).
#
# Usage: cpu_train_compare.sh BIN_DIR MODEL NODES PER_NODE [COMPRESSION]
#   MODEL        mlp or cnn;  COMPRESSION  none (default), bf16 or fp16
# Prints: train device=cpu model=M nodes=N per_node=P compression=C
#         muster_step_ms=T pytorch_step_ms=T speedup=S   (S > 1: muster faster)
set -euo pipefail
bin=$1 model=$2 nodes=$3 per_node=$4 compression=${5:-none}
steps=${STEPS:-100}
world=$((nodes * per_node))
cpus=$(nproc)
threads=$((cpus / world > 0 ? cpus / world : 1))
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin/muster-coordinator" "--listen=127.0.0.1:$port" --no-auth "--min-members=$world" \
  "--max-members=$world" --last-call=0s >"$dir/coordinator.log" 2>&1 &
coordinator=$!
pids=()
for ((i = 0; i < world; i++)); do
  "$bin/muster-train" "--coordinator=127.0.0.1:$port" "--node-id=node$((i / per_node))" \
    "--local-rank=$((i % per_node))" "--model=$model" --batch-size=64 "--steps=$steps" \
    --lr=0.01 "--threads=$threads" "--gradient-compression=$compression" --time-steps --quiet \
    "--job=cpucompare$$" "--summary-json=$dir/summary$i.json" >"$dir/trainer$i.log" 2>&1 &
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
python=${PYTHON:-python3}
line=$("$python" "$here/pytorch_step.py" --device cpu --model "$model" --size 28 --channels 1 \
  --batch 64 --steps "$steps" --warmup "$warmup" --world "$world" --threads "$threads" \
  --comm-hook "$compression" 2>/dev/null | grep '^pytorch device')
pytorch_ms=${line##*step_ms_p50=}
speedup=$(python3 -c "print(f'{$pytorch_ms / $muster_ms:.2f}')")
echo "train device=cpu model=$model nodes=$nodes per_node=$per_node compression=$compression" \
  "muster_step_ms=$muster_ms pytorch_step_ms=$pytorch_ms speedup=$speedup"
