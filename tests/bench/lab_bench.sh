# shellcheck shell=bash
# What the lab benchmarks (lab_allreduce_compare.sh, lab_train_compare.sh)
# start with, sourced after `set -euo pipefail`:
#   source lab_bench.sh NAME PREFIX "$@"
# Sets root, bin (MUSTER_BIN, default build/bin), python (PYTHON, default
# .venv/bin/python), rate ($1, default 1gbit) and runs ($2, default 3);
# exits 2 unless run as root; brings up lab $lab (PREFIX and this shell's
# pid) of two nodes whose links are shaped to $rate each way, owned by this
# shell, and a scratch directory $dir; both are removed on exit.
# shellcheck disable=SC2034  # root, python and runs: the sourcing script's
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${MUSTER_BIN:-$root/build/bin}"
# shellcheck disable=SC2034
python="${PYTHON:-$root/.venv/bin/python}"
rate="${3:-1gbit}"
# shellcheck disable=SC2034
runs="${4:-3}"
[ "$(id -u)" = 0 ] || { echo "$1: needs root (network namespaces)" >&2; exit 2; }
lab="$2$(($$ % 10000))"
dir="$(mktemp -d)"
"$bin/muster-lab" up "$lab" --nodes 2 --rate "$rate" --owner $$ > /dev/null
trap '"$bin/muster-lab" down "$lab" > /dev/null 2>&1 || true; rm -rf "$dir"' EXIT
