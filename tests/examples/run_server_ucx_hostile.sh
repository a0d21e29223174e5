#!/usr/bin/env bash
# The inference server's UCX transport against peers that hold its budget
# (UCX over TCP, where a rendezvous body needs its sender to progress):
#   1. read deadline: 4 peers start 1 MiB rendezvous bodies (the whole 4 MiB
#      budget) and stop progressing; REST and UCX clients must be answered
#      meanwhile, the stalled requests answered DeadlineExceeded or their
#      connections closed, and the server must count them;
#   2. queue bounds: while such peers hold the budget (no deadline this
#      time), one connection floods 20,000 requests of 6 KiB; all but
#      --max_queued_requests must be refused at once with ResourceExhausted,
#      the server's memory must stay within 40 MiB of its start, and the
#      queued ones must be answered once the budget frees;
#   3. a clean stop: SIGTERM while stalled peers hold received bodies and
#      queued requests; the server exits 0 and UCX reports nothing left
#      behind.
# Every wait is bounded.
#   run_server_ucx_hostile.sh SERVER CLIENT [server flags...]
set -uo pipefail
server=$1
client=$2
shift 2
source "$(dirname "$0")/server_test_lib.sh"
peer_pids=()
on_exit() {
  touch "$dir/release"
  for pid in "${peer_pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
}
ucx=(--transport=ucx --ucx_transports=tcp)

start_server() {
  rm -f "$dir/port" "$dir/ucx_port" "$dir/release"
  "$server" --http_port=0 --http_port_file="$dir/port" --ucx_port=0 --ucx_port_file="$dir/ucx_port" \
    --ucx_transports=tcp --max_request_mib=2 --memory_budget_mib=4 --connection_budget_mib=1 \
    --max_queued_requests=16 "$@" >"$dir/server.out" 2>&1 &
  server_pid=$!
  wait_for_files "$dir/port" "$dir/ucx_port"
  port=$(cat "$dir/port")
  ucx_port=$(cat "$dir/ucx_port")
}

# Starts a stalled peer NAME with N connections; returns once it stalls.
stall() {
  rm -f "$dir/release"
  "$client" "${ucx[@]}" --ucx_port="$ucx_port" --ucx_stall="$2" \
    --stall_until_file="$dir/release" >"$dir/$1.out" 2>&1 &
  peer_pids+=($!)
  for _ in $(seq 1 200); do
    grep -q '^  stalling: ' "$dir/$1.out" && return
    sleep 0.05
  done
  cat "$dir/$1.out"
  fail "the stalled peer $1 did not stall"
}

# Waits until the server's report (SIGUSR1) of its UCX requests starts with
# WHAT, for instance "4 waiting for room, 2 bodies arriving".
wait_for_requests() {
  for _ in $(seq 1 100); do
    kill -USR1 "$server_pid"
    sleep 0.05
    grep '^dlasync server UCX requests: ' "$dir/server.out" | tail -n 1 |
      grep -q "^dlasync server UCX requests: $1" && return 0
  done
  grep "^dlasync server UCX requests: " "$dir/server.out" | tail -n 3
  fail "the server's UCX requests never were: $1"
}

# Releases the stalled peers and checks that each ended as expected:
# "late" (told DeadlineExceeded or disconnected) or "answered".
release() {
  touch "$dir/release"
  for pid in "${peer_pids[@]}"; do timeout 30 tail --pid="$pid" -f /dev/null; done
  for pid in "${peer_pids[@]}"; do wait "$pid" || fail "a stalled peer exited with $?"; done
  peer_pids=()
}

stop_server() {
  kill -TERM "$server_pid"
  timeout 30 tail --pid="$server_pid" -f /dev/null
  kill -0 "$server_pid" 2>/dev/null && fail "the server did not stop on SIGTERM"
  wait "$server_pid"
  local status=$?
  server_pid=""
  grep -v '^\[' "$dir/server.out"
  [ "$status" -eq 0 ] || fail "the server exited with $status"
  # UCX warns of descriptors or requests nobody gave back.
  grep -q 'was not returned to mpool\|not released' "$dir/server.out" &&
    fail "the server left UCX objects behind"
  true
}

