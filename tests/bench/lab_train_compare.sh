#!/usr/bin/env bash
# muster-train against PyTorch DDP in a lab of shaped links (docs/lab.md),
# side by side: 2 nodes x 2 ranks, each node a muster-lab host whose link is
# shaped to RATE each way, a model whose gradients take longer to move than
# to compute on such a link: an MLP on 3 x 128 x 128 synthetic images
# (25.2 M parameters, 101 MB of float32 gradients), batch 16 per rank, SGD
# with momentum. Each run times, one after the other: muster (hier: shared
# memory inside a node, Gloo across) with float32 and with bf16 on the wire,
# then DDP over Gloo (one world of 4 spanning the two hosts) without a hook
# and with bf16_compress_hook. Step times are medians after warm-up (muster:
# its slowest rank's --time-steps median; DDP: rank 0's). Root only.
#   lab_train_compare.sh [RATE (1gbit)] [RUNS (3)]
# Environment: MUSTER_BIN (default build/bin), PYTHON (default .venv/bin/python),
# STEPS (default 40).
# Prints per run: lab-train rate=R side=S compression=C step_ms_p50=T
set -euo pipefail
# shellcheck source=tests/bench/lab_bench.sh
source "$(dirname "$0")/lab_bench.sh" lab_train_compare lt "$@"
steps="${STEPS:-40}"
model=(--model mlp)
gateway="$("$bin/muster-lab" gateway "$lab")"
addr=("$("$bin/muster-lab" addr "$lab" node0)" "$("$bin/muster-lab" addr "$lab" node1)")

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

muster_run() {  # COMPRESSION TAG -> prints the slowest rank's step_ms_p50
  local port; port="$(free_port)"
  "$bin/muster-coordinator" "--listen=0.0.0.0:$port" --no-auth --min-members=4 \
    --max-members=4 --last-call=0s > "$dir/coordinator-$2.log" 2>&1 &
  local coordinator=$! pids=() failed=0
  for i in 0 1 2 3; do
    local node=$((i / 2))
    "$bin/muster-lab" exec "$lab" "node$node" -- "$bin/muster-train" \
      "--coordinator=$gateway:$port" "--node-id=node$node" "--local-rank=$((i % 2))" \
      "--address=${addr[$node]}" "${model[@]}" --dataset=synthetic --synthetic-size=128 \
      --synthetic-channels=3 --batch-size=16 "--steps=$steps" --lr=0.01 --threads=1 \
      "--gradient-compression=$1" --time-steps --quiet "--job=labtrain$$-$2" \
      "--summary-json=$dir/summary-$2-$i.json" > "$dir/trainer-$2-$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  kill "$coordinator" 2> /dev/null || true
  wait "$coordinator" 2> /dev/null || true
  if ((failed)); then
    tail -n 20 "$dir"/trainer-"$2"-*.log >&2
    return 1
  fi
  python3 - "$dir" "$2" <<'PY'
import json, sys
d, tag = sys.argv[1], sys.argv[2]
s = [json.load(open(f"{d}/summary-{tag}-{i}.json")) for i in range(4)]
print(max(x["step_ms_p50"] for x in s), s[0]["step_ms_warmup"])
PY
}

ddp_run() {  # HOOK WARMUP -> prints rank 0's step_ms_p50
  local port; port="$(free_port)"
  local env=(env MASTER_ADDR="${addr[0]}" MASTER_PORT="$port" GLOO_SOCKET_IFNAME=eth0
             OMP_NUM_THREADS=1)
  local cmd=("$python" "$root/tests/bench/pytorch_step.py" --device cpu "${model[@]}"
             --size 128 --channels 3 --batch 16 --steps "$steps" --warmup "$2" --world 4
             --threads 1 --comm-hook "$1")
  "$bin/muster-lab" exec "$lab" node1 -- "${env[@]}" "${cmd[@]}" --ranks 2,3 > /dev/null 2>&1 &
  local peer=$!
  local line
  line="$("$bin/muster-lab" exec "$lab" node0 -- "${env[@]}" "${cmd[@]}" --ranks 0,1 2> /dev/null |
          grep '^pytorch device')"
  wait "$peer"
  echo "${line##*step_ms_p50=}"
}

for run in $(seq "$runs"); do
  echo "# run $run of $runs, links $rate, $steps steps"
  warmup=10
  for compression in none bf16; do
    read -r ms warmup < <(muster_run "$compression" "$run-$compression")
    echo "lab-train rate=$rate side=muster compression=$compression step_ms_p50=$ms"
  done
  for hook in none bf16; do
    echo "lab-train rate=$rate side=ddp compression=$hook step_ms_p50=$(ddp_run "$hook" "$warmup")"
  done
done
