#!/usr/bin/env bash
# Remote imports between two hosts, as far as one machine can make them: two
# network namespaces joined by a veth pair, each with its own address, an
# exporter (tests/remote/remote_peer.cpp) in one and an importer in the other,
# over UCX's TCP transport.
#   1. With 2 ms of delay and 1 % loss each way (tc netem, where the kernel
#      has it; else without), imports still complete, byte for byte: a
#      contiguous tensor, a strided one, and a bundle of small and large
#      members.
#   2. The link is cut in the middle of a large bundle: the import ends with
#      Unavailable or DeadlineExceeded within its bound (the importer's
#      --import_timeout_ms, plus slack), the exporter's lease ends and every
#      member's producer is deleted once.
#   3. With the link back, a new import and a new bundle succeed, byte for
#      byte.
#   4. Both nodes shut down; every producer was deleted exactly once.
# Removes what it made. Where namespaces cannot be made (no CAP_NET_ADMIN,
# no `ip`), it is skipped (exit 77) with the reason.
#   run_netns.sh REMOTE_PEER
set -uo pipefail
peer=$1
id=$$
ns_e=dla-exp-$id
ns_i=dla-imp-$id
subnet=10.$((200 + RANDOM % 50)).$((RANDOM % 250)).
addr_e=${subnet}1
addr_i=${subnet}2
import_timeout_ms=${NETNS_IMPORT_TIMEOUT_MS:-4000}
lease_ms=3000
dir=$(mktemp -d)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  ip netns del "$ns_e" 2>/dev/null
  ip netns del "$ns_i" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.err; do [ -s "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
  exit 1
}
skip() {
  echo "skipped: $*"
  exit 77
}

command -v ip >/dev/null || skip "no ip command (iproute2)"
command -v tc >/dev/null || skip "no tc command (iproute2)"
why=$(ip netns add "$ns_e" 2>&1) || skip "cannot make network namespaces here (needs CAP_NET_ADMIN): $why"
ip netns add "$ns_i" || fail "a second namespace"
ip link add "ve-$id" type veth peer name "vi-$id" || fail "cannot make a veth pair"
ip link set "ve-$id" netns "$ns_e" && ip link set "vi-$id" netns "$ns_i" || fail "moving the veths"
ip -n "$ns_e" addr add "$addr_e/24" dev "ve-$id" && ip -n "$ns_i" addr add "$addr_i/24" dev "vi-$id" ||
  fail "addresses"
for ns in "$ns_e" "$ns_i"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
ip -n "$ns_e" link set "ve-$id" up && ip -n "$ns_i" link set "vi-$id" up || fail "links up"
echo "namespaces $ns_e ($addr_e) and $ns_i ($addr_i), joined by a veth pair"

# Each peer reads lines from a FIFO and answers on another; fds 5/6 for the
# exporter, 7/8 for the importer. UCX over TCP only, on the veth.
start_peer() {
  local name=$1 ns=$2 address=$3
  mkfifo "$dir/$name.in" "$dir/$name.out"
  ip netns exec "$ns" env UCX_TLS=tcp UCX_NET_DEVICES=all "$peer" --transports=tcp \
    --listen="$address" --import_timeout_ms="$import_timeout_ms" \
    <"$dir/$name.in" >"$dir/$name.out" 2>"$dir/$name.err" &
  pids+=($!)
}
start_peer exporter "$ns_e" "$addr_e"
exec 5>"$dir/exporter.in" 6<"$dir/exporter.out"
start_peer importer "$ns_i" "$addr_i"
exec 7>"$dir/importer.in" 8<"$dir/importer.out"
# ask FD_IN FD_OUT SECONDS LINE: sends LINE, sets `answer` to the reply.
ask() {
  echo "$4" >&"$1"
  read -r -t "$3" answer <&"$2" || fail "no answer to '${4:0:40}' within $3 s"
}
expect_line() {  # FD_OUT SECONDS: the next line, into `answer`
  read -r -t "$2" answer <&"$1" || fail "no line within $2 s"
}
# import_started COMMAND HEX...: sends the import (import, import_bundle); the
# importer says "started" and, later or even before (a small import ends
# inside the call), "imported ...". Returns once it started; `result` holds
# the outcome if it came first.
import_started() {
  result=""
  echo "$*" >&7
  for _ in 1 2; do
    expect_line 8 10
    case $answer in
      started) return ;;
      imported\ *) result=$answer ;;
      *) fail "import: $answer" ;;
    esac
  done
  fail "the import did not start"
}
# import_result SECONDS: the outcome, into `answer`.
import_result() {
  if [ -n "$result" ]; then
    answer=$result
  else
    expect_line 8 "$1"
  fi
}
expect_line 6 10
[ "$answer" = ready ] || fail "exporter: $answer"
expect_line 8 10
[ "$answer" = ready ] || fail "importer: $answer"

