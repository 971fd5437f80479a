#!/usr/bin/env bash
# Every project include points down the layers of docs/trainer-map.md: a
# file in folder F may include F itself and the entries of F's row
# (a folder, or one header). Third-party and standard headers are not
# checked. Exits 1 naming each include that points elsewhere.
#   layers_test.sh SOURCE_DIR
set -uo pipefail
src=$1
map="$src/docs/trainer-map.md"
rules=$(sed -n '/<!-- layers:begin -->/,/<!-- layers:end -->/p' "$map" |
        grep -E '^\| [a-z]' | grep -v '^| folder' |
        sed -E 's/^\| *([^|]*[^ |]) *\| *([^|]*)\|$/\1:\2/')
if [[ -z $rules ]]; then
  echo "no layer table in $map"
  exit 1
fi
# The longest row whose folder (or file) holds PATH.
row_of() {
  local path=$1 best="" folder
  while IFS=: read -r folder _; do
    if [[ $path == "$folder" || $path == "$folder"/* ]] && ((${#folder} > ${#best})); then
      best=$folder
    fi
  done <<<"$rules"
  echo "$best"
}
allowed_by() {
  local folder=$1
  grep -E "^${folder}:" <<<"$rules" | head -1 | cut -d: -f2-
}
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t folders < <("$here/source_folders.sh" "$src")
project="^($(IFS='|'; echo "${folders[*]}")|muster)/"
failed=0
checked=0
cd "$src" || exit 1
while IFS= read -r file; do
  folder=$(row_of "$file")
  if [[ -z $folder ]]; then
    echo "$file: in no row of the layer table ($map)"
    failed=1
    continue
  fi
  allowed="$folder $(allowed_by "$folder")"
  [[ $folder == include/muster ]] && allowed+=" muster"
  while IFS= read -r inc; do
    [[ $inc =~ $project ]] || continue
    checked=$((checked + 1))
    ok=0
    for a in $allowed; do
      if [[ $inc == "$a" || $inc == "$a"/* ]]; then ok=1; break; fi
    done
    if ((ok == 0)); then
      echo "$file includes $inc: $folder may include only: ${allowed# }"
      failed=1
    fi
  done < <(sed -nE 's/^#include "([^"]+)".*/\1/p' "$file")
done < <(find "${folders[@]}" -type f \
           \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) | sort)
if ((checked == 0)); then
  echo "no includes checked: is $src the source tree?"
  exit 1
fi
exit $failed
