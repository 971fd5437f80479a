#!/usr/bin/env bash
# Nodes with two networks (docs/lab.md, docs/elastic.md "Addresses"): the
# coordinator on the management network (eth0), trainers told
# --interface eth1. The gradients must cross the data network: node1's eth1
# carries far more bytes than its eth0. A name that is not an interface
# fails with the interfaces that exist.
# Usage: lab_interface_test.sh BIN_DIR. Skips (77) without root or nft.
set -uo pipefail
BIN="$1"
LAB="$BIN/muster-lab"
[[ $(id -u) == 0 ]] || { echo "lab_interface_test: skipped: needs root"; exit 77; }
command -v nft >/dev/null || { echo "lab_interface_test: skipped: needs nft (nftables)"; exit 77; }
name="i$(( $$ % 100000 ))"
dir=$(mktemp -d)
coordinator=""
cleanup() {
  "$LAB" down "$name" >/dev/null 2>&1
  [[ -n "$coordinator" ]] && kill "$coordinator" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "lab_interface_test: FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -20 "$f"; done; exit 1; }

"$LAB" up "$name" --nodes 2 --data-network --owner $$ >/dev/null || fail "lab up"
gateway=$("$LAB" gateway "$name")
port=""
# The coordinator picks a free port (a fixed one may be taken by another
# test's socket, and its trainers would then wait for a coordinator that
# never came) and says which in its log.
start_coordinator() {  # STATE_DIR LOG
  "$BIN/muster-coordinator" --listen="$gateway:0" --no-auth --state-dir="$1" \
    --min-members=2 --max-members=2 --last-call=200ms >"$2" 2>&1 &
  coordinator=$!
  for _ in $(seq 100); do
    port=$(sed -nE 's/.*coordinator listening on port ([0-9]+).*/\1/p' "$2" | head -1)
    [[ -n "$port" ]] && return 0
    kill -0 "$coordinator" 2>/dev/null || break
    sleep 0.1
  done
  fail "the coordinator did not start"
}
start_coordinator "$dir/state" "$dir/coordinator.log"
train() {  # NODE INTERFACE STEPS; a hang fails with the logs, not ctest's timeout
  timeout 120 "$LAB" exec "$name" "node$1" -- "$BIN/muster-train" --coordinator="$gateway:$port" \
    --node-id="node$1" --local-rank=0 --model=mlp --dataset=synthetic --batch-size=32 \
    --steps="$3" --threads=1 --quiet --job="$name-$1" --interface="$2"
}
bytes() { "$LAB" exec "$name" node1 -- cat "/sys/class/net/$1/statistics/rx_bytes"; }
eth0_before=$(bytes eth0); eth1_before=$(bytes eth1)
train 0 eth1 200 >"$dir/node0.log" 2>&1 &
node0=$!
train 1 eth1 200 >"$dir/node1.log" 2>&1 || fail "node1's trainer failed"
wait "$node0" || fail "node0's trainer failed"
eth0=$(( $(bytes eth0) - eth0_before )); eth1=$(( $(bytes eth1) - eth1_before ))
echo "lab_interface_test: node1 received $eth1 bytes on eth1 (data), $eth0 on eth0 (management)"
(( eth1 > 10 * 1024 * 1024 )) || fail "the data network carried only $eth1 bytes"
(( eth1 > 5 * eth0 )) || fail "the management network carried $eth0 bytes against $eth1 on the data network"

# A wrong name says which interfaces there are (a new job).
kill "$coordinator"; wait "$coordinator" 2>/dev/null
start_coordinator "$dir/state2" "$dir/coordinator2.log"
out=$(train 1 ib7 10 2>&1 & train 0 ib7 10 2>&1; wait)
grep -q "network interface 'ib7' has no address; interfaces here: .*eth1" <<<"$out" ||
  fail "no clear error for an interface that does not exist: $out"
echo "lab_interface_test: ok"
