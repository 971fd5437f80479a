#!/usr/bin/env bash
# examples/lm.cc in float32 against bf16 autocast (--amp bf16), side by side
# in one run: 2 agents x 2 trainers on this host, STEPS steps (default 100),
# the same seed, data and schedule. Reads rank 0's metrics (--log-dir) and
# prints, for every logged step, both losses and their relative difference,
# then the median samples/s of each.
#
# Usage: lm_amp_compare.sh BIN_DIR
# Prints: lm step=S fp32_loss=L bf16_loss=L rel=R   (one line per logged step)
#         lm fp32_samples_per_s=X bf16_samples_per_s=Y max_rel_loss=R
set -euo pipefail
bin=$1
steps=${STEPS:-100}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for amp in none bf16; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin/muster-coordinator" "--listen=127.0.0.1:$port" --no-auth --min-members=4 \
    --max-members=4 "--state-dir=$dir/state-$amp" >"$dir/coordinator-$amp.log" 2>&1 &
  coordinator=$!
  pids=()
  for node in a b; do
    MUSTER_COORDINATOR="127.0.0.1:$port" "$bin/muster-agent" --nproc-per-node=2 \
      "--node-id=$node" -- "$bin/lm" --steps "$steps" --amp "$amp" --eval-every "$steps" \
      --log-dir "$dir/logs-$amp-$node" >"$dir/$amp-$node.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  kill "$coordinator"
  wait "$coordinator" 2>/dev/null || true
done
python3 - "$dir" <<'PY'
import glob, json, statistics, sys
def rows(amp):
    path = glob.glob(f"{sys.argv[1]}/logs-{amp}-*/metrics.jsonl")[0]
    return [json.loads(line) for line in open(path)]
fp32, bf16 = rows("none"), rows("bf16")
worst = 0
for a, b in zip(fp32, bf16):
    if "loss" in a and "loss" in b:
        rel = (b["loss"] - a["loss"]) / a["loss"]
        worst = max(worst, abs(rel))
        print(f"lm step={a['step']} fp32_loss={a['loss']:.4f} bf16_loss={b['loss']:.4f} rel={rel:+.4f}")
speed = lambda r: statistics.median(x["samples_per_s"] for x in r if "samples_per_s" in x)
print(f"lm fp32_samples_per_s={speed(fp32):.0f} bf16_samples_per_s={speed(bf16):.0f} max_rel_loss={worst:.4f}")
PY
