#!/usr/bin/env bash
# Starts the inference server with its REST front and UCX transport, drives
# each with the load client (valid and malformed requests from many
# connections; over UCX once with the bytes in the requests, once with each
# valid request's input published as a remote bundle that the server
# fetches), then sends it UCX messages that break the protocol (from a
# peer that stays, and from one killed while it sends), stops the server
# with SIGTERM, and checks both reports and that it stopped cleanly.
#   run_server_ucx.sh SERVER CLIENT [server flags...]
set -uo pipefail
server=$1
client=$2
shift 2
source "$(dirname "$0")/server_test_lib.sh"
garbage_pid=""
on_exit() {
  [ -n "$garbage_pid" ] && kill -9 "$garbage_pid" 2>/dev/null
}

"$server" --http_port=0 --http_port_file="$dir/port" --ucx_port=0 --ucx_port_file="$dir/ucx_port" \
  --max_request_mib=1 --memory_budget_mib=8 --allow_remote_inputs "$@" >"$dir/server.out" 2>&1 &
server_pid=$!
wait_for_files "$dir/port" "$dir/ucx_port"

total_valid=0
for run in ucx rest ucx_remote; do
  transport=${run%_remote}
  extra=()
  [ "$run" = ucx_remote ] && extra=(--remote_inputs)
  run_load "$run" --transport="$transport" --http_port="$(cat "$dir/port")" \
    --ucx_port="$(cat "$dir/ucx_port")" --connections=8 --seconds=2 --malformed=0.3 \
    --server_max_request_mib=1 --max_elements=20000 "${extra[@]}"
  total_valid=$((total_valid + answered))
done
# Every bundle the client published was fetched and released: each
# producer's deleter ran once.
published=$(sed -n 's/^  remote inputs: \([0-9]*\) bundles published, \([0-9]*\) .*/\1 \2/p' \
  "$dir/ucx_remote.out")
read -r bundles released <<<"$published"
[ "${bundles:-0}" -gt 0 ] && [ "$bundles" = "$released" ] ||
  fail "remote inputs: ${bundles:-none} bundles published, ${released:-none} producers released"

# Messages that break the protocol: every one that asks for an answer gets
# one, and a valid request after them is answered.
"$client" --transport=ucx --ucx_port="$(cat "$dir/ucx_port")" --ucx_garbage=500 \
  >"$dir/garbage.out" 2>&1 || fail "the garbage peer: $(cat "$dir/garbage.out")"
grep '^  garbage: ' "$dir/garbage.out"
grep -q 'the valid request after them answered OK' "$dir/garbage.out" ||
  fail "the server does not serve after the garbage"
# And a peer killed while it sends them: its requests are under way when the
# server stops.
"$client" --transport=ucx --ucx_port="$(cat "$dir/ucx_port")" --ucx_garbage=1000000 \
  >"$dir/killed.out" 2>&1 &
garbage_pid=$!
for _ in $(seq 1 100); do
  grep -q "^  garbage: connected" "$dir/killed.out" 2>/dev/null && break
  sleep 0.05
done
kill -9 "$garbage_pid"
wait "$garbage_pid" 2>/dev/null
garbage_pid=""

kill -TERM "$server_pid"
timeout 30 tail --pid="$server_pid" -f /dev/null
kill -0 "$server_pid" 2>/dev/null && fail "the server did not stop on SIGTERM"
wait "$server_pid"
server_status=$?
server_pid=""
grep -v '^\[' "$dir/server.out"
[ "$server_status" -eq 0 ] || fail "the server exited with $server_status"
# UCX warns of descriptors or requests nobody gave back.
grep -q 'was not returned to mpool\|not released' "$dir/server.out" &&
  fail "the server left UCX objects behind"
grep -q 'UCX transport: 18 connections' "$dir/server.out" || fail "not 18 UCX connections counted"
ok=$(sed -n 's/.* \([0-9]*\) requests answered OK.*/\1/p' "$dir/server.out")
[ "${ok:-0}" -ge "$total_valid" ] || fail "the server answered $ok OK, the clients counted $total_valid"
grep -q 'errors INVALID_ARGUMENT: [1-9]' "$dir/server.out" || fail "no InvalidArgument answers"
grep -q 'errors OUT_OF_RANGE: [1-9]' "$dir/server.out" || fail "no OutOfRange answers"
echo "server OK over UCX and REST"
