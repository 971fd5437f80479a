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
. "$(dirname "$0")/sharded_job.sh"
start_coordinator 3 4
flags+=(--optimizer-state-copies=1 --checkpoint-dir="$OUT/ckpt" --checkpoint-every=10 --steps=24)
run n0 0 t00; t00=$pid; run n0 1 t01; t01=$pid; run n1 0 t10; t10=$pid; run n1 1 t11; t11=$pid
until grep -q "checkpoint of step 10 written" "$OUT/t00.log" 2>/dev/null; do sleep 0.2; done
kill -9 "$(trainer_of "$t11")"
wait "$t00" "$t01" "$t10"
report t00 t01 t10
grep -h "restored the checkpoint\|of the checkpoint of step .* read into" "$OUT"/t00.log | cut -c1-220
