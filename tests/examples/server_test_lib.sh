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
