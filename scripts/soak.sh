#!/usr/bin/env bash
# Soak: the inference server under many connections, with valid and
# malformed frames and a memory budget far below the offered load, for a
# bounded time. The server's resident set size is sampled once a second.
# Passes when every valid request was answered correctly, every malformed
# frame (bodies beyond the whole budget among them) got its specific error,
# the server stopped cleanly, and its memory stayed flat over the second
# half of the run.
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
frame_mib=$((budget_mib * 2))

bash scripts/install-deps.sh
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

build-demo/examples/dlasync_server --port=0 --port_file="$dir/port" \
  --memory_budget_mib="$budget_mib" --connection_budget_mib="$budget_mib" \
  --max_frame_mib="$frame_mib" "$@" >"$dir/server.out" 2>&1 &
server_pid=$!
for _ in $(seq 1 300); do
  [ -s "$dir/port" ] && break
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited early"
  sleep 0.1
done
[ -s "$dir/port" ] || fail "the server did not start listening"

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

# Requests of up to 2 MiB (2^18 elements of 8 bytes) from many connections
# against a budget of a few MiB: most of them wait for room.
echo "soak: $seconds s, $connections connections, budget $budget_mib MiB, server flags: $*"
client_status=0
build-demo/examples/dlasync_load --port="$(cat "$dir/port")" --connections="$connections" \
  --seconds="$seconds" --malformed=0.1 --max_elements=262144 \
  --server_max_frame_mib="$frame_mib" --server_budget_mib="$budget_mib" \
  >"$dir/client.out" 2>&1 || client_status=$?
cat "$dir/client.out"

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
