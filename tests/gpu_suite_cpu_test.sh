#!/usr/bin/env bash
# deploy/gpu/run-suite's CPU mode on the build's programs: every step that
# can run without a GPU runs and passes, each GPU-only step is skipped with
# a line that says so, and a second run skips everything as done (the suite
# resumes where it stopped).
# Usage: gpu_suite_cpu_test.sh SOURCE_DIR BIN_DIR
set -uo pipefail
src=$1 bin=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-suite.XXXXXX")
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; cat "$out/first.log"; exit 1; }

cd "$src" || exit 1
# The suite runs muster_ddp_tests whole, for the GPU's sake; on the CPU the
# main suite runs them already, so here the step runs only the tests that
# exercise the device path (gtest takes the filter from the environment;
# comm_tests passes its own --gtest_filter, which wins).
export GTEST_FILTER='DeviceCommTest.*:MemoryCheckTest.*'
stages=(versions comm recovery fault checkpoint train)
deploy/gpu/run-suite --device cpu --trials 1 --results "$out/r" --bin "$bin" "${stages[@]}" \
  >"$out/first.log" 2>&1 || fail "the CPU mode failed"
for name in versions comm_tests ddp_tests allreduce_hier_chunk0 recovery fault_hang_compute \
            fault_hang_compute_deadline checkpoint_snapshot; do
  [[ $(cat "$out/r/$name.rc" 2>/dev/null) == 0 ]] || fail "step $name did not pass"
  [[ -s $out/r/$name.txt ]] || fail "step $name wrote no results"
done
for name in allreduce_nccl_world1 train_resnet18_world1 train_resnet18_world2 \
            train_resnet18_world2_pipelined checkpoint_overhead checkpoint_resume; do
  grep -q "^skip $name: needs a GPU (--device cpu)$" "$out/first.log" ||
    fail "no line says $name was skipped for want of a GPU"
done
grep -q '^recovery .*trials=1' "$out/r/recovery.txt" || fail "recovery printed no figures"
grep -q '^fault scenario=hang-compute trials=1 survived=1' "$out/r/fault_hang_compute.txt" ||
  fail "hang-compute did not survive"

deploy/gpu/run-suite --device cpu --trials 1 --results "$out/r" --bin "$bin" "${stages[@]}" \
  >"$out/second.log" 2>&1 || fail "the second run failed"
if grep -q '^\$ ' "$out/second.log"; then
  cat "$out/second.log"
  fail "the second run ran a step the first had done"
fi
grep -q "^skip recovery: done earlier" "$out/second.log" || fail "the second run did not resume"
echo "ok: CPU mode passed, GPU steps skipped, second run resumed"
