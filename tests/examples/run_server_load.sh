#!/usr/bin/env bash
# Starts the inference server, drives it with the load client (valid and
# malformed KServe v2 requests from many connections, over REST and gRPC),
# asks for the runtime's counters
# with SIGUSR1, stops it with SIGTERM, and checks both reports and exit
# statuses.
#   run_server_load.sh SERVER CLIENT [server flags...]
set -uo pipefail
server=$1
client=$2
shift 2
source "$(dirname "$0")/server_test_lib.sh"

"$server" --http_port=0 --http_port_file="$dir/http_port" --grpc_port=0 \
  --grpc_port_file="$dir/grpc_port" --max_request_mib=1 --memory_budget_mib=8 "$@" \
  >"$dir/server.out" 2>&1 &
server_pid=$!
wait_for_files "$dir/http_port" "$dir/grpc_port"
ports=(--http_port="$(cat "$dir/http_port")" --grpc_port="$(cat "$dir/grpc_port")")

# Requests to the sum model, a share of them malformed, each refusal checked
# for its status and words: 16 REST connections, then 8 gRPC ones.
run_load rest --transport=rest "${ports[@]}" --connections=16 --seconds=3 --malformed=0.3 \
  --server_max_request_mib=1 --max_elements=20000
valid=$answered
run_load grpc --transport=grpc "${ports[@]}" --connections=8 --seconds=2 --malformed=0.3 \
  --server_max_request_mib=1 --max_elements=20000
valid=$((valid + answered))

# The server is still healthy: one more short run on a fresh connection.
"$client" "${ports[@]}" --connections=1 --seconds=0.5 >"$dir/again.out" 2>&1 \
  || fail "the server does not serve after the malformed requests: $(cat "$dir/again.out")"

# SIGUSR1 prints the runtime's counters, and the server goes on.
kill -USR1 "$server_pid"
for _ in $(seq 1 100); do
  grep -q '^dlasync runtime stats:$' "$dir/server.out" && break
  sleep 0.1
done
grep -q '^dlasync runtime stats:$' "$dir/server.out" || fail "no runtime stats on SIGUSR1"
kill -0 "$server_pid" 2>/dev/null || fail "the server exited on SIGUSR1"

kill -TERM "$server_pid"
wait "$server_pid"
server_status=$?
server_pid=""
cat "$dir/server.out"
[ "$server_status" -eq 0 ] || fail "the server exited with $server_status"
ok=$(sed -n 's/.* \([0-9]*\) requests answered OK.*/\1/p' "$dir/server.out")
[ "${ok:-0}" -ge "$valid" ] || fail "the server answered $ok OK, the client counted $valid"
grep -q 'errors INVALID_ARGUMENT: [1-9]' "$dir/server.out" || fail "no InvalidArgument answers"
grep -q 'errors NOT_FOUND: [1-9]' "$dir/server.out" || fail "no NotFound answers"
grep -q 'errors RESOURCE_EXHAUSTED: [1-9]' "$dir/server.out" || fail "no ResourceExhausted answers"
# Its counters at the end: once at SIGUSR1, once at exit, with nothing left
# in flight and every valid request imported.
[ "$(grep -c '^dlasync runtime stats:$' "$dir/server.out")" -eq 2 ] ||
  fail "the runtime stats are not printed once on SIGUSR1 and once at exit"
imports=$(tail -n 4 "$dir/server.out" | grep '^imports: ')
grep -Eq '^imports: 0 in flight, 0 waiting for budget; [0-9]+ views, [0-9]+ copies' <<<"$imports" ||
  fail "the final runtime stats are not settled: $imports"
completed=$(sed -E 's/.*; ([0-9]+) views, ([0-9]+) copies.*/\1 + \2/' <<<"$imports")
[ "$((completed))" -ge "$valid" ] ||
  fail "the runtime completed $completed imports, the client counted $valid valid requests"
tail -n 1 "$dir/server.out" | grep -Eq '^latency \([1-9][0-9]* imports\): ' ||
  fail "no latency histogram in the final runtime stats"
echo "server OK"
