#!/usr/bin/env bash
# The inference server's KServe v2 transports against each other, on the
# same requests (the load client's seeded stream of `sum` requests), run by
# run: REST (HTTP/1.1, binary tensor data), gRPC, and where dlasync has UCX,
# the gRPC messages as UCX active messages.
#   bench/server_transports.sh BUILD_DIR [runs] [seconds] [max_elements] [connections]
# Prints each run's requests per second over each transport and their ratio
# to REST, then the median ratios with their spread.
set -euo pipefail
build=${1:?usage: server_transports.sh BUILD_DIR [runs] [seconds] [max_elements] [connections]}
runs=${2:-5}
seconds=${3:-3}
max_elements=${4:-262144}
connections=${5:-8}
server=$build/examples/dlasync_server
client=$build/examples/dlasync_load
dir=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && { kill "$pid"; wait "$pid"; } 2>/dev/null; rm -rf "$dir"' EXIT
transports=(rest grpc)
ucx_flags=()
if grep -q '^DLASYNC_WITH_UCX:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  transports+=(ucx)
  ucx_flags=(--ucx_port=0 --ucx_port_file="$dir/ucx")
fi
"$server" --http_port=0 --http_port_file="$dir/http" --grpc_port=0 \
  --grpc_port_file="$dir/grpc" "${ucx_flags[@]}" --device=cpu --max_request_mib=16 \
  --memory_budget_mib=256 >"$dir/server.out" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  [ -s "$dir/http" ] && [ -s "$dir/grpc" ] && { [ ${#ucx_flags[@]} -eq 0 ] || [ -s "$dir/ucx" ]; } &&
    break
  sleep 0.1
done
rate() { sed -n 's/.*answered correctly: [0-9]* (\([0-9]*\)\/s, \([0-9.]*\) MB\/s.*/\1/p' "$1"; }
printf "run"
for t in "${transports[@]}"; do printf "  %9s" "$t req/s"; done
for t in "${transports[@]:1}"; do printf "  %9s" "$t/rest"; done
printf "\n"
for run in $(seq 1 "$runs"); do
  declare -A r=()
  for t in "${transports[@]}"; do
    "$client" --transport="$t" --http_port="$(cat "$dir/http")" --grpc_port="$(cat "$dir/grpc")" \
      --ucx_port="$(cat "$dir/ucx" 2>/dev/null || echo 0)" --connections="$connections" \
      --seconds="$seconds" --max_elements="$max_elements" --seed="$run" >"$dir/$t.out" 2>&1 ||
      { cat "$dir/$t.out"; exit 1; }
    r[$t]=$(rate "$dir/$t.out")
  done
  printf "%3d" "$run"
  for t in "${transports[@]}"; do printf "  %9s" "${r[$t]}"; done
  for t in "${transports[@]:1}"; do
    ratio=$(awk -v a="${r[$t]}" -v b="${r[rest]}" 'BEGIN { printf "%.2f", a / b }')
    echo "$ratio" >>"$dir/ratio.$t"
    printf "  %9s" "$ratio"
  done
  printf "\n"
done
for t in "${transports[@]:1}"; do
  sort -n "$dir/ratio.$t" | awk -v t="$t" '{ r[NR] = $1 } END {
    printf "median %s/rest %.2f [%.2f-%.2f] over %d runs\n", t, r[int((NR + 1) / 2)], r[1], r[NR], NR }'
done
