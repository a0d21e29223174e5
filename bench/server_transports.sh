#!/usr/bin/env bash
# The inference server's UCX transport against its TCP frames, on the same
# requests (the load client's seeded stream), interleaved run by run:
#   bench/server_transports.sh BUILD_DIR [runs] [seconds] [max_elements] [connections]
# Prints each run's requests per second over both transports and their
# ratio, then the median ratio with its spread.
set -euo pipefail
build=${1:?usage: server_transports.sh BUILD_DIR [runs] [seconds] [max_elements] [connections]}
runs=${2:-5}
seconds=${3:-3}
max_elements=${4:-262144}
connections=${5:-8}
server=$build/examples/dlasync_server
client=$build/examples/dlasync_load
dir=$(mktemp -d)
trap 'kill -9 $pid 2>/dev/null; rm -rf "$dir"' EXIT
"$server" --port=0 --port_file="$dir/port" --ucx_port=0 --ucx_port_file="$dir/ucx" \
  --device=cpu --max_frame_mib=16 --memory_budget_mib=256 >"$dir/server.out" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -s "$dir/port" ] && [ -s "$dir/ucx" ] && break; sleep 0.1; done
rate() { sed -n 's/.*answered correctly: [0-9]* (\([0-9]*\)\/s, \([0-9.]*\) MB\/s.*/\1 \2/p' "$1"; }
echo "run  tcp req/s  tcp MB/s  ucx req/s  ucx MB/s  ucx/tcp"
ratios=()
for run in $(seq 1 "$runs"); do
  for transport in tcp ucx; do
    "$client" --transport=$transport --port="$(cat "$dir/port")" --ucx_port="$(cat "$dir/ucx")" \
      --connections="$connections" --seconds="$seconds" --max_elements="$max_elements" \
      --seed="$run" >"$dir/$transport.out" 2>&1
  done
  read -r tr tm <<<"$(rate "$dir/tcp.out")"
  read -r ur um <<<"$(rate "$dir/ucx.out")"
  ratio=$(awk -v u="$ur" -v t="$tr" 'BEGIN { printf "%.2f", u / t }')
  ratios+=("$ratio")
  printf "%3d  %9s  %8s  %9s  %8s  %7s\n" "$run" "$tr" "$tm" "$ur" "$um" "$ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ r[NR] = $1 } END {
  printf "median ucx/tcp %.2f [%.2f-%.2f] over %d runs\n", r[int((NR + 1) / 2)], r[1], r[NR], NR }'
