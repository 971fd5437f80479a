#!/usr/bin/env bash
# The project's source folders, one per line: every top-level folder that
# holds C++ sources, except tests/ and examples/ (written as users write
# theirs). The checks (layers, clock, function length) scan these, so a new
# top-level folder is scanned without being named anywhere.
#   source_folders.sh SOURCE_DIR
set -euo pipefail
cd "${1:?usage: source_folders.sh SOURCE_DIR}"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu'
else  # an unpacked source archive: everything but build trees
  find . -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) -not -path './build*' \
    -not -path './.*' | sed 's|^\./||'
fi | awk -F/ 'NF > 1 { print $1 }' | sort -u | grep -vxE 'tests|examples'
