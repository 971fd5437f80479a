#!/usr/bin/env bash
# A death with one copy of the sharded state (docs/benchmarks.md,
# "Sharded optimizer state"): four muster-train on two nodes of two, a
# 51M-parameter MLP with AdamW, sharded with --optimizer-state-copies=1,
# a checkpoint every 10 steps; rank 3 is SIGKILLed once the checkpoint of
# step 10 is written. Its ranges are gone, so the three survivors take the
# newest checkpoint in the running job and go on. Prints each survivor's
# peak RSS, parameter checksum and how its optimizer state was read.
# Usage: sharded_one_copy_compare.sh BIN_DIR OUT_DIR (OUT_DIR is replaced)
set -u
BIN=$1; OUT=$2; rm -rf "$OUT"; mkdir -p "$OUT"
port=$(( 30000 + RANDOM % 5000 ))
"$BIN/muster-coordinator" --listen=127.0.0.1:$port --no-auth --state-dir="$OUT/state" \
  --min-members=3 --max-members=4 --last-call=1s >"$OUT/coordinator.log" 2>&1 &
coord=$!
flags=(--coordinator=127.0.0.1:$port --model=mlp --dataset=synthetic --synthetic-size=182
       --synthetic-channels=3 --batch-size=16 --optimizer=adamw --shard-optimizer
       --optimizer-state-copies=1 --checkpoint-dir="$OUT/ckpt" --checkpoint-every=10
       --backend=hier --steps=24 --log-every=1 --threads=1)
run() {  # NODE LOCAL TAG; the pid in $pid
  /usr/bin/time -v -o "$OUT/$3.time" "$BIN/muster-train" "${flags[@]}" --node-id="$1" \
    --local-rank="$2" --summary-json="$OUT/$3.json" >"$OUT/$3.log" 2>&1 &
  pid=$!
}
run n0 0 t00; t00=$pid; run n0 1 t01; t01=$pid; run n1 0 t10; t10=$pid; run n1 1 t11; t11=$pid
until grep -q "checkpoint of step 10 written" "$OUT/t00.log" 2>/dev/null; do sleep 0.2; done
victim=$(pgrep -P "$t11" muster-train || echo "$t11")
kill -9 "$victim"
wait "$t00" "$t01" "$t10"
kill "$coord"; wait "$coord" 2>/dev/null
for t in t00 t01 t10; do
  printf '%s: %s MB peak; ' "$t" $(( $(awk '/Maximum resident/ {print $6}' "$OUT/$t.time") / 1024 ))
  grep -o "\"parameter_checksum\": [0-9.]*" "$OUT/$t.json" 2>/dev/null | head -1
done
grep -h "restored the checkpoint\|of the checkpoint of step .* read into" "$OUT"/t00.log | cut -c1-220
