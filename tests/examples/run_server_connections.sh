#!/usr/bin/env bash
# The inference server against more connections than it has descriptors:
#   1. with 128 descriptors and --max_connections above that, 300
#      connections make accepts fail (EMFILE); once they close, a fresh
#      client must be served, and the server counts the failed accepts;
#   2. with 128 descriptors and the default --max_connections (derived from
#      them), the connections past the limit are refused at once, with an
#      answer naming the flag, and a fresh client is served once the others
#      close;
#   3. (where the server has UCX) UCX connections past --max_connections are
#      rejected too;
#   4. gRPC connections count too: past the limit they are closed at once,
#      and their slots come back once gRPC has closed them.
# Every wait is bounded.
#   run_server_connections.sh SERVER CLIENT [server flags...]
set -uo pipefail
server=$1
client=$2
shift 2
source "$(dirname "$0")/server_test_lib.sh"
held=()
on_exit() {
  for fd in "${held[@]}"; do exec {fd}>&-; done
}
# This shell holds the 300 connections.
[ "$(ulimit -n)" -ge 400 ] || ulimit -n 1024 || fail "cannot open 400 descriptors here"

# Starts the server with 128 descriptors.
start_server() {
  rm -f "$dir/port" "$dir/ucx_port"
  (ulimit -n 128 && exec "$server" --http_port=0 --http_port_file="$dir/port" "$@") \
    >"$dir/server.out" 2>&1 &
  server_pid=$!
  wait_for_files "$dir/port"
  port=$(cat "$dir/port")
}

open_connections() {
  for _ in $(seq 1 "$1"); do
    exec {fd}<>"/dev/tcp/127.0.0.1/$port" || fail "cannot connect"
    held+=("$fd")
  done
}

close_connections() {
  for fd in "${held[@]}"; do exec {fd}>&-; done
  held=()
}

# A fresh client is served within TRIES tries (the closed connections'
# sessions end, and give their slots back, a moment after the close).
fresh_client_served() {
  for _ in $(seq 1 "$1"); do
    timeout 20 "$client" --http_port="$port" --connections=1 --seconds=0.3 >"$dir/fresh.out" 2>&1 &&
      return 0
    sleep 0.2
  done
  cat "$dir/fresh.out"
  return 1
}

stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid"
  local status=$?
  server_pid=""
  grep -v '^\[' "$dir/server.out"
  [ "$status" -eq 0 ] || fail "the server exited with $status"
  counters=$(grep '^dlasync server connections: ' "$dir/server.out") || fail "no connection counters"
}

echo "== 1. descriptors run out: accepts fail, the server waits and goes on"
# UBSan's vptr check tests that memory is readable by writing it into a
# pipe; in a process with no descriptor left it cannot, and it reports a
# valid object as having an invalid vptr. So where the server has UBSan
# (the ASan+UBSan build), it is not run out of descriptors; the plain and
# TSan builds run this part.
# (grep reads all of ldd's output: with -q, ldd could die of SIGPIPE and
# pipefail would make the test false.)
if ldd "$server" 2>/dev/null | grep libubsan >/dev/null; then
  echo "(skipped: UBSan needs descriptors of its own)"
else
  start_server --max_connections=100000 "$@"
  open_connections 300
  for _ in $(seq 1 50); do
    grep -q 'accepting a connection failed' "$dir/server.out" && break
    sleep 0.1
  done
  close_connections
  fresh_client_served 1 || fail "no fresh client is served after the descriptors ran out"
  grep -q 'accepting a connection failed (Too many open files)' "$dir/server.out" ||
    fail "300 connections did not exhaust 128 descriptors"
  stop_server
  [[ $counters =~ :\ 0\ refused.*\;\ ([0-9]+)\ accepts\ failed,\ in\ ([0-9]+)\ bursts ]] ||
    fail "counters: $counters"
  [ "${BASH_REMATCH[1]}" -gt 0 ] && [ "${BASH_REMATCH[2]}" -ge 1 ] || fail "counters: $counters"
  grep -q 'accepting again, after [0-9]* failed accepts' "$dir/server.out" ||
    fail "the end of the burst was not logged"
