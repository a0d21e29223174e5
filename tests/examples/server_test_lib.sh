# Sourced by the inference server's test scripts (run_server_*.sh): what each
# one sets up before starting the server.
#   dir             a temporary folder, removed at exit; the server's output
#                   goes to $dir/server.out
#   server_pid      the server's process, killed at exit if still running
#   on_exit         a function run first at exit; a script that holds more
#                   (descriptors, peers) defines its own
#   fail MESSAGE    prints MESSAGE and the server's output (less UCX's own log
#                   lines), exits 1
#   wait_for_files FILE...
#                   waits until each file is non-empty (the server writes its
#                   ports there once listening); fails if the server exits or
#                   30 s pass
#   run_load NAME ARG...
#                   runs the load client ($client) with ARGs, its output in
#                   $dir/NAME.out, printed less UCX's log lines; fails unless it
#                   exits 0 with no wrong answer and some valid requests
#                   answered, and with --malformed, some malformed ones refused
#                   as expected; sets `answered` to the valid ones answered
# Simulated GPUs stop at the first broken CUDA rule or stream-order race.
export DLASYNC_SIM_CHECK=abort
dir=$(mktemp -d)
server_pid=""
on_exit() { :; }
cleanup() {
  on_exit
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  echo "--- server output:"
  grep -v '^\[' "$dir/server.out" 2>/dev/null
  exit 1
}
wait_for_files() {
  local _ f all
  for _ in $(seq 1 300); do
    all=1
    for f in "$@"; do [ -s "$f" ] || all=0; done
    [ "$all" = 1 ] && return 0
    kill -0 "$server_pid" 2>/dev/null || fail "the server exited early"
    sleep 0.1
  done
  fail "the server did not start listening (nothing in $*)"
}
run_load() {
  local name=$1 status refused
  shift
  "$client" "$@" >"$dir/$name.out" 2>&1
  status=$?
  grep -v '^\[' "$dir/$name.out"
  [ "$status" -eq 0 ] || fail "the load client ($name) exited with $status"
  grep -q '^  wrong or missing answers: 0$' "$dir/$name.out" || fail "wrong answers ($name)"
  answered=$(sed -n 's/^  valid requests answered correctly: \([0-9]*\).*/\1/p' "$dir/$name.out")
  [ "${answered:-0}" -gt 0 ] || fail "no valid request answered ($name)"
  if [[ " $* " == *" --malformed="* ]]; then
    refused=$(sed -n 's/^  malformed requests answered as expected: \([0-9]*\).*/\1/p' \
      "$dir/$name.out")
    [ "${refused:-0}" -gt 0 ] || fail "no malformed request refused as expected ($name)"
  fi
}
