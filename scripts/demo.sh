#!/usr/bin/env bash
# The demo: on a fresh Debian 12 machine too, installs the Debian packages
# that are missing, builds dlasync and its examples (Release, in build-demo/),
# and runs the data-pipeline example on the default device: the first real
# GPU when there is one, else the host. Arguments go to the pipeline:
#
#   scripts/demo.sh                  10 s on the default device
#   scripts/demo.sh --sim_gpus=2     onto simulated GPUs (no GPU needed)
#   scripts/demo.sh --help           the pipeline's flags
#
# `scripts/demo.sh server [server flags]` runs the inference server instead:
# it serves KServe v2 over REST and gRPC (and UCX where dlasync has it), the
# load client drives each for 5 s with 10 % malformed requests, and the
# server stops and prints what it served.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++-12 \
  -DDLASYNC_BUILD_TESTS=OFF -DDLASYNC_BUILD_EXAMPLES=ON -DDLASYNC_BUILD_BENCH=OFF >/dev/null
if [ "${1:-}" != server ]; then
  cmake --build build-demo --parallel "$(nproc)" --target dlasync_pipeline
  exec build-demo/examples/dlasync_pipeline "$@"
fi

shift
cmake --build build-demo --parallel "$(nproc)" --target dlasync_server dlasync_load
dir=$(mktemp -d)
server_pid=""
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$dir"' EXIT
transports=(rest grpc)
ucx=()
if grep -q '^DLASYNC_WITH_UCX:BOOL=ON' build-demo/CMakeCache.txt; then
  transports+=(ucx)
  ucx=(--ucx_port=0 --ucx_port_file="$dir/ucx")
fi
build-demo/examples/dlasync_server --http_port=0 --http_port_file="$dir/http" \
  --grpc_port=0 --grpc_port_file="$dir/grpc" "${ucx[@]}" --max_request_mib=1 "$@" \
  >"$dir/server.out" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  [ -s "$dir/http" ] && [ -s "$dir/grpc" ] && { [ ${#ucx[@]} -eq 0 ] || [ -s "$dir/ucx" ]; } &&
    break
  kill -0 "$server_pid" 2>/dev/null || { cat "$dir/server.out"; exit 1; }
  sleep 0.1
done
grep -v '^\[' "$dir/server.out"
for transport in "${transports[@]}"; do
  build-demo/examples/dlasync_load --transport="$transport" --http_port="$(cat "$dir/http")" \
    --grpc_port="$(cat "$dir/grpc")" --ucx_port="$(cat "$dir/ucx" 2>/dev/null || echo 0)" \
    --connections=8 --seconds=5 --malformed=0.1 --server_max_request_mib=1 2>&1 | grep -v '^\['
done
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
grep '^dlasync server stopped\|^dlasync server memory\|^  errors' "$dir/server.out"
