#!/usr/bin/env bash
# Soak: the inference server under many REST connections from the load
# client, with valid and malformed KServe v2 requests and a memory budget far
# below the offered load, for a bounded time, and at the same time h2load's
# requests over its REST and gRPC fronts (64 KiB tensors). The server's
# resident set size is sampled once a second. Passes when every valid request
# of the load client was answered correctly, every malformed one (bodies
# beyond the whole budget among them) got its specific error, every h2load
# request completed (REST with 200), the server stopped cleanly, and its
# memory stayed flat over the second half of the run.
#
#   scripts/soak.sh                     60 s on the host
#   scripts/soak.sh 600 --sim_gpus=2    10 minutes onto 2 simulated GPUs
#
# Builds Release in build-demo/ (installing missing Debian packages first).
# Environment: SOAK_CONNECTIONS (64), SOAK_BUDGET_MIB (4), SOAK_MAX_SLOPE
# (the largest RSS growth accepted over the second half, MiB per minute: 2).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
[ $# -gt 0 ] && shift
connections=${SOAK_CONNECTIONS:-64}
budget_mib=${SOAK_BUDGET_MIB:-4}
max_slope=${SOAK_MAX_SLOPE:-2}
request_mib=$((budget_mib * 2))

bash scripts/install-deps.sh nghttp2-client
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++-12 \
  -DDLASYNC_BUILD_TESTS=OFF -DDLASYNC_BUILD_EXAMPLES=ON -DDLASYNC_BUILD_BENCH=OFF >/dev/null
cmake --build build-demo --parallel "$(nproc)" --target dlasync_server dlasync_load

dir=$(mktemp -d)
server_pid=""
sampler_pid=""
cleanup() {
  [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "SOAK FAILED: $*"
  echo "--- server output:"
  cat "$dir/server.out" 2>/dev/null || true
  exit 1
}

build-demo/examples/dlasync_server \
  --http_port=0 --http_port_file="$dir/http_port" --grpc_port=0 --grpc_port_file="$dir/grpc_port" \
  --memory_budget_mib="$budget_mib" --connection_budget_mib="$budget_mib" \
  --max_request_mib="$request_mib" "$@" >"$dir/server.out" 2>&1 &
server_pid=$!
for _ in $(seq 1 300); do
  [ -s "$dir/http_port" ] && [ -s "$dir/grpc_port" ] && break
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited early"
  sleep 0.1
done
[ -s "$dir/grpc_port" ] || fail "the server did not start listening"
python3 bench/kserve_bodies.py "$dir" 16384  # 64 KiB of FP32

# One sample a second: seconds since the start, resident set in KiB.
(
  start=$SECONDS
  while kill -0 "$server_pid" 2>/dev/null; do
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status" 2>/dev/null || true)
    [ -n "$rss" ] && echo "$((SECONDS - start)) $rss" >>"$dir/rss"
    sleep 1
  done
) &
sampler_pid=$!

# Requests of up to 2 MiB (2^19 FP32 elements) from many connections against
# a budget of a few MiB: most of them wait for room.
echo "soak: $seconds s, $connections connections, budget $budget_mib MiB, server flags: $*"
# h2load beside them, for the same time: REST (HTTP/1.1) and gRPC.
h2load --h1 -D "$seconds" -c 8 -m 1 -d "$dir/rest.body" -H "$(cat "$dir/rest.header")" \
  "http://127.0.0.1:$(cat "$dir/http_port")/v2/models/sum/infer" >"$dir/rest.out" 2>&1 &
rest_pid=$!
h2load -D "$seconds" -c 8 -m 1 -d "$dir/grpc.body" -H 'content-type: application/grpc' \
  -H 'te: trailers' "http://127.0.0.1:$(cat "$dir/grpc_port")/inference.GRPCInferenceService/ModelInfer" \
  >"$dir/grpc.out" 2>&1 &
grpc_pid=$!
client_status=0
build-demo/examples/dlasync_load --transport=rest --http_port="$(cat "$dir/http_port")" \
  --connections="$connections" --seconds="$seconds" --malformed=0.1 --max_elements=524288 \
  --server_max_request_mib="$request_mib" --server_budget_mib="$budget_mib" \
  >"$dir/client.out" 2>&1 || client_status=$?
cat "$dir/client.out"

wait "$rest_pid" || fail "h2load (REST) failed: $(cat "$dir/rest.out")"
wait "$grpc_pid" || fail "h2load (gRPC) failed: $(cat "$dir/grpc.out")"
for front in rest grpc; do
  echo "soak: $front: $(grep -E '^(requests|status codes|finished in):' "$dir/$front.out" | tr '\n' ' ')"
  grep -Eq '^requests: [0-9]+ total, [0-9]+ started, [0-9]+ done, [1-9][0-9]* succeeded, 0 failed, 0 errored, 0 timeout' \
    "$dir/$front.out" || fail "$front requests failed: $(cat "$dir/$front.out")"
done
grep -Eq '^status codes: [1-9][0-9]* 2xx, 0 3xx, 0 4xx, 0 5xx' "$dir/rest.out" ||
  fail "REST requests got other statuses than 200"
kill "$sampler_pid" 2>/dev/null || true
wait "$sampler_pid" 2>/dev/null || true
sampler_pid=""
kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=""
cat "$dir/server.out"

[ "$client_status" -eq 0 ] || fail "the client exited with $client_status"
[ "$server_status" -eq 0 ] || fail "the server exited with $server_status"
grep -q '^  wrong or missing answers: 0$' "$dir/client.out" || fail "wrong answers"
grep -q 'errors RESOURCE_EXHAUSTED: [1-9]' "$dir/server.out" ||
  fail "no request beyond the budget was refused with ResourceExhausted"
[ -s "$dir/rss" ] || fail "no RSS samples"

# RSS: first sample, the end, the peak, and the trend over the second half
# (least-squares slope, MiB per minute).
awk -v max_slope="$max_slope" '
  { t[NR] = $1; r[NR] = $2 / 1024 }
  END {
    n = NR; half = int(n / 2) + 1; peak = 0
    for (i = 1; i <= n; i++) if (r[i] > peak) peak = r[i]
    m = 0; st = 0; sr = 0; stt = 0; str = 0
    for (i = half; i <= n; i++) { m++; st += t[i]; sr += r[i]; stt += t[i] * t[i]; str += t[i] * r[i] }
    slope = (m > 1 && m * stt - st * st != 0) ? (m * str - st * sr) / (m * stt - st * st) * 60 : 0
    printf "RSS MiB: start %.1f, at half time %.1f, end %.1f, peak %.1f; second-half trend %+.2f MiB/min (limit %s), %d samples\n", r[1], r[half], r[n], peak, slope, max_slope, n
    exit slope > max_slope ? 1 : 0
  }' "$dir/rss" || fail "memory grew over the second half"
echo "soak OK"
