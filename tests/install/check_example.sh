#!/usr/bin/env bash
# Installs muster from BUILD_DIR into a temporary prefix, builds examples/
# against the installed package with find_package(muster), and runs each
# example as two trainers against a coordinator.
#   check_example.sh SOURCE_DIR BUILD_DIR TORCH_PREFIX
# TORCH_PREFIX is the LibTorch the build was given on CMAKE_PREFIX_PATH, ""
# when it found one by itself (Debian's libtorch-dev); the example must take
# the LibTorch the build took either way.
set -euo pipefail
SRC="$1" BUILD="$2" TORCH_PREFIX="$3"
# The work tree lies inside the build tree, and ccache takes the paths below
# SOURCE_DIR as relative ones: then the example's compiles hit the cache from
# one run to the next (a fresh temporary directory under /tmp made every
# one of them miss, and compiling the examples cold took minutes).
WORK="$(mktemp -d "$BUILD/install-check.XXXXXX")"
CCACHE_BASEDIR="$(cd "$SRC" && pwd)"
export CCACHE_BASEDIR CCACHE_NOHASHDIR=1
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log"
test -f "$WORK/prefix/lib/cmake/muster/muster-config.cmake"
test -f "$WORK/prefix/include/muster/muster.h"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The example names LibTorch as users name an unpacked LibTorch archive: its
# directory (lib/, include/, share/cmake/Torch), here the wheel's torch/. A
# LibTorch in the system's directories (Debian's) it finds by itself.
prefix_path="$WORK/prefix"
if [ -n "$TORCH_PREFIX" ]; then
  torch_dir="$TORCH_PREFIX"
  if [ -d "$TORCH_PREFIX/../../lib" ]; then
    torch_dir="$(cd "$TORCH_PREFIX/../.." && pwd)"
  fi
  prefix_path="$prefix_path;$torch_dir"
fi
cmake -S "$SRC/examples" -B "$WORK/build" -G Ninja "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix_path" > "$WORK/configure.log"
# Torch_DIR as a CMakeCache.txt records it, with links resolved (Debian's
# /lib is /usr/lib).
torch_config() {
  local dir
  dir="$(sed -n 's/^Torch_DIR:PATH=//p' "$1/CMakeCache.txt")"
  if [ -n "$dir" ]; then realpath -m "$dir"; fi
}
build_torch="$(torch_config "$BUILD")"
example_torch="$(torch_config "$WORK/build")"
[ -n "$build_torch" ] || { echo "no Torch_DIR in $BUILD/CMakeCache.txt"; exit 1; }
[ "$example_torch" = "$build_torch" ] ||
  { echo "the example took LibTorch from '$example_torch', the build from '$build_torch'"; exit 1; }
cmake --build "$WORK/build" > "$WORK/build.log"
run_pair() {  # NAME ARGS...: two ranks of an example against a fresh coordinator
  local name="$1"
  shift
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$WORK/prefix/bin/muster-coordinator" --listen "127.0.0.1:$port" --no-auth \
    --min-members 2 --max-members 2 > "$WORK/$name.coordinator.log" 2>&1 &
  local coordinator=$!
  export MUSTER_COORDINATOR="127.0.0.1:$port"
  "$WORK/build/$name" --node-id a "$@" > "$WORK/$name.a.log" 2>&1 &
  local a=$!
  "$WORK/build/$name" --node-id b "$@" > "$WORK/$name.b.log" 2>&1 || { cat "$WORK/$name.b.log"; exit 1; }
  wait $a || { cat "$WORK/$name.a.log"; exit 1; }
  kill $coordinator 2>/dev/null || true
}
run_pair fashion_mnist --steps 30
grep -h "fashion_mnist: world 2, 30 steps, final loss" "$WORK"/fashion_mnist.*.log
run_pair char_lm --epochs 1 --batch 4
grep -h "char_lm: rank 0 of 2" "$WORK"/char_lm.*.log
# The installed programs find LibTorch by themselves (install RPATH).
"$WORK/prefix/bin/muster-train" --help > "$WORK/train-help.log" 2>&1 || true  # --help exits 1
grep -q "muster-train --coordinator HOST:PORT" "$WORK/train-help.log" ||
  { echo "installed muster-train does not start:"; cat "$WORK/train-help.log"; exit 1; }
# The installed agent runs the tabular example (muster/data.h, parameter
# groups), handing it the coordinator it was given.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$WORK/prefix/bin/muster-coordinator" --listen "127.0.0.1:$port" --no-auth \
  --min-members 2 --max-members 2 > "$WORK/tabular.coordinator.log" 2>&1 &
coordinator=$!
unset MUSTER_COORDINATOR
MUSTER_JOB="install$$" "$WORK/prefix/bin/muster-agent" --nproc-per-node 2 \
  --coordinator "127.0.0.1:$port" -- "$WORK/build/tabular" --steps 30 > "$WORK/tabular.log" 2>&1 ||
  { cat "$WORK/tabular.log"; exit 1; }
kill $coordinator 2>/dev/null || true
grep -h "tabular: rank 0 of 2, step 30" "$WORK/tabular.log"
echo "examples built against the installed package and trained on 2 ranks"
