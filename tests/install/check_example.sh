#!/usr/bin/env bash
# Installs muster from BUILD_DIR into a temporary prefix, builds
# trainer/examples against the installed package with find_package(muster),
# and runs the example as two trainers against a coordinator.
#   check_example.sh SOURCE_DIR BUILD_DIR TORCH_PREFIX
set -euo pipefail
SRC="$1" BUILD="$2" TORCH_PREFIX="$3"
WORK="$(mktemp -d /tmp/muster-install.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log"
test -f "$WORK/prefix/lib/cmake/muster/muster-config.cmake"
test -f "$WORK/prefix/include/muster/muster.h"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$SRC/trainer/examples" -B "$WORK/build" -G Ninja "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$WORK/prefix;$TORCH_PREFIX" > "$WORK/configure.log"
cmake --build "$WORK/build" > "$WORK/build.log"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$WORK/prefix/bin/muster-coordinator" --listen "127.0.0.1:$PORT" --no-auth \
  --min-members 2 --max-members 2 > "$WORK/coordinator.log" 2>&1 &
export MUSTER_COORDINATOR="127.0.0.1:$PORT"
"$WORK/build/muster_example" --node-id a > "$WORK/a.log" 2>&1 &
A=$!
"$WORK/build/muster_example" --node-id b > "$WORK/b.log" 2>&1
wait $A
cat "$WORK/a.log" "$WORK/b.log" | grep "example: world 2, final loss"
echo "example built against the installed package and trained on 2 ranks"