fi

echo "== 2. the default --max_connections refuses the connections past it"
start_server "$@"
max=$(sed -n 's/^dlasync server holds at most \([0-9]*\) connections.*/\1/p' "$dir/server.out")
[ "${max:-0}" -gt 0 ] && [ "$max" -lt 128 ] || fail "--max_connections defaults to '$max'"
open_connections 300
# Accepted in order: this one is turned away after the 300 were.
timeout 10 cat <"/dev/tcp/127.0.0.1/$port" >"$dir/turned_away" || fail "the refused peer hangs"
grep -aq 'connections at once (--max_connections)' "$dir/turned_away" ||
  fail "the refused peer was not told why: $(cat -v "$dir/turned_away")"
close_connections
fresh_client_served 20 || fail "no fresh client is served after the refusals"
stop_server
[[ $counters =~ :\ ([0-9]+)\ refused\ over\ --max_connections=([0-9]+)\ \(at\ most\ ([0-9]+)\ held ]] ||
  fail "counters: $counters"
[ "${BASH_REMATCH[1]}" -ge $((301 - max)) ] || fail "expected $((301 - max)) refused: $counters"
[ "${BASH_REMATCH[3]}" -eq "$max" ] || fail "expected $max held at most: $counters"
grep -q 'accepting a connection failed' "$dir/server.out" &&
  fail "accepts failed below the default limit"

echo "== 3. UCX connections past --max_connections are rejected"
start_server --max_connections=2 --ucx_port=0 --ucx_port_file="$dir/ucx_port" "$@"
for _ in $(seq 1 100); do
  [ -s "$dir/ucx_port" ] || grep -q 'this build has no UCX' "$dir/server.out" && break
  sleep 0.1
done
if grep -q 'this build has no UCX' "$dir/server.out"; then
  echo "(no UCX in this build)"
  wait "$server_pid"
  server_pid=""
else
  [ -s "$dir/ucx_port" ] || fail "the server did not listen for UCX"
  timeout 20 "$client" --transport=ucx --ucx_port="$(cat "$dir/ucx_port")" --connections=4 \
    --seconds=0.5 >"$dir/ucx.out" 2>&1
  grep -v '^\[' "$dir/ucx.out"
  grep -q 'valid requests answered correctly: [1-9]' "$dir/ucx.out" ||
    fail "the connections within the limit were not served"
  stop_server
  grep -q 'UCX transport: 2 connections, .* 2 connections refused over --max_connections' \
    "$dir/server.out" || fail "expected 2 UCX connections served and 2 refused"
fi
echo "== 4. gRPC connections count against --max_connections"
start_server --max_connections=2 --grpc_port=0 --grpc_port_file="$dir/grpc_port" "$@"
wait_for_files "$dir/grpc_port"
grpc=(--transport=grpc --grpc_port="$(cat "$dir/grpc_port")")
timeout 30 "$client" "${grpc[@]}" --connections=4 --seconds=0.5 >"$dir/grpc.out" 2>&1
grep -v '^\[' "$dir/grpc.out"
grep -q 'valid requests answered correctly: [1-9]' "$dir/grpc.out" ||
  fail "the gRPC connections within the limit were not served"
grep -q 'problem: gRPC request .*UNAVAILABLE' "$dir/grpc.out" ||
  fail "no gRPC connection was turned away"
# The slots come back once gRPC has closed the connections (a sweep looks
# every 250 ms): a fresh client with two connections is served whole.
served=0
for _ in $(seq 1 20); do
  timeout 20 "$client" "${grpc[@]}" --connections=2 --seconds=0.3 >"$dir/grpc2.out" 2>&1 &&
    served=1 && break
  sleep 0.2
done
[ "$served" = 1 ] || fail "the gRPC slots did not come back: $(cat "$dir/grpc2.out")"
stop_server
[[ $counters =~ :\ ([0-9]+)\ refused\ over\ --max_connections=2\ \(at\ most\ 2\ held ]] ||
  fail "counters: $counters"
[ "${BASH_REMATCH[1]}" -ge 2 ] || fail "expected at least 2 gRPC connections refused: $counters"
echo "server OK"
