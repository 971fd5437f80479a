#!/usr/bin/env bash
# Each program's --help lists its own flags (not "No flags matched"), with
# their defaults, and the subcommands where it has them.
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
if ((failed)); then exit 1; fi
echo "every --help lists its program's flags"
