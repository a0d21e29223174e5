#!/usr/bin/env bash
# Instructions per call of the fast paths, counted by callgrind: a figure
# that noise on a shared machine does not move, beside the timed ratios.
# Each operation runs 1,000 times inside one function of dlasync_bench_host
# (--count=NAME); callgrind collects inside it only.
#
#   scripts/count_instructions.sh [build dir, default build-bench] [operation...]
#   operations: import_view co_await_import co_await_post co_await_copy_64k stats
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
shift || true
ops=("$@")
[ ${#ops[@]} -gt 0 ] || ops=(import_view co_await_import co_await_post co_await_copy_64k stats)
command -v valgrind >/dev/null || bash scripts/install-deps.sh valgrind
bench="$build/bench/dlasync_bench_host"
[ -x "$bench" ] || { echo "no $bench: build the benchmarks first" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-22s %14s\n' "operation" "instructions"
for op in "${ops[@]}"; do
  valgrind --tool=callgrind --callgrind-out-file="$out/$op.out" \
    --toggle-collect='*count_calls*' "$bench" "--count=$op" >"$out/$op.log" 2>&1 ||
    { tail -5 "$out/$op.log"; echo "$op failed" >&2; exit 1; }
  total=$(awk '/^totals:/ { print $2 }' "$out/$op.out")
  printf '%-22s %14.0f\n' "$op" "$(echo "$total / 1000" | bc -l)"
done
