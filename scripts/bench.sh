#!/usr/bin/env bash
# The benchmarks in one command. Installs what is missing (Debian's
# libtorch-dev for the PyTorch comparison and gnuplot-nox for the plot, next
# to the build's own packages), builds Release in build-bench/, runs
#   - dlasync_bench_host: zero-copy import cost, strided copies (kernel and
#     whole imports) against memcpy, small-tensor imports per second;
#   - dlasync_bench_torch: against at::fromDLPack and contiguous();
#   - dlasync_bench_gpu: on the first GPU when there is one, else on one
#     simulated GPU (reported as simulated: there "vs pinned" is the staging
#     pipeline's rate over the bound the simulated link allows);
#   - bench/frameworks_gpu.py on a GPU: PyTorch, CuPy and JAX transfers,
#     where they are installed;
#   - dlasync_bench_remote: remote imports from a second process against
#     ucx_perftest, over shared memory and TCP (where UCX is built);
#   - bench/python/bench_python.py: the Python module against NumPy and
#     PyTorch (per-call cost, strided copies up to 256 MiB), with Debian's
#     Python;
# and writes, for the machine name given (default: the host name):
#   bench/results/<machine>.csv   every benchmark's median real time and rate
#   bench/results/<machine>.txt   the programs' ratio tables
#   bench/results/<machine>.png   copy bandwidth against size
# and puts the ratio tables into docs/performance.md ("Latest results").
#
#   scripts/bench.sh [machine]
#   DLASYNC_BENCH_MAX_BYTES=N   largest host copy (default 1 GiB)
set -euo pipefail
cd "$(dirname "$0")/.."

machine=${1:-$(hostname -s)}
max_bytes=${DLASYNC_BENCH_MAX_BYTES:-1073741824}

bash scripts/install-deps.sh libtorch-dev gnuplot-nox pybind11-dev python3-dev python3-numpy \
  python3-torch libucx-dev ucx-utils
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++-12 \
  -DDLASYNC_BUILD_TESTS=OFF -DDLASYNC_BUILD_EXAMPLES=OFF -DDLASYNC_BUILD_BENCH=ON \
  -DDLASYNC_BUILD_PYTHON=ON -DPYTHON_EXECUTABLE=/usr/bin/python3 >/dev/null
cmake --build build-bench --parallel "$(nproc)"

