#!/usr/bin/env bash
# No function in the project's code is longer than 80 lines (STYLE.md): a
# reader never scrolls through one. Universal Ctags finds each function's
# first and last line. Exits 1 naming each longer function.
#   function_length_test.sh SOURCE_DIR
set -uo pipefail
src=$1
limit=80
if ! command -v ctags >/dev/null || ! ctags --version 2>/dev/null | grep -q Universal; then
  echo "Universal Ctags is missing (deploy/dev setup installs universal-ctags)"
  exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
cd "$src" || exit 1
mapfile -t folders < <("$here/source_folders.sh" .)
long=$(find "${folders[@]}" -type f \( -name '*.h' -o -name '*.cc' \) |
  sort | xargs ctags --fields=+ne --c++-kinds=f -o - 2>/dev/null |
  awk -F'\t' -v limit=$limit '{
    line = ""; end = ""
    for (i = 4; i <= NF; i++) {
      if ($i ~ /^line:/) line = substr($i, 6)
      if ($i ~ /^end:/) end = substr($i, 5)
    }
    if (line != "" && end != "" && end - line + 1 > limit)
      printf "%s:%s %s is %d lines (the limit is %d)\n", $2, line, $1, end - line + 1, limit
  }')
count=$(find "${folders[@]}" -type f -name '*.cc' | wc -l)
if ((count == 0)); then
  echo "no sources under $src"
  exit 1
fi
if [[ -n $long ]]; then
  echo "$long"
  exit 1
fi
