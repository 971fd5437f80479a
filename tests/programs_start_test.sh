#!/usr/bin/env bash
# Every muster program (muster, muster-*: the ones the images ship) starts
# and answers --version: the check the container images run in their %test
# section (deploy/apptainer), here on every build, so a program that cannot
# start fails before an image is made.
set -euo pipefail
bin="${1:?usage: programs_start_test.sh BIN_DIR}"
failed=0
count=0
for p in "$bin"/muster "$bin"/muster-*; do
  [[ -f "$p" && -x "$p" ]] || continue
  count=$((count + 1))
  if ! out=$("$p" --version 2>&1 </dev/null); then
    echo "FAIL: $p --version exited non-zero:" >&2
    echo "$out" | tail -5 >&2
    failed=1
  fi
done
((count > 0)) || { echo "FAIL: no programs in $bin" >&2; exit 1; }
echo "$count programs in $bin answer --version"
exit "$failed"
