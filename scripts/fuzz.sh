#!/usr/bin/env bash
# Builds the libFuzzer targets with clang 14 (ASan + UBSan) in build-fuzz/ and
# runs each for a bounded time from its committed seed corpus. Any crash,
# sanitizer report, hang (10 s per input) or broken invariant fails.
#
#   scripts/fuzz.sh [seconds per target, default 60]
#
# New inputs found during the run go to build-fuzz/corpus/, not into the
# committed seeds; a crashing input is written to build-fuzz/ and printed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}

bash scripts/install-deps.sh clang-14 libclang-rt-14-dev

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DDLASYNC_FUZZ=ON -DDLASYNC_WITH_CUDA=OFF \
  -DDLASYNC_BUILD_TESTS=OFF -DDLASYNC_BUILD_EXAMPLES=OFF >/dev/null
targets=(import kserve)
# Where UCX is there: the descriptor and node-message fuzzers (the remote
# component) and the inference server's UCX transport.
if pkg-config --exists ucx; then targets+=(descriptor node_messages ucx_server); fi
cmake --build build-fuzz --parallel "$(nproc)" \
  --target $(printf 'dlasync_fuzz_%s ' "${targets[@]}")

# Options of one target. node_messages and ucx_server keep state across
# inputs (connections, and UCX's pools, which LeakSanitizer does not scan),
# so a leak check between inputs reports it; each checks its own state after
# every input, and takes everything down at exit, where LeakSanitizer
# checks everything.
declare -A target_options=([node_messages]="-detect_leaks=0" [ucx_server]="-detect_leaks=0")

status=0
for target in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$target
  mkdir -p "$corpus"
  echo "== fuzz_$target for ${seconds} s"
  # UCX (linked by the descriptor and UCX fuzzers) would catch the crash
  # signals that libFuzzer reports with: UCX_HANDLE_ERRORS=none leaves them to
  # it. UCX_LOG_LEVEL=error: a message to an id without a handler is a
  # warning each time.
  UCX_HANDLE_ERRORS=none UCX_LOG_LEVEL=error build-fuzz/tests/fuzz/dlasync_fuzz_$target "$corpus" tests/fuzz/corpus/$target \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    ${target_options[$target]:-} \
    -artifact_prefix=build-fuzz/crash-$target- 2>&1 | tail -15 || status=1
done
exit $status
