#!/usr/bin/env bash
# A decode-heavy data loader, side by side in one run: examples/images.cc
# (muster::DataLoader) and PyTorch DDP with torch.utils.data.DataLoader
# (tests/bench/loader_step.py), each with 0 and WORKERS workers, one trainer
# on this host, the same synthetic images costing DECODE_US microseconds of
# CPU each, the same CNN, SGD and batch (16), STEPS steps (default 80;
# samples/s over the steps after the first 5, muster's from its metrics).
# WORKERS may list several counts, comma-separated (4,8).
#
# Usage: loader_compare.sh BIN_DIR [WORKERS] [DECODE_US]
# Prints: loader workers=W decode_us=U muster_samples_per_s=X pytorch_samples_per_s=Y
set -euo pipefail
bin=$1 workers=${2:-4} decode_us=${3:-2000}
steps=${STEPS:-80}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-$here/../../.venv/bin/python}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
muster_rate() {  # WORKERS
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin/muster-coordinator" "--listen=127.0.0.1:$port" --no-auth --min-members=1 \
    --max-members=1 "--state-dir=$dir/state-$1" >"$dir/coordinator-$1.log" 2>&1 &
  local coordinator=$!
  MUSTER_COORDINATOR="127.0.0.1:$port" "$bin/images" --workers "$1" --decode-us "$decode_us" \
    --steps "$steps" --batch 16 --log-dir "$dir/logs-$1" >"$dir/images-$1.log" 2>&1
  kill "$coordinator"
  wait "$coordinator" 2>/dev/null || true
  python3 - "$dir/logs-$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"{statistics.median(r['samples_per_s'] for r in rows if 'samples_per_s' in r):.1f}")
PY
}
for w in 0 ${workers//,/ }; do
  m=$(muster_rate "$w")
  p=$("$python" "$here/loader_step.py" "$w" "$decode_us" "$steps" 16 2>"$dir/pytorch-$w.log")
  echo "loader workers=$w decode_us=$decode_us muster_samples_per_s=$m pytorch_samples_per_s=$p"
done
