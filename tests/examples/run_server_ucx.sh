#!/usr/bin/env bash
# Starts the inference server with its TCP and UCX transports, drives each
# with the load client (valid and malformed requests from many
# connections), stops the server with SIGTERM, and checks both reports.
#   run_server_ucx.sh SERVER CLIENT [server flags...]
set -uo pipefail
export DLASYNC_SIM_CHECK=abort
server=$1
client=$2
shift 2
dir=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  echo "--- server output:"
  grep -v '^\[' "$dir/server.out"
  exit 1
}

"$server" --port=0 --port_file="$dir/port" --ucx_port=0 --ucx_port_file="$dir/ucx_port" \
  --max_frame_mib=1 --memory_budget_mib=8 "$@" >"$dir/server.out" 2>&1 &
server_pid=$!
for _ in $(seq 1 300); do
  [ -s "$dir/port" ] && [ -s "$dir/ucx_port" ] && break
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited early"
  sleep 0.1
done
[ -s "$dir/ucx_port" ] || fail "the server did not start listening for UCX"

total_valid=0
for transport in ucx tcp; do
  "$client" --transport="$transport" --port="$(cat "$dir/port")" \
    --ucx_port="$(cat "$dir/ucx_port")" --connections=8 --seconds=2 --malformed=0.3 \
    --server_max_frame_mib=1 --max_elements=20000 >"$dir/$transport.out" 2>&1
  status=$?
  grep -v '^\[' "$dir/$transport.out"
  [ "$status" -eq 0 ] || fail "the $transport client exited with $status"
  grep -q '^  wrong or missing answers: 0$' "$dir/$transport.out" || fail "wrong answers ($transport)"
  valid=$(sed -n 's/^  valid requests answered correctly: \([0-9]*\).*/\1/p' "$dir/$transport.out")
  malformed=$(sed -n 's/^  malformed frames answered as expected: \([0-9]*\).*/\1/p' \
    "$dir/$transport.out")
  [ "${valid:-0}" -gt 0 ] || fail "no valid request answered over $transport"
  [ "${malformed:-0}" -gt 0 ] || fail "no malformed request answered over $transport"
  total_valid=$((total_valid + valid))
done

kill -TERM "$server_pid"
wait "$server_pid"
server_status=$?
server_pid=""
grep -v '^\[' "$dir/server.out"
[ "$server_status" -eq 0 ] || fail "the server exited with $server_status"
grep -q 'UCX transport: 8 connections' "$dir/server.out" || fail "no UCX connections counted"
ok=$(sed -n 's/.* \([0-9]*\) requests answered OK.*/\1/p' "$dir/server.out")
[ "${ok:-0}" -ge "$total_valid" ] || fail "the server answered $ok OK, the clients counted $total_valid"
grep -q 'errors INVALID_ARGUMENT: [1-9]' "$dir/server.out" || fail "no InvalidArgument answers"
grep -q 'errors OUT_OF_RANGE: [1-9]' "$dir/server.out" || fail "no OutOfRange answers"
echo "server OK over UCX and TCP"
