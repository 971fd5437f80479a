#!/usr/bin/env bash
# A hot spare takes a SIGKILLed rank's place within its step
# (docs/benchmarks.md, "A hot spare in the salvaged step"): four
# muster-train on two nodes of two, a 51M-parameter MLP with AdamW,
# sharded, a fifth waiting as the spare (on n1); rank 3 is SIGKILLed
# 0.4 s into step 9. Prints each process's peak RSS and parameter
# checksum, rank 0's regroup and the spare's catch-up.
# Usage: sharded_spare_compare.sh BIN_DIR OUT_DIR (OUT_DIR is replaced)
set -u
BIN=$1; OUT=$2; rm -rf "$OUT"; mkdir -p "$OUT"
port=$(( 30000 + RANDOM % 5000 ))
"$BIN/muster-coordinator" --listen=127.0.0.1:$port --no-auth --state-dir="$OUT/state" \
  --min-members=4 --max-members=4 --last-call=1s >"$OUT/coordinator.log" 2>&1 &
coord=$!
flags=(--coordinator=127.0.0.1:$port --model=mlp --dataset=synthetic --synthetic-size=182
       --synthetic-channels=3 --batch-size=16 --optimizer=adamw --shard-optimizer
       --backend=hier --steps=16 --log-every=1 --threads=1)
run() {  # NODE LOCAL TAG; the pid in $pid
  /usr/bin/time -v -o "$OUT/$3.time" "$BIN/muster-train" "${flags[@]}" --node-id="$1" \
    --local-rank="$2" --summary-json="$OUT/$3.json" >"$OUT/$3.log" 2>&1 &
  pid=$!
}
run n0 0 t00; t00=$pid; run n0 1 t01; t01=$pid; run n1 0 t10; t10=$pid; run n1 1 t11; t11=$pid
until grep -q "step 6/" "$OUT/t00.log" 2>/dev/null; do sleep 0.5; done
run n1 2 spare; spare=$pid
until "$BIN/muster" --coordinator=127.0.0.1:$port status --json 2>/dev/null | grep -q '"spare"'; do sleep 0.5; done
until grep -q "step 8/" "$OUT/t00.log"; do sleep 0.2; done
sleep 0.4  # inside step 9, in its backward
victim=$(pgrep -P "$t11" muster-train || echo "$t11")
kill -9 "$victim"
wait "$t00" "$t01" "$t10" "$spare"
kill "$coord"; wait "$coord" 2>/dev/null
for t in t00 t01 t10 spare; do
  printf '%s: %s MB peak; ' "$t" $(( $(awk '/Maximum resident/ {print $6}' "$OUT/$t.time") / 1024 ))
  grep -o "\"parameter_checksum\": [0-9.]*" "$OUT/$t.json" 2>/dev/null | head -1
done
grep -h "salvaged\|regrouped into\|salvaged in\|moved straight\|taken into this rank\|took the live state" "$OUT"/t00.log "$OUT"/spare.log | cut -c1-220
echo "regroup: $(grep -h 'regrouped into' "$OUT/t00.log" | sed -E 's/.* in ([0-9.]+m?s)$/\1/')"
echo "spare caught up at: $(grep -h 'took the live state' "$OUT/spare.log" | cut -c3-14); killed at $(date -r "$OUT/t11.time" +%T.%N | cut -c1-12)"
