#!/usr/bin/env bash
# OpenMPI as the launcher: `mpirun -np 4 muster-train ...` against a
# coordinator on this machine. The trainers take their identity from
# OMPI_COMM_WORLD_* (one node, local ranks 0..3), train the MLP on
# Fashion-MNIST and rank 0 prints the final accuracy. Skips (77) without
# mpirun.
#   mpirun_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
BIN="$(cd "${2:?usage: mpirun_test.sh SOURCE_DIR BIN_DIR}" && pwd)"
if ! command -v mpirun > /dev/null; then
  echo "SKIP: mpirun not found (apt-get install openmpi-bin)"
  exit 77
fi
WORK="$(mktemp -d /tmp/muster-mpirun-test.XXXXXX)"
COORD=""
cleanup() {
  local rc=$?
  if [ -n "$COORD" ]; then kill "$COORD" 2>/dev/null || true; wait "$COORD" 2>/dev/null || true; fi
  if [ "$rc" = 0 ]; then rm -rf "$WORK"; else echo "kept $WORK" >&2; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  echo "---- mpirun output" >&2; cat "$WORK/mpirun.log" >&2 || true
  echo "---- coordinator log (tail)" >&2; tail -n 20 "$WORK/coordinator.log" >&2 || true
  exit 1
}

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(umask 077 && head -c 32 /dev/urandom | base64 > "$WORK/token")
"$BIN/muster-coordinator" --listen "127.0.0.1:$PORT" --token-file "$WORK/token" \
  --min-members 4 --max-members 4 > "$WORK/coordinator.log" 2>&1 &
COORD=$!

root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
start=$(date +%s)
rc=0
timeout 240 mpirun "${root[@]}" --oversubscribe --bind-to none -np 4 \
  "$BIN/muster-train" --coordinator "127.0.0.1:$PORT" --token-file "$WORK/token" \
  --model mlp --dataset fashion-mnist --batch-size 64 --steps 60 --log-every 20 --threads 1 \
  --job "$(basename "$WORK")" \
  --checkpoint-dir "$WORK/checkpoints" --checkpoint-every 30 > "$WORK/mpirun.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "mpirun exited $rc"
members="$(grep -oE 'member [^ ]+/[0-3] \(identity from openmpi\)' "$WORK/mpirun.log" | sort -u | wc -l)"
[ "$members" = 4 ] || fail "want 4 members with their identity from OpenMPI, saw $members"
grep -q "world 4 on 1 nodes" "$WORK/mpirun.log" || fail "the trainers did not form a world of 4 on one node"
line="$(grep -E '^done: 60 steps .* test accuracy [0-9.]+%' "$WORK/mpirun.log")" ||
  fail "no final accuracy line from rank 0"
[ -f "$WORK/checkpoints/step-60/manifest.json" ] || fail "no checkpoint of step 60"
echo "$line"
echo "PASS: mpirun -np 4 trained in $(($(date +%s) - start)) s"
