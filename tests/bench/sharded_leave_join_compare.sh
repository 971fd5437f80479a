#!/usr/bin/env bash
# A leave (or a death) and a join with sharded state (docs/benchmarks.md,
# "Sharded optimizer state"): four muster-train on two nodes of two, a
# 51M-parameter MLP with AdamW, sharded with COPIES copies of each part;
# rank 3 gets SIGNAL after step 8 (TERM: it leaves at a boundary; KILL: it
# dies), and once the world of three trains a new trainer joins on its
# node. Prints each trainer's peak RSS, parameter checksum and how its
# optimizer state moved.
# Usage: sharded_leave_join_compare.sh BIN_DIR OUT_DIR [COPIES [SIGNAL]] (OUT_DIR is replaced)
set -u
BIN=$1; OUT=$2; COPIES=${3:-2}; SIGNAL=${4:-TERM}; rm -rf "$OUT"; mkdir -p "$OUT"
. "$(dirname "$0")/sharded_job.sh"
start_coordinator 3 4
flags+=(--optimizer-state-copies="$COPIES" --steps=30)
run n0 0 t00; t00=$pid; run n0 1 t01; t01=$pid; run n1 0 t10; t10=$pid; run n1 1 t11; t11=$pid
until grep -q "^step 8/" "$OUT/t00.log" 2>/dev/null; do sleep 0.2; done
kill -"$SIGNAL" "$(trainer_of "$t11")"
wait "$t11"
until grep -q "world 3 on 2 nodes" "$OUT/t00.log" 2>/dev/null; do sleep 0.2; done
run n1 1 t11b; t11b=$pid
wait "$t00" "$t01" "$t10" "$t11b"
report t00 t01 t10 t11 t11b
grep -h "optimizer state moved straight\|left the job" "$OUT"/t00.log "$OUT"/t11.log \
  "$OUT"/t11b.log | cut -c1-160
