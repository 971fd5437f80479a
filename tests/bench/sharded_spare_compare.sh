#!/usr/bin/env bash
# A hot spare takes a SIGKILLed rank's place within its step
# (docs/benchmarks.md, "A hot spare in the salvaged step"): four
# muster-train on two nodes of two, a 51M-parameter MLP with AdamW,
# sharded, a fifth waiting as the spare (on n1); rank 3 is SIGKILLed
# 0.4 s into step 9. Prints each process's peak RSS and parameter
# checksum, rank 0's regroup and the spare's catch-up.
# Usage: sharded_spare_compare.sh BIN_DIR OUT_DIR (OUT_DIR is replaced);
# MUSTER_EXTRA_FLAGS adds trainer flags (e.g. --reduce-scatter).
set -u
BIN=$1; OUT=$2; rm -rf "$OUT"; mkdir -p "$OUT"
. "$(dirname "$0")/sharded_job.sh"
start_coordinator 4 4
flags+=(--steps=16 ${MUSTER_EXTRA_FLAGS:-})
run n0 0 t00; t00=$pid; run n0 1 t01; t01=$pid; run n1 0 t10; t10=$pid; run n1 1 t11; t11=$pid
until grep -q "step 6/" "$OUT/t00.log" 2>/dev/null; do sleep 0.5; done
run n1 2 spare; spare=$pid
until "$BIN/muster" --coordinator=127.0.0.1:$port status --json 2>/dev/null | grep -q '"spare"'; do sleep 0.5; done
until grep -q "step 8/" "$OUT/t00.log"; do sleep 0.2; done
sleep 0.4  # inside step 9, in its backward
kill -9 "$(trainer_of "$t11")"
wait "$t00" "$t01" "$t10" "$spare"
report t00 t01 t10 spare
grep -h "salvaged\|regrouped into\|salvaged in\|moved straight\|taken into this rank\|took the live state" "$OUT"/t00.log "$OUT"/spare.log | cut -c1-220
echo "regroup: $(grep -h 'regrouped into' "$OUT/t00.log" | sed -E 's/.* in ([0-9.]+m?s)$/\1/')"
echo "spare caught up at: $(grep -h 'took the live state' "$OUT/spare.log" | cut -c3-14); killed at $(date -r "$OUT/t11.time" +%T.%N | cut -c1-12)"
