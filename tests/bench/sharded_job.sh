# Sourced by the sharded_*_compare.sh scripts: a coordinator and
# muster-train processes of the 51M-parameter MLP (AdamW, sharded,
# --backend=hier) on this host, each under /usr/bin/time -v.
# Needs BIN and OUT; start_coordinator sets `coord` and `port`, run sets
# `pid`; `flags` holds the trainers' flags after start_coordinator.

# MIN MAX: a coordinator for MIN to MAX members, then the common flags.
start_coordinator() {
  port=$(( 30000 + RANDOM % 5000 ))
  "$BIN/muster-coordinator" --listen=127.0.0.1:$port --no-auth --state-dir="$OUT/state" \
    --min-members="$1" --max-members="$2" --last-call=1s >"$OUT/coordinator.log" 2>&1 &
  coord=$!
  flags=(--coordinator=127.0.0.1:$port --model=mlp --dataset=synthetic --synthetic-size=182
         --synthetic-channels=3 --batch-size=16 --optimizer=adamw --shard-optimizer
         --backend=hier --log-every=1 --threads=1)
}

# NODE LOCAL TAG: a trainer; its pid in `pid`.
run() {
  /usr/bin/time -v -o "$OUT/$3.time" "$BIN/muster-train" "${flags[@]}" --node-id="$1" \
    --local-rank="$2" --summary-json="$OUT/$3.json" >"$OUT/$3.log" 2>&1 &
  pid=$!
}

# The muster-train under a `run` pid (/usr/bin/time's child; the pid itself where none).
trainer_of() { pgrep -P "$1" muster-train || echo "$1"; }

# TAG...: each one's peak RSS and parameter checksum; stops the coordinator.
report() {
  kill "$coord"; wait "$coord" 2>/dev/null
  for t in "$@"; do
    printf '%s: %s MB peak; ' "$t" $(( $(awk '/Maximum resident/ {print $6}' "$OUT/$t.time") / 1024 ))
    sum=$(grep -o "\"parameter_checksum\": [0-9.]*" "$OUT/$t.json" 2>/dev/null | head -1)
    echo "${sum:-no summary}"
  done
}
