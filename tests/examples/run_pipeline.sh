#!/usr/bin/env bash
# Runs the pipeline example briefly and checks its summary and exit status.
#   run_pipeline.sh PIPELINE [pipeline flags...]
set -euo pipefail
# Simulated GPUs stop at the first broken CUDA rule or stream-order race.
export DLASYNC_SIM_CHECK=abort
pipeline=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT

status=0
"$pipeline" --seconds=2 --batch_mib=1 --progress=false "$@" >"$out" 2>&1 || status=$?
cat "$out"
fail() { echo "FAILED: $*"; exit 1; }
[ "$status" -eq 0 ] || fail "the pipeline exited with $status"
grep -q '^| source   | imports | copies | imports/s |   GB/s | p50 ms | p99 ms |$' "$out" \
  || fail "no summary table"
grep -Eq '^checked ([0-9]+) of \1 batches, 0 failed' "$out" || fail "not every batch checked"
grep -Eq '^checked [1-9][0-9]* of' "$out" || fail "no batch went through"
for kind in pageable strided; do
  grep -Eq "^\| $kind +\| +[1-9]" "$out" || fail "no $kind imports"
done
if [[ " $* " == *" --sim_gpus="* ]]; then
  grep -Eq '^\| pinned +\| +[1-9]' "$out" || fail "no pinned imports"
  grep -q 'onto cuda:0 (dlasync simulated GPU 0)' "$out" || fail "not on the simulated GPU"
fi
echo "pipeline OK"
