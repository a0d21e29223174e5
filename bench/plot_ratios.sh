#!/usr/bin/env bash
# Plots the ratio rows the benchmark programs write (DLASYNC_BENCH_RATIOS,
# bench/paired.hpp), one question per panel: ratios against size, log
# scales, the lowest and highest per-repetition ratio as error bars, 1 (the
# baseline) dashed. Panels:
#   the host copy kernel against memcpy;
#   whole imports against PyTorch's contiguous(), 1 and 2 threads;
#   the Python module against NumPy's ascontiguousarray;
#   GPU transfers against cudaMemcpyAsync: on a real GPU ("gpu"), or titled
#   as simulated ("simulated_gpu"), never on axes shared with real figures.
# Rows in ns (fast paths, small imports) are tables, not curves.
#
#   bench/plot_ratios.sh RATIOS.csv OUT.png MACHINE [gpu|simulated_gpu]
# Exits 1 when there is nothing to plot.
set -euo pipefail
rows=$1
png=$2
machine=$3
gpu=${4:-gpu}
series=$(mktemp -d)
trap 'rm -rf "$series"' EXIT
[ -f "$rows" ] || exit 1
/usr/bin/python3 - "$rows" "$series" "$gpu" <<'PY'
import csv, os, sys
rows, out, gpu = sys.argv[1], sys.argv[2], sys.argv[3]
def panel(program, title):
    if program == "host" and title.startswith("copy kernel"):
        return "1", "copy kernel, 1 thread / memcpy"
    if program == "torch" and "contiguous()" in title:
        one = "1 thread" in title
        return ("2" if one else "3"), "whole import / PyTorch contiguous(), " + (
            "1 thread" if one else "2 threads")
    if program == "python" and "ascontiguousarray" in title:
        return "4", "Python rt.from_dlpack copy / NumPy ascontiguousarray"
    if program == "gpu":
        if gpu == "gpu":
            return "5", "GPU: imports / cudaMemcpyAsync"
        return "5", "SIMULATED GPU (not a real device): imports / cudaMemcpyAsync"
    return None
with open(rows, newline="") as f:
    for r in csv.reader(f):
        if len(r) < 12 or r[4] != "GB/s":
            continue
        p = panel(r[0], r[1])
        if p is None:
            continue
        key, title = p
        name = key + "_" + r[2].replace(" ", "-").replace("/", "-")
        with open(os.path.join(out, name + ".dat"), "a") as d:
            d.write(f"{r[3]} {r[7]} {r[8]} {r[9]}\n")
        with open(os.path.join(out, key + ".title"), "w") as t:
            t.write(title)
PY
panels=$(find "$series" -name '*.title' | wc -l)
[ "$panels" -gt 0 ] || exit 1
{
  echo "set terminal pngcairo size 1200,$((380 * ((panels + 1) / 2))) noenhanced"
  echo "set output '$png'"
  echo "set multiplot layout $(((panels + 1) / 2)),2 title 'dlasync on $machine: ratio to the baseline (median of interleaved repetitions; bars: lowest-highest)'"
  echo "set logscale x 2"
  echo "set logscale y 2"
  echo "set xtics ('4K' 4096, '64K' 65536, '1M' 1048576, '16M' 16777216, '256M' 268435456, '1G' 1073741824)"
  echo "set xrange [1500:2e9]"
  echo "set grid"
  echo "set key top left font ',8'"
  echo "set ylabel 'ratio (1 = baseline, log scale)'"
  for t in $(find "$series" -name '*.title' | sort); do
    key=$(basename "$t" .title)
    echo "set title '$(cat "$t")'"
    plots=""
    for f in "$series/${key}"_*.dat; do
      sort -n -o "$f" "$f"
      label=$(basename "$f" .dat)
      plots="${plots:+$plots, }'$f' using 1:2:3:4 with yerrorlines title '${label#*_}'"
    done
    echo "plot 1 with lines lc 'black' dt 2 notitle, $plots"
  done
  echo "unset multiplot"
} | gnuplot
