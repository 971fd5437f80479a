#!/usr/bin/env bash
# muster's all-reduce against torch's Gloo in a lab of shaped links
# (docs/lab.md), side by side: 2 nodes x 2 ranks, 64 MiB of float32, each
# node a muster-lab host whose link is shaped to RATE each way. Each run
# times, one after the other: muster hier float32, muster hier with bf16 on
# the wire, torch Gloo float32 (all_reduce of a world of 4 spanning the two
# hosts) and torch Gloo with DDP's bf16 hook's casts. Prints each line as
# the programs print it. Root only (network namespaces).
#   lab_allreduce_compare.sh [RATE (1gbit)] [RUNS (3)]
# Environment: MUSTER_BIN (default build/bin), PYTHON (default .venv/bin/python).
set -euo pipefail
# shellcheck source=tests/bench/lab_bench.sh
source "$(dirname "$0")/lab_bench.sh" lab_allreduce_compare lc "$@"
bytes=$((64 << 20))
a0="$("$bin/muster-lab" addr "$lab" node0)"

torch_gloo() {  # HOOK PORT
  local env=(env MASTER_ADDR="$a0" MASTER_PORT="$2" GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1)
  local cmd=("$python" "$root/tests/bench/pytorch_step.py" --mode allreduce --world 4
             --bytes "$bytes" --comm-hook "$1")
  "$bin/muster-lab" exec "$lab" node1 -- "${env[@]}" "${cmd[@]}" --ranks 2,3 &
  local peer=$!
  "$bin/muster-lab" exec "$lab" node0 -- "${env[@]}" "${cmd[@]}" --ranks 0,1
  wait "$peer"
}

for run in $(seq "$runs"); do
  echo "# run $run of $runs, links $rate"
  for compression in none bf16; do
    "$bin/muster-bench" allreduce --world 4 --nodes 2 --backend hier --sizes 64M \
      --gradient-compression "$compression" --lab-rate "$rate" 2>/dev/null | grep -v '^#' || true
  done
  torch_gloo none $((29700 + run * 2))
  torch_gloo bf16 $((29701 + run * 2))
done
