#!/usr/bin/env bash
# A build against an NCCL other than the one LibTorch loads is refused at
# configure time, naming both versions (not left to the linker or loader).
#   nccl_mismatch_test.sh SOURCE_DIR TORCH_PREFIX OTHER_NCCL_ROOT
set -uo pipefail
SRC="$1" TORCH_PREFIX="$2" OTHER="$3"
WORK="$(mktemp -d /tmp/muster-nccl.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
theirs="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$OTHER/include/nccl.h" |
  paste -sd.)"
out="$(cmake -S "$SRC" -B "$WORK/build" -G Ninja -DMUSTER_BUILD_TESTS=OFF -DMUSTER_BUILD_BENCH=OFF \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DMUSTER_NCCL_ROOT="$OTHER" 2>&1)"
code=$?
fail() { echo "FAIL: $*"; echo "$out" | tail -n 30; exit 1; }
[ "$code" -ne 0 ] || fail "configure accepted NCCL $theirs from $OTHER"
echo "$out" | tr -s ' \n' ' ' | grep -q "LibTorch .* loads NCCL [0-9.]* from .* but muster would build against NCCL $theirs" ||
  fail "the error does not name both versions"
echo "refused: NCCL $theirs from $OTHER is not LibTorch's"