work=build-bench/results
out=bench/results
mkdir -p "$work" "$out"
rm -f "$work"/*.csv "$work"/*.log
# Every ratio table row of every program, as CSV (bench/paired.hpp): the plot.
export DLASYNC_BENCH_RATIOS="$work/ratios.csv"

# run NAME PROGRAM: medians of 5 (the programs' default), CSV kept.
run() {
  local name=$1
  shift
  echo "== $name"
  "$@" --benchmark_min_time=0.05 --benchmark_color=false \
    --benchmark_out="$work/$name.csv" --benchmark_out_format=csv >"$work/$name.log" 2>&1 ||
    { tail -20 "$work/$name.log"; echo "$name failed"; exit 1; }
}

DLASYNC_BENCH_MAX_BYTES=$max_bytes run host build-bench/bench/dlasync_bench_host
if [ -x build-bench/bench/dlasync_bench_torch ]; then
  DLASYNC_BENCH_MAX_BYTES=$max_bytes run torch build-bench/bench/dlasync_bench_torch
else
  echo "== torch: not built (libtorch not found)"
fi
echo "== python"
python_max=$(( max_bytes < (256 << 20) ? max_bytes : (256 << 20) ))
PYTHONPATH=build-bench/python /usr/bin/python3 bench/python/bench_python.py \
  --max-bytes "$python_max" >"$work/python.log" 2>&1 ||
  { tail -20 "$work/python.log"; echo "python failed"; exit 1; }
if [ -x build-bench/bench/dlasync_bench_remote ]; then
  echo "== remote"
  build-bench/bench/dlasync_bench_remote --reps=5 --strided >"$work/remote.log" 2>&1 ||
    { tail -20 "$work/remote.log"; echo "remote failed"; exit 1; }
fi
gpu_label=gpu
if nvidia-smi -L >/dev/null 2>&1; then
  DLASYNC_CUDA=real DLASYNC_BENCH_MAX_BYTES=1073741824 run gpu build-bench/bench/dlasync_bench_gpu
  if command -v python3 >/dev/null; then
    echo "== frameworks"
    python3 bench/frameworks_gpu.py --max-bytes 1073741824 --dlasync-csv "$work/gpu.csv" \
      >"$work/frameworks.log" 2>&1 || echo "frameworks_gpu.py failed" >>"$work/frameworks.log"
  fi
else
  gpu_label=simulated_gpu
  DLASYNC_CUDA=sim:1 DLASYNC_BENCH_MAX_BYTES=268435456 run gpu build-bench/bench/dlasync_bench_gpu
fi

# The CSV: program, benchmark, median real time, its unit, bytes and items
# per second.
{
  echo "program,benchmark,real_time,time_unit,bytes_per_second,items_per_second"
  for f in "$work"/*.csv; do
    program=$(basename "$f" .csv)
    awk -F, -v program="$program" '
      /_median"?,/ {
        name = $1; gsub(/"/, "", name); sub(/_median$/, "", name)
        printf "%s,%s,%s,%s,%s,%s\n", program, name, $3, $5, $6, $7
      }' "$f"
  done
} >"$out/$machine.csv"

# The ratio tables, as the programs print them.
{
  echo "dlasync benchmarks on $machine, $(date -u +%Y-%m-%d)"
  # The CPU: the kernels choose instruction sets and stores from it.
  echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)," \
    "$(grep -c '^processor' /proc/cpuinfo) hardware threads"
  for name in host torch gpu; do
    [ -f "$work/$name.log" ] || continue
    echo
    sed -n '/ratio table/,$p;/^skipped/p' "$work/$name.log"
  done
  if [ -f "$work/python.log" ]; then
    echo
    cat "$work/python.log"
  fi
  if [ -f "$work/remote.log" ]; then
    echo
    grep -v '^\[' "$work/remote.log"
  fi
  if [ -f "$work/frameworks.log" ]; then
    echo
    cat "$work/frameworks.log"
  fi
} >"$out/$machine.txt"

# The plot: one question per panel (bench/plot_ratios.sh).
panels=0
if bash bench/plot_ratios.sh "$work/ratios.csv" "$out/$machine.png" "$machine" "$gpu_label"; then
  panels=1
fi

# The table in docs/performance.md, between its markers.
block="$work/performance-block.md"
{
  echo "<!-- bench.sh results begin -->"
  echo "Latest run of \`scripts/bench.sh $machine\` ($(date -u +%Y-%m-%d)); CSV and plot in"
  echo "\`bench/results/\`."
  echo
  [ "$panels" -gt 0 ] && echo "![ratios against size](../bench/results/$machine.png)" && echo
  echo '```'
  cat "$out/$machine.txt"
  echo '```'
  echo "<!-- bench.sh results end -->"
} >"$block"
awk -v block="$block" '
  /<!-- bench.sh results begin -->/ { while ((getline line < block) > 0) print line; skip = 1; next }
  /<!-- bench.sh results end -->/ { skip = 0; next }
  !skip { print }' docs/performance.md >"$work/performance.md"
if grep -q "bench.sh results begin" docs/performance.md; then
  cp "$work/performance.md" docs/performance.md
else
  { echo; echo "## Latest results"; echo; cat "$block"; } >>docs/performance.md
fi

echo
cat "$out/$machine.txt"
echo
cp "$work/ratios.csv" "$out/$machine-ratios.csv" 2>/dev/null || true
png=""; [ "$panels" -gt 0 ] && png=", $out/$machine.png"
echo "wrote $out/$machine.csv, $out/$machine-ratios.csv, $out/$machine.txt$png, docs/performance.md"