published=0
# import_checked DTYPE LAYOUT SHAPE SEED: published there, imported here, checked.
import_checked() {
  ask 5 6 20 "publish $1 $2 $3 1 60000 $4"
  [[ $answer == descriptor\ * ]] || fail "publish: $answer"
  published=$((published + 1))
  import_started import "${answer#descriptor }" "$1" "$2" "$3" "$4"
  import_result 60
  [ "$answer" = "imported ok verified" ] || fail "import of $2 $3: $answer"
  echo "  $2 $3: imported, byte for byte"
}
# bundle_checked DTYPE MEMBERS SEED: a bundle (MEMBERS as publish_bundle takes
# them) published there, imported here, every member checked.
bundle_checked() {
  ask 5 6 20 "publish_bundle $1 $2 1 60000 $3"
  [[ $answer == bundle\ * ]] || fail "publish_bundle: $answer"
  published=$((published + $(echo "$2" | tr ',' '\n' | wc -l)))
  import_started import_bundle "${answer#bundle }" "$1" "$2" "$3"
  import_result 60
  [ "$answer" = "imported ok verified" ] || fail "bundle import: $answer"
  echo "  a bundle of $2: imported, byte for byte"
}

echo "== 1. 2 ms of delay and 1 % loss each way"
netem=1
if ! why=$(ip netns exec "$ns_e" tc qdisc add dev "ve-$id" root netem delay 2ms loss 1% 2>&1); then
  # A kernel without sch_netem (a container's, often): the imports still
  # cross the namespaces, without the delay and the loss.
  echo "  (no delay or loss: tc netem fails here: $why)"
  netem=0
else
  ip netns exec "$ns_i" tc qdisc add dev "vi-$id" root netem delay 2ms loss 1% || fail "netem"
fi
import_checked 1:8:1 contiguous 4194304 7
import_checked 2:32:1 every_other_row 256x1024 11
bundle_checked 2:32:1 contiguous:64,transposed:16x32,contiguous:1024x1024,every_other_row:8x8 21

echo "== 2. the link cut in the middle of a bundle"
# Without the loss, so that a large import is well under way when the link
# goes; the delay stays.
# The exporter's side sends at 100 Mbit/s, so that a bundle of 64 MiB takes
# about 5 s.
if [ "$netem" = 1 ]; then
  ip netns exec "$ns_e" tc qdisc change dev "ve-$id" root netem delay 2ms rate 100mbit ||
    fail "netem"
  ip netns exec "$ns_i" tc qdisc change dev "vi-$id" root netem delay 2ms || fail "netem"
else
  ip netns exec "$ns_e" tc qdisc add dev "ve-$id" root tbf rate 100mbit burst 64kb latency 100ms ||
    fail "tbf"
fi
members=4
ask 5 6 30 "publish_bundle 1:8:1 contiguous:16777216,contiguous:16777216,contiguous:16777216,contiguous:16777216 1 $lease_ms 3"
[[ $answer == bundle\ * ]] || fail "publish_bundle: $answer"
bundle=${answer#bundle }
published=$((published + members))
ask 5 6 10 deleted
before=${answer#deleted }
import_started import_bundle "$bundle"
[ -z "$result" ] || fail "the import ended before the cut: $result"
sleep 0.5
cut=$(date +%s%N)
ip -n "$ns_i" link set "vi-$id" down || fail "cutting the link"
import_result $((import_timeout_ms / 1000 + 30))
took=$((($(date +%s%N) - cut) / 1000000))
echo "  the import ended $took ms after the cut: $answer"
[[ $answer =~ ^imported\ (14|4)\  ]] || fail "the cut import ended with: $answer"
[ "$took" -le $((import_timeout_ms + 5000)) ] || fail "the cut import took $took ms to end"
# The exporter's lease ends, and its producer goes.
for _ in $(seq 1 $(((lease_ms + 10000) / 100))); do
  ask 5 6 5 deleted
  [ "${answer#deleted }" -gt "$before" ] && break
  sleep 0.1
done
[ "${answer#deleted }" -eq $((before + members)) ] || fail "the exporter's producers: $answer"
ask 5 6 5 publications
[ "$answer" = "publications 0" ] || fail "the exporter still has $answer"
echo "  the exporter's lease ended, each of its $members producers deleted once"

echo "== 3. the link back"
ip -n "$ns_i" link set "vi-$id" up || fail "the link back"
import_checked 1:8:1 contiguous 4194304 9
bundle_checked 1:8:1 contiguous:4096,contiguous:1048576 31

echo "== 4. shutdown: every producer deleted once"
ask 7 8 20 quit
[[ $answer == bye\ * ]] || fail "importer: $answer"
ask 5 6 20 quit
[ "$answer" = "bye $published" ] || fail "exporter: $answer, after $published publications"
for pid in "${pids[@]}"; do wait "$pid" || fail "a peer exited with $?"; done
pids=()
echo "netns OK"
