#!/usr/bin/env bash
# Library code writes no lines of its own to the terminal: a program's lines
# for people go through the sink it chose (muster::Options::output,
# common/lines.h), its diagnostics through the log (common/logging.h). Only a
# program's main.cc, the CLI (whose output is its job) and the default sink
# (common/lines.cc) write to stdout or stderr. Exits 1 naming each line.
#   output_test.sh SOURCE_DIR
set -uo pipefail
src=$1
here=$(cd "$(dirname "$0")" && pwd)
cd "$src" || exit 1
mapfile -t folders < <("$here/source_folders.sh" .)
files=$(find "${folders[@]}" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) |
        grep -vE '(^|/)main\.cc$|^cli/|^common/lines\.cc$' | sort)
[[ -n $files ]] || { echo "no sources under $src"; exit 1; }
# The pattern must find the default sink's write, or the check is broken.
pattern='std::(cout|cerr|clog)|fprintf[(] *std(out|err)|(^|[^a-z_:.>])(printf|puts)[(]'
grep -qE "$pattern" common/lines.cc || { echo "the pattern misses common/lines.cc"; exit 1; }
found=$(grep -nE "$pattern" $files)
if [[ -n $found ]]; then
  echo "$found" | sed 's/$/  <- write through Options::output (common\/lines.h) or MUSTER_LOG/'
  exit 1
fi
echo "no terminal writes in $(wc -w <<<"$files") files outside main.cc, cli/ and common/lines.cc"