echo "== 1. rendezvous bodies that stop arriving are cut off at the read deadline"
start_server --read_timeout_ms=2000 "$@"
stall stalled 4
wait_for_requests "0 waiting for room, 4 bodies arriving"
timeout 15 "$client" --http_port="$port" --connections=2 --seconds=1 --max_elements=20000 \
  >"$dir/rest.out" 2>&1 &
rest_pid=$!
timeout 15 "$client" "${ucx[@]}" --ucx_port="$ucx_port" --connections=2 --seconds=1 \
  --max_elements=20000 >"$dir/ucx.out" 2>&1
ucx_status=$?
wait "$rest_pid"
rest_status=$?
grep -v '^\[' "$dir/rest.out" "$dir/ucx.out"
[ "$rest_status" -eq 0 ] || fail "the REST client behind the stalled peers exited with $rest_status"
[ "$ucx_status" -eq 0 ] || fail "the UCX client behind the stalled peers exited with $ucx_status"
release
cat "$dir/stalled.out"
line=$(grep '^  stalled requests: ' "$dir/stalled.out")
[[ $line =~ :\ 4:\ 0\ answered\ OK,\ ([0-9]+)\ told\ DeadlineExceeded,\ ([0-9]+)\ disconnected ]] ||
  fail "the stalled requests were not cut off: $line"
[ $((BASH_REMATCH[1] + BASH_REMATCH[2])) -eq 4 ] || fail "stalled requests: $line"
stop_server
grep -q 'UCX transport: .* 4 closed past the read deadline' "$dir/server.out" ||
  fail "expected 4 UCX connections closed past the read deadline"
grep -q 'errors DEADLINE_EXCEEDED: 4$' "$dir/server.out" || fail "expected 4 DeadlineExceeded"

echo "== 2. a flood while the budget is held: bounded queue, bounded memory"
start_server --read_timeout_ms=60000 "$@"
stall held 4
wait_for_requests "0 waiting for room, 4 bodies arriving"
rss_start=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status")
"$client" "${ucx[@]}" --ucx_port="$ucx_port" --ucx_flood=20000 --flood_kib=6 \
  --server_max_queued_requests=16 >"$dir/flood.out" 2>&1 &
flood_pid=$!
peer_pids+=("$flood_pid")
for _ in $(seq 1 600); do
  grep -q '^  flood: all but 16 answered' "$dir/flood.out" && break
  kill -0 "$flood_pid" 2>/dev/null || break
  sleep 0.05
done
grep -q '^  flood: all but 16 answered' "$dir/flood.out" ||
  fail "the flood was not refused while the budget is held: $(cat "$dir/flood.out")"
rss_peak=$(awk '/^VmHWM:/ {print $2}' "/proc/$server_pid/status")
echo "server RSS ${rss_start} kB with the budget held, at most ${rss_peak} kB through the flood"
[ $((rss_peak - rss_start)) -lt $((40 * 1024)) ] ||
  fail "the flood took the server from ${rss_start} kB to ${rss_peak} kB"
release
cat "$dir/flood.out" "$dir/held.out"
grep -q '^  flood: 20000 requests, 19984 refused with ResourceExhausted, 16 answered OK$' \
  "$dir/flood.out" || fail "the flood was not answered as expected"
grep -q '^  stalled requests: 4: 4 answered OK' "$dir/held.out" ||
  fail "the requests that held the budget were not answered once they went on"

echo "== 3. SIGTERM with bodies arriving and requests queued"
stall interrupted 6
wait_for_requests "2 waiting for room, 4 bodies arriving"
stop_server
release
grep -q 'UCX transport: .* 19984 requests refused over the queue bounds' "$dir/server.out" ||
  fail "expected 19984 requests refused over the queue bounds"
grep -q 'errors RESOURCE_EXHAUSTED: 19984$' "$dir/server.out" || fail "expected 19984 refusals"
echo "server OK"
