#!/usr/bin/env bash
# Starts the inference server with its REST and gRPC fronts (the Open
# Inference Protocol, KServe v2), drives every REST endpoint with curl, then
# runs the protocol tests in kserve_http_test.py (raw sockets for malformed,
# hostile and pipelined requests) and kserve_grpc_test.py, with Triton's own
# client library, tritonclient, where the Python given has it (gRPC needs
# it), stops the server with SIGTERM and checks its
# report: nothing in flight, the memory budget all given back.
#   run_server_kserve.sh SERVER PYTHON [server flags...]
# With DLASYNC_REQUIRE_TRITONCLIENT=1, a PYTHON without tritonclient fails.
set -uo pipefail
server=$1
python=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/server_test_lib.sh"

"$server" --http_port=0 --http_port_file="$dir/http_port" \
  --grpc_port=0 --grpc_port_file="$dir/grpc_port" \
  --max_request_mib=4 --memory_budget_mib=32 --read_timeout_ms=1500 --idle_timeout_ms=20000 \
  --http_max_header_kib=8 --allow_client_shm "$@" >"$dir/server.out" 2>&1 &
server_pid=$!
wait_for_files "$dir/http_port" "$dir/grpc_port"
url="127.0.0.1:$(cat "$dir/http_port")"
grpc_url="127.0.0.1:$(cat "$dir/grpc_port")"

# expect METHOD PATH STATUS BODY_PATTERN [curl args...]: the status, and the
# body matching an extended regular expression ("" for an empty body). With
# slot_waits=N set, a request the server refuses for --max_connections (503)
# is sent again, up to N times, 0.1 s apart, before it is checked.
slot_waits=0
expect() {
  local method=$1 path=$2 want=$3 pattern=$4
  shift 4
  local got waits=$slot_waits
  while :; do
    got=$(curl -sS -o "$dir/body" -w '%{http_code}' -X "$method" "http://$url$path" "$@") ||
      fail "curl $method $path failed"
    if [ "$waits" -le 0 ] || [ "$got" != 503 ] || ! grep -q 'max_connections' "$dir/body"; then
      break
    fi
    waits=$((waits - 1))
    sleep 0.1
  done
  [ "$got" = "$want" ] || fail "$method $path: status $got, expected $want: $(cat "$dir/body")"
  if [ -z "$pattern" ]; then
    [ ! -s "$dir/body" ] || fail "$method $path: expected no body, got $(cat "$dir/body")"
  else
    grep -Eq "$pattern" "$dir/body" || fail "$method $path: body $(cat "$dir/body") !~ $pattern"
  fi
  echo "ok: $method $path -> $got"
}

expect GET /v2/health/live 200 ""
expect GET /v2/health/ready 200 ""
expect GET /v2 200 '^\{"extensions":\["binary_tensor_data","system_shared_memory"\],"name":"dlasync","version":"[^"]+"\}$'
expect GET /v2/models/sum 200 \
  '^\{"inputs":\[\{"datatype":"FP32","name":"INPUT0","shape":\[-1\]\}\],"name":"sum","outputs":\[\{"datatype":"FP64","name":"SUM","shape":\[1\]\}\],"platform":"dlasync","versions":\["1"\]\}$'
expect GET /v2/models/echo/versions/1 200 '"name":"echo"'
expect GET /v2/models/sum/ready 200 ""
expect GET /v2/models/sum/versions/1/ready 200 ""
expect GET /v2/models/sum/versions/2/ready 404 '"error":"model sum has no version \\"2\\"'
expect GET /v2/models/nope 404 '"error":"model \\"nope\\" is not served here; the models are sum, echo, negate"'
expect GET /v2/nothing 404 '"error":"no endpoint /v2/nothing here'
expect POST /v2/health/live 405 '"error":"POST is not served at /v2/health/live: use GET"'
expect POST /v2/models/sum/infer 200 \
  '^\{"id":"c1","model_name":"sum","model_version":"1","outputs":\[\{"data":\[10.0\],"datatype":"FP64","name":"SUM","shape":\[1\]\}\]\}$' \
  -d '{"id":"c1","inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}'
expect POST /v2/models/negate/versions/1/infer 200 '"data":\[-1.5,2.0\]' \
  -d '{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[1.5,-2]}]}'
expect POST /v2/models/sum/infer 400 '"error":"input INPUT0 of model sum is FP32; the request sends INT32"' \
  -d '{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[1]}]}'
# Expect: 100-continue, and a chunked body.
head -c 3000 /dev/zero | tr '\0' ' ' >"$dir/pad"
printf '{"inputs":[{"name":"INPUT0","shape":[3],"datatype":"FP32","data":[1,2,3]}]}' >>"$dir/pad"
expect POST /v2/models/sum/infer 200 '"data":\[6.0\]' -H 'Expect: 100-continue' \
  --data-binary @"$dir/pad"
expect POST /v2/models/sum/infer 200 '"data":\[6.0\]' -H 'Transfer-Encoding: chunked' \
  --data-binary @"$dir/pad"
expect POST /v2/models/sum/infer 417 '"error":"Expect: something is not served' \
  -H 'Expect: something' -d '{}'

# The protocol tests, with the same server.
require=${DLASYNC_REQUIRE_TRITONCLIENT:-0}
DLASYNC_HTTP="$url" DLASYNC_GRPC="$grpc_url" DLASYNC_REQUIRE_TRITONCLIENT="$require" \
  "$python" -m pytest -q -p no:cacheprovider "$here/kserve_http_test.py" \
  "$here/kserve_grpc_test.py" || fail "the protocol tests failed"

kill -TERM "$server_pid"
wait "$server_pid"
server_status=$?
server_pid=""
cat "$dir/server.out"
[ "$server_status" -eq 0 ] || fail "the server exited with $server_status"
grep -q 'errors INVALID_ARGUMENT: [1-9]' "$dir/server.out" || fail "no InvalidArgument answers"
grep -Eq '^dlasync server memory budget: 0 bytes in use at the end' "$dir/server.out" ||
  fail "the memory budget is not all given back: every body's last user is its tensor's deleter"
imports=$(tail -n 4 "$dir/server.out" | grep '^imports: ')
grep -Eq '^imports: 0 in flight, 0 waiting for budget; [0-9]+ views, [0-9]+ copies' <<<"$imports" ||
  fail "the final runtime stats are not settled: $imports"

# More connections than --max_connections: the one over gets 503 at once.
"$server" --http_port=0 --http_port_file="$dir/http_port2" --max_connections=1 \
  "$@" >"$dir/server2.out" 2>&1 &
server_pid=$!
wait_for_files "$dir/http_port2"
url="127.0.0.1:$(cat "$dir/http_port2")"
exec 3<>"/dev/tcp/127.0.0.1/$(cat "$dir/http_port2")"  # holds the only connection
sleep 0.3
expect GET /v2/health/live 503 '"error":"the server holds 1 connections at once \(--max_connections\)'
exec 3>&-
# The server gives its one slot back once it reads a connection's end; a
# request sent before that is refused like the one above, so the requests
# here wait for the slot, 10 s at most.
slot_waits=100
# The shared-memory extension is off by default.
expect POST /v2/systemsharedmemory/region/r/register 403 '"error":"the system shared-memory extension is off on this server: start it with --allow_client_shm' \
  -d '{"key":"/x","byte_size":4}'
expect GET /v2/systemsharedmemory/status 403 'allow_client_shm'
kill -TERM "$server_pid"
wait "$server_pid" || fail "the second server exited with $?"
server_pid=""
echo "PASSED"
