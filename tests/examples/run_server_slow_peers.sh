#!/usr/bin/env bash
# Starts the inference server with small budgets and short deadlines, opens
# slow peers against it and drives it with the load client meanwhile:
#   - 6 load-client peers whose HTTP requests announce a 1 MiB body and send
#     it a byte every 100 ms (four of them hold the whole 4 MiB budget, the
#     others wait);
#   - on bash's /dev/tcp: a peer that sends part of a request's head, one
#     that announces a body and sends none of it, and one that sends nothing.
# Checks that the valid requests, on connections opened after the slow peers,
# are all answered correctly and within a bound; that every slow peer is
# disconnected at its deadline, and told why when it can read; and the
# server's counters. Every wait is bounded.
#   run_server_slow_peers.sh SERVER CLIENT [server flags...]
set -uo pipefail
server=$1
client=$2
shift 2
read_timeout_ms=1500
idle_timeout_ms=3000
slow_peers=6
source "$(dirname "$0")/server_test_lib.sh"
raw_pids=()
on_exit() {
  for pid in "${raw_pids[@]}"; do kill "$pid" 2>/dev/null; done
}

"$server" --http_port=0 --http_port_file="$dir/port" --max_request_mib=2 --memory_budget_mib=4 \
  --connection_budget_mib=1 --read_timeout_ms="$read_timeout_ms" \
  --idle_timeout_ms="$idle_timeout_ms" "$@" >"$dir/server.out" 2>&1 &
server_pid=$!
wait_for_files "$dir/port"
port=$(cat "$dir/port")

# A peer on /dev/tcp: sends BYTES (printf %b escapes), then waits, 10 s at
# most, until the server closes the connection. Writes how long that took, in
# ms, to $dir/NAME and what the server sent to $dir/NAME.reply.
raw_peer() {
  local name=$1 bytes=$2 start end
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return
  start=$(date +%s%N)
  printf '%b' "$bytes" >&3
  timeout 10 cat <&3 >"$dir/$name.reply"
  end=$(date +%s%N)
  exec 3>&-
  echo $(((end - start) / 1000000)) >"$dir/$name"
}
raw_peer header 'POST /v2/mod' &
raw_pids+=($!)
# Announces 1 MiB, sends none of it.
raw_peer silent 'POST /v2/models/sum/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n' &
raw_pids+=($!)
raw_peer idle '' &
raw_pids+=($!)

run_load client --http_port="$port" --slow_peers="$slow_peers" --slow_body_kib=1024 \
  --slow_interval_ms=100 --slow_seconds=8 --connections=4 --seconds=3 --malformed=0.2 \
  --server_max_request_mib=2 --server_connection_budget_mib=1 --max_elements=20000
valid=$answered
# Valid requests wait for room behind the slow peers that came first: at most
# about one read deadline (the first four are cut off at once, and their room
# goes to the two waiting slow peers and the valid requests together).
max_us=$(sed -n 's/^  latency us: .* max \([0-9]*\)$/\1/p' "$dir/client.out")
[ "${max_us:-999999999}" -lt $((3 * read_timeout_ms * 1000)) ] ||
  fail "a valid request waited ${max_us} us"
line=$(grep '^  slow peers disconnected by the server: ' "$dir/client.out")
[[ $line =~ :\ ([0-9]+)\ of\ ([0-9]+)\ \(after\ ([0-9]+)\ to\ ([0-9]+)\ ms ]] ||
  fail "no slow-peer report"
[ "${BASH_REMATCH[1]}" -eq "$slow_peers" ] || fail "slow peers left connected: $line"
[ "${BASH_REMATCH[3]}" -ge $((read_timeout_ms * 9 / 10)) ] || fail "cut off too early: $line"
[ "${BASH_REMATCH[4]}" -lt $((2 * read_timeout_ms + 2500)) ] || fail "cut off too late: $line"

for pid in "${raw_pids[@]}"; do wait "$pid"; done
raw_pids=()
for peer in header silent idle; do
  [ -s "$dir/$peer" ] || fail "the $peer peer could not connect"
  ms=$(cat "$dir/$peer")
  deadline=$read_timeout_ms
  [ "$peer" = idle ] && deadline=$idle_timeout_ms
  echo "the $peer peer was disconnected after $ms ms (deadline $deadline ms)"
  [ "$ms" -ge $((deadline * 9 / 10)) ] && [ "$ms" -lt $((deadline + 2500)) ] ||
    fail "the $peer peer was disconnected after $ms ms, its deadline is $deadline ms"
done
grep -aq "^HTTP/1.1 408 .*the request's head did not arrive within" <(tr -d '\r' <"$dir/header.reply" | tr '\n' ' ') ||
  fail "the header peer was not told why: $(cat "$dir/header.reply")"
grep -Eaq "^HTTP/1.1 408 .*the body did not (start|arrive) within" <(tr -d '\r' <"$dir/silent.reply" | tr '\n' ' ') ||
  fail "the silent peer was not told why: $(cat "$dir/silent.reply")"
[ ! -s "$dir/idle.reply" ] || fail "the idle peer got a reply"

# The server still serves on a fresh connection.
"$client" --http_port="$port" --connections=1 --seconds=0.5 >"$dir/again.out" 2>&1 ||
  fail "the server does not serve after the slow peers: $(cat "$dir/again.out")"

kill -TERM "$server_pid"
wait "$server_pid"
server_status=$?
server_pid=""
cat "$dir/server.out"
[ "$server_status" -eq 0 ] || fail "the server exited with $server_status"
ok=$(sed -n 's/.* \([0-9]*\) requests answered OK.*/\1/p' "$dir/server.out")
[ "${ok:-0}" -ge "$valid" ] || fail "the server answered $ok OK, the client counted $valid"
counters=$(grep '^dlasync server deadlines: ' "$dir/server.out")
[[ $counters =~ :\ ([0-9]+)\ connections\ closed\ past\ the\ read\ deadline,\ ([0-9]+)\ closed\ idle\;\ ([0-9]+)\ requests ]] ||
  fail "no deadline counters"
[ "${BASH_REMATCH[1]}" -eq $((slow_peers + 2)) ] || fail "expected $((slow_peers + 2)) late: $counters"
[ "${BASH_REMATCH[2]}" -eq 1 ] || fail "expected 1 idle: $counters"
[ "${BASH_REMATCH[3]}" -gt 0 ] || fail "no request refused over the connection budget"
grep -q "errors DEADLINE_EXCEEDED: $((slow_peers + 2))\$" "$dir/server.out" ||
  fail "expected $((slow_peers + 2)) DeadlineExceeded answers"
grep -q 'errors RESOURCE_EXHAUSTED: [1-9]' "$dir/server.out" || fail "no ResourceExhausted answers"
echo "server OK"
