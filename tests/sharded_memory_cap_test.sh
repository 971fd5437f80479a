#!/usr/bin/env bash
# Sharded optimizer state under a memory cap (docs/sharding.md, "Memory"):
# each muster-train runs in a memory cgroup of its own, capped between the
# sharded job's peak and the unsharded job's. The sharded job (a 51M-
# parameter MLP with AdamW, 2 x 2, two copies) goes through a SIGKILL of
# one rank, that rank's restart (a join), a hot spare taking a second
# killed rank's place, a graceful leave (SIGTERM), a SIGUSR1 stop of the
# three left, and a resume as four, with no
# process OOM-killed, one parameter checksum on every rank and no step
# lost; the same job unsharded under the same cap is OOM-killed.
#
# cgroup v1's memory controller (memory.limit_in_bytes, as Debian 12 hosts
# that boot with it) or v2's (memory.max); with neither, or not as root,
# the test says so in one line and is skipped (exit 77).
# Usage: sharded_memory_cap_test.sh BIN_DIR [CAP_MB]
set -u
BIN=$1
CAP_MB=${2:-${MUSTER_MEMORY_CAP_MB:-1950}}
OUT=$(mktemp -d /tmp/muster-memory-cap.XXXXXX)

if [ "$(id -u)" != 0 ]; then echo "SKIP: not root: no memory cgroup can be made"; exit 77; fi
if [ -w /sys/fs/cgroup/memory ] && [ -e /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  CG=/sys/fs/cgroup/memory/muster-cap-$$; VERSION=1
elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  CG=/sys/fs/cgroup/muster-cap-$$; VERSION=2
else
  echo "SKIP: this host has no memory cgroup controller (v1 memory.limit_in_bytes or v2 memory.max)"
  exit 77
fi
mkdir "$CG" || { echo "SKIP: cannot make $CG"; exit 77; }
if [ $VERSION = 2 ]; then
  echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
  if [ ! -e "$CG/memory.max" ] || ! echo +memory >"$CG/cgroup.subtree_control" 2>/dev/null; then
    rmdir "$CG"; echo "SKIP: the v2 memory controller cannot be enabled under /sys/fs/cgroup"; exit 77
  fi
fi
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  for d in "$CG"/*/; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
  rmdir "$CG" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$OUT"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$OUT"/*.log; do echo "== $f"; tail -5 "$f"; done
  KEEP=1; echo "the logs are kept in $OUT"
  exit 1
}

# capped NAME CMD...: CMD in cgroup NAME, capped at CAP_MB; its pid in $pid.
capped() {
  local name=$1; shift
  mkdir "$CG/$name"
  if [ $VERSION = 1 ]; then
    echo $((CAP_MB << 20)) >"$CG/$name/memory.limit_in_bytes"
    [ -e "$CG/$name/memory.memsw.limit_in_bytes" ] &&
      echo $((CAP_MB << 20)) >"$CG/$name/memory.memsw.limit_in_bytes"
  else
    echo $((CAP_MB << 20)) >"$CG/$name/memory.max"
    echo 0 >"$CG/$name/memory.swap.max" 2>/dev/null
  fi
  ( echo "$BASHPID" >"$CG/$name/cgroup.procs" && exec "$@" ) &
  pid=$!
  pids+=("$pid")
}
oom_kills() {  # NAME
  local f=$CG/$1/memory.oom_control
  [ $VERSION = 2 ] && f=$CG/$1/memory.events
  awk '/^oom_kill / {print $2}' "$f"
}
peak_mb() {  # NAME
  local f=$CG/$1/memory.max_usage_in_bytes
  [ $VERSION = 2 ] && f=$CG/$1/memory.peak
  [ -r "$f" ] && echo $(( $(cat "$f") >> 20 )) || echo "?"
}

port=$(( 30000 + RANDOM % 5000 ))
"$BIN/muster-coordinator" --listen=127.0.0.1:$port --no-auth --state-dir="$OUT/state" \
  --min-members=3 --max-members=4 --last-call=1s >"$OUT/coordinator.log" 2>&1 &
pids+=($!)
STEPS=40
flags=(--coordinator=127.0.0.1:$port --model=mlp --dataset=synthetic --synthetic-size=182
       --synthetic-channels=3 --batch-size=16 --optimizer=adamw --backend=hier --steps=$STEPS
       --log-every=1 --threads=1 --checkpoint-dir="$OUT/ckpt" --checkpoint-every=10)
trainer() {  # TAG NODE LOCAL_RANK MORE...: a capped muster-train, its pid in $pid
  local tag=$1 node=$2 local=$3; shift 3
  capped "$tag" "$BIN/muster-train" "${flags[@]}" --node-id="$node" --local-rank="$local" \
    --summary-json="$OUT/$tag.json" "$@" >"$OUT/$tag.log" 2>&1
}
wait_line() {  # TAG REGEX SECONDS
  local i
  for ((i = 0; i < $3 * 5; ++i)); do
    grep -qE "$2" "$OUT/$1.log" 2>/dev/null && return 0
    sleep 0.2
  done
  fail "$1 did not log /$2/ in $3 s"
}
# reap PID: its exit code in $code (wait must run in this shell, not a subshell).
reap() { wait "$1"; code=$?; }

# The sharded job (MUSTER_CAP_UNSHARDED_ONLY=1 skips it, to measure the
# unsharded peaks under a high cap).
if [ -z "${MUSTER_CAP_UNSHARDED_ONLY:-}" ]; then
trainer a0 n0 0 --shard-optimizer; a0=$pid
trainer a1 n0 1 --shard-optimizer; a1=$pid
trainer b0 n1 0 --shard-optimizer; b0=$pid
trainer b1 n1 1 --shard-optimizer; b1=$pid
wait_line a0 "step 6/" 240
sleep 0.4  # inside step 7
kill -9 "$b1"
reap "$b1"; [ "$code" = 137 ] || fail "b1 did not die of the SIGKILL"
wait_line a0 "world 3 on 2 nodes" 120
trainer b1r n1 1 --shard-optimizer; b1r=$pid  # its restart: a join
wait_line b1r "took the live state" 120
trainer spare n1 2 --shard-optimizer; spare=$pid  # waits: the world is full
for ((i = 0; i < 300; ++i)); do
  "$BIN/muster" --coordinator=127.0.0.1:$port status --json 2>/dev/null | grep -q '"spare"' && break
  sleep 0.2
done
step=$(grep -oE "step [0-9]+/" "$OUT/a0.log" | tail -1 | grep -oE "[0-9]+")
wait_line a0 "step $((step + 1))/" 60
sleep 0.4  # inside a step
kill -9 "$b0"
reap "$b0"; [ "$code" = 137 ] || fail "b0 did not die of the SIGKILL"
wait_line spare "took the live state|salvaged step taken into" 120
step=$(grep -oE "step [0-9]+/" "$OUT/a0.log" | tail -1 | grep -oE "[0-9]+")
wait_line a0 "step $((step + 2))/" 60
kill -TERM "$b1r"  # a graceful leave at a boundary
reap "$b1r"; [ "$code" = 0 ] || fail "b1r exited $code on SIGTERM, not 0 (left)"
grep -q "left the job" "$OUT/b1r.log" || fail "b1r did not leave the job"
step=$(grep -oE "step [0-9]+/" "$OUT/a0.log" | tail -1 | grep -oE "[0-9]+")
wait_line a0 "step $((step + 2))/" 60
for p in $a0 $a1 $spare; do kill -USR1 "$p"; done
for p in $a0 $a1 $spare; do
  reap "$p"
  [ "$code" = 75 ] || fail "a trainer of the stopped job exited $code, not 75 (stopped)"
done
stopped=$(grep -oE "stopping at step [0-9]+ after checkpointing" "$OUT/a0.log" | grep -oE "[0-9]+")
[ -n "$stopped" ] || fail "the stop wrote no checkpoint"
ls "$OUT/ckpt/step-$stopped"/optimizer-shard-*-of-3.safetensors >/dev/null ||
  fail "the checkpoint to stop is not sharded as three"
# The requeue, as four.
trainer c0 n0 0 --shard-optimizer; c0=$pid
trainer c1 n0 1 --shard-optimizer; c1=$pid
trainer c2 n1 0 --shard-optimizer; c2=$pid
trainer c3 n1 1 --shard-optimizer; c3=$pid
for p in $c0 $c1 $c2 $c3; do
  reap "$p"
  [ "$code" = 0 ] || fail "a trainer of the resumed job exited $code"
done
grep -q "resumed from the checkpoint of step $stopped" "$OUT/c0.log" ||
  fail "the resumed job did not resume from step $stopped"
for t in a0 a1 b1r spare c0 c1 c2 c3; do
  n=$(oom_kills "$t")
  [ "${n:-0}" = 0 ] || fail "$t was OOM-killed under the cap ($n)"
done
sums=$(for t in c0 c1 c2 c3; do grep -oE '"parameter_checksum": [-0-9.e+]+' "$OUT/$t.json"; done |
       sort -u | wc -l)
[ "$sums" = 1 ] || fail "the resumed ranks end with $sums parameter checksums"
for t in c0 c1 c2 c3; do
  grep -qE "\"steps\": $STEPS\b" "$OUT/$t.json" || fail "$t did not train to step $STEPS"
done
printf 'sharded under %s MB: peaks' "$CAP_MB"
for t in a0 a1 b1r spare c0 c1 c2 c3; do printf ' %s=%s' "$t" "$(peak_mb "$t")"; done
echo " MB; stopped at $stopped as 3, resumed as 4, one checksum"
fi

# The same job unsharded, under the same cap: OOM-killed.
trainer u0 n0 0; u0=$pid
trainer u1 n0 1; u1=$pid
trainer v0 n1 0; v0=$pid
trainer v1 n1 1; v1=$pid
# One OOM kill is the answer: the others are stopped then (three could
# regroup and go on, two would wait for a third).
killed=""
for ((i = 0; i < 1500; ++i)); do
  [ -n "$killed" ] && break
  for t in u0 u1 v0 v1; do
    [ "$(oom_kills "$t")" -gt 0 ] 2>/dev/null && killed=$t
  done
  alive=0
  for p in $u0 $u1 $v0 $v1; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ "$alive" = 0 ] && break
  sleep 0.2
done
for p in $u0 $u1 $v0 $v1; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
[ -n "$killed" ] || fail "the unsharded job was not OOM-killed under $CAP_MB MB: the cap does not bind" \
  "(peaks u0=$(peak_mb u0) u1=$(peak_mb u1) v0=$(peak_mb v0) v1=$(peak_mb v1) MB)"
echo "unsharded under $CAP_MB MB: $killed OOM-killed (peaks u0=$(peak_mb u0) u1=$(peak_mb u1) v0=$(peak_mb v0) v1=$(peak_mb v1) MB)"
echo PASS
