#!/usr/bin/env bash
# Runs the Python pipeline example briefly on two simulated GPUs and checks its
# summary and exit status.
#   run_python_pipeline.sh PYTHON PIPELINE_PY
set -euo pipefail
export DLASYNC_SIM_CHECK=abort
python=$1
pipeline=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT

status=0
"$python" "$pipeline" --sim-gpus 2 --seconds 2 --batch-mib 0.5 >"$out" 2>&1 || status=$?
cat "$out"
fail() { echo "FAILED: $*"; exit 1; }
[ "$status" -eq 0 ] || fail "the pipeline exited with $status"
grep -q '^| source   | imports | copies | imports/s |   GB/s | p50 ms | p99 ms |$' "$out" \
  || fail "no summary table"
grep -q 'dlasync Python pipeline: cuda:0 (simulated)' "$out" || fail "not on the simulated GPU"
grep -Eq '^checked ([0-9]+) of \1 batches, 0 failed' "$out" || fail "not every batch checked"
grep -Eq '^checked [1-9][0-9]* of' "$out" || fail "no batch went through"
for kind in pageable strided; do
  grep -Eq "^\| $kind +\| +[1-9]" "$out" || fail "no $kind imports"
done
echo "python pipeline OK"
