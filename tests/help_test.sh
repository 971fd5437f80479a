#!/usr/bin/env bash
# Each program's --help lists its own flags (not "No flags matched"), with
# their defaults, and the subcommands where it has them; a bad flag exits 2.
#   help_test.sh BIN_DIR
set -uo pipefail
bin=$1
failed=0
expect() {  # expect PROGRAM TEXT...: every TEXT appears in PROGRAM --help
  local program=$1
  shift
  local out
  out=$("$bin/$program" --help 2>&1)
  if grep -q 'No flags matched' <<<"$out"; then
    echo "$program --help: No flags matched"
    failed=1
  fi
  for text in "$@"; do
    if ! grep -qF -- "$text" <<<"$out"; then
      echo "$program --help lacks '$text'"
      failed=1
    fi
  done
}
expect muster-coordinator --min_members --state_dir --token_file "default: "
expect muster-train --model --device --checkpoint_every --time_steps "default: \"cpu\""
expect muster-agent --nproc_per_node --spares --max_restarts
expect muster-relay --coordinator --listen --connections "default: "
expect muster status checkpoints drain pull-weights shutdown --coordinator --json
expect muster-bench coordinator allreduce recovery ettr checkpoint --members --mtbf
expect muster-fault --trials --seed
# A flag a program does not know, or a value that does not parse, is a usage
# error: exit 2, which muster-agent does not restart (deploy/README.md).
refused() {  # refused PROGRAM ARGS...: exits 2, naming the flag
  local program=$1 out code
  shift
  out=$("$bin/$program" "$@" 2>&1)
  code=$?
  if [ "$code" != 2 ] || ! grep -q "ERROR: " <<<"$out"; then
    echo "$program $*: exit $code, not 2 with the error: $out"
    failed=1
  fi
}
for program in muster-coordinator muster-train muster-agent muster-relay muster; do
  refused "$program" --no-such-flag=1
done
refused muster-train --steps=many
refused muster-coordinator --min-members=x
if ((failed)); then exit 1; fi
echo "every --help lists its program's flags; a bad flag exits 2"
