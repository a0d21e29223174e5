#!/usr/bin/env bash
# The GPU checks, in one call of a few minutes on a machine with a GPU:
# builds for sm_90, runs the [gpu] tests, the examples on the GPU (the
# pipeline, and the server under the load client), the GPU benchmarks and the
# Python frameworks' transfers where they are installed
# (bench/frameworks_gpu.py), builds the Python module for this machine's
# Python when it has pybind11 and runs its tests (the GPU frameworks' among
# them) and its GPU benchmark, and prints the benchmark's ratio table last.
# Dependencies come from the system or from .gpu-deps
# (scripts/fetch-gpu-deps.sh, carried along). Every part's output is kept as
# a file in $OUT (default build-gpu/results), for the caller to fetch:
#   checks.log                    the [gpu] tests and the examples
#   bench-gpu.log, bench-gpu.csv  the GPU benchmark's tables and its runs
#   ratios.csv                    every ratio row (bench/paired.hpp)
#   count-instructions.log        instructions per fast-path call
#   frameworks.log, python.log    the frameworks and the Python module
#   summary.txt                   the exit status of each part
# (eight files: what a caller's fetch of $OUT can take back).
#
#   scripts/gpu-check.sh [max bytes, default 1 GiB]
set -euo pipefail
cd "$(dirname "$0")/.."
max_bytes=${1:-$((1 << 30))}
out=${OUT:-build-gpu/results}
mkdir -p "$out"
rm -f "$out"/*.log "$out"/*.csv "$out"/summary.txt
export DLASYNC_BENCH_RATIOS=$out/ratios.csv

args=()
if [ -d .gpu-deps/root ]; then
  deps=$PWD/.gpu-deps/root
  args+=(-DCMAKE_PREFIX_PATH="$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake"
         -DCMAKE_INCLUDE_PATH="$deps/usr/include")
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
cxx=$(command -v g++-12 || command -v g++)
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

# The Python module, for the python3 on PATH, when it has pybind11 (pip's).
py=$(command -v python3 || true)
pybind11_dir=""
[ -n "$py" ] && pybind11_dir=$("$py" -m pybind11 --cmakedir 2>/dev/null || true)
if [ -n "$pybind11_dir" ]; then
  args+=(-DDLASYNC_BUILD_PYTHON=ON -DPYTHON_EXECUTABLE="$py" -Dpybind11_DIR="$pybind11_dir")
else
  args+=(-DDLASYNC_BUILD_PYTHON=OFF)
fi

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 -DDLASYNC_WITH_CUDA=ON \
  -DDLASYNC_BUILD_TESTS=ON -DDLASYNC_BUILD_BENCH=ON -DDLASYNC_BUILD_EXAMPLES=ON "${args[@]}"
cmake --build build-gpu --parallel "$(nproc)" --target dlasync_gpu_tests dlasync_bench_gpu \
  dlasync_bench_host dlasync_pipeline dlasync_server dlasync_load
[ -n "$pybind11_dir" ] && cmake --build build-gpu --parallel "$(nproc)" --target dlasync_python

status=0
# part NAME LOG COMMAND...: runs a part, its output shown and kept in
# $out/LOG, its status in summary.txt; a failure fails the check.
part() {
  local name=$1 log=$out/$2
  shift 2
  echo "== $name"
  local rc
  set +e
  "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "$name: exit $rc" >>"$out/summary.txt"
  [ "$rc" -eq 0 ] || status=$rc
}
part "[gpu] tests" checks.log timeout 120 build-gpu/tests/dlasync_gpu_tests
part "pipeline on the GPU" checks.log \
  timeout 60 build-gpu/examples/dlasync_pipeline --seconds=5 --progress=false
part "server on the GPU" checks.log timeout 60 bash tests/examples/run_server_load.sh \
  build-gpu/examples/dlasync_server build-gpu/examples/dlasync_load
echo "== GPU benchmarks (up to $max_bytes bytes)"
rc=0
DLASYNC_CUDA=real DLASYNC_BENCH_MAX_BYTES=$max_bytes timeout 300 \
  build-gpu/bench/dlasync_bench_gpu --benchmark_min_time=0.05 --benchmark_out="$out/bench-gpu.csv" \
  --benchmark_out_format=csv >"$out/bench-gpu.log" 2>&1 || rc=$?
echo "GPU benchmarks: exit $rc" >>"$out/summary.txt"
[ "$rc" -eq 0 ] || status=$rc
if command -v valgrind >/dev/null; then
  part "instruction counts" count-instructions.log bash scripts/count_instructions.sh build-gpu
fi
if command -v python3 >/dev/null; then
  part "the frameworks on this machine (PyTorch, CuPy, JAX where installed)" frameworks.log \
    timeout 150 python3 bench/frameworks_gpu.py --max-bytes "$max_bytes" \
    --dlasync-csv "$out/bench-gpu.csv"
fi
if [ -n "$pybind11_dir" ]; then
  if "$py" -c "import pytest" 2>/dev/null; then
    part "the Python module's GPU tests" python.log env PYTHONPATH=build-gpu/python timeout 150 \
      "$py" -m pytest -q -p no:cacheprovider tests/python/test_gpu_frameworks.py
  else
    part "the Python module's GPU tests" python.log env PYTHONPATH=build-gpu/python timeout 90 \
      "$py" tests/python/test_gpu_frameworks.py
  fi
  part "the Python module's GPU benchmark" python.log env PYTHONPATH=build-gpu/python \
    timeout 120 "$py" bench/python/bench_gpu_python.py \
    --max-bytes "$(( max_bytes < (256 << 20) ? max_bytes : (256 << 20) ))"
else
  echo "skipped: no pybind11 for $py" | tee -a "$out/python.log"
fi
echo "== exit status: $status (each part: $out/summary.txt)"
cat "$out/summary.txt"
sed -n '/GPU ratio table/,$p;/^skipped/p' "$out/bench-gpu.log"
exit $status
