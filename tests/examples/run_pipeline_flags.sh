#!/usr/bin/env bash
# The pipeline's command line: --help lists its flags; bad values get a
# message naming the value and what to use instead, and exit status 2.
set -uo pipefail
pipeline=$1
fail() { echo "FAILED: $*"; exit 1; }

help=$("$pipeline" --help 2>&1)
for flag in --device --sim_gpus --seconds --concurrency --mix --copy; do
  grep -q -- "$flag" <<<"$help" || fail "--help does not explain $flag"
done

expect_refusal() {
  local words=$1
  shift
  local out status
  out=$("$pipeline" --progress=false "$@" 2>&1)
  status=$?
  echo "$* -> $status: $out"
  [ "$status" -eq 2 ] || fail "$* exited with $status, expected 2"
  grep -q -- "$words" <<<"$out" || fail "$* does not say \"$words\""
}
expect_refusal "cuda:7" --device=cuda:7 --sim_gpus=2
expect_refusal "use auto, cpu or cuda:N" --device=tpu:0
expect_refusal "use auto, true or false" --copy=maybe
expect_refusal "unknown kind \"floppy\"" --mix=pageable,floppy
echo "flags OK"
